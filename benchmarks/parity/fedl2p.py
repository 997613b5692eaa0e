"""Parity of our FedL2P (fl_core/fedl2p/: the method and its blocks) with the authors' code,
github.com/royson/fedl2p at commit fe1944e98f4c60c9dd9f4e1b36d94cd13afc57ee.

Their pipeline (Flower 0.17 on Ray 1.4.1, YAML configs, wandb, CIFAR/Office/DomainNet loaders)
cannot run here (Ray 1.4.1 has no build for Python 3.11), so the components run on identical
inputs: their functions, imported from a checkout (`--ref`), unmodified, adapted from outside only:
`flwr` and `ray` are stubbed in sys.modules (imported at the top of their modules; `meta_train`
and the functions compared never use them, `fl.common.Weights` is only an annotation); their
package `__init__`s are bypassed (each needed file is loaded alone, so their dataset and model
zoo modules are not imported); `ClassificationClient`, the base of a client class never
instantiated here, is a placeholder; learn2learn 0.1.7 (its wheel's Cython extension does not
build on Python 3.11) is loaded from its source tree (`--learn2learn`), only the pure-Python
`learn2learn.utils` and `learn2learn.algorithms.base_learner` their client imports.

Printed per component and seed: max |ours - theirs| / max |theirs| over the tensors compared.
 1. BN mixing: their KLDBatchNorm2d in train mode vs our source="batch", in eval mode with running
    statistics S vs our source="client" with S (outputs, d output / d beta).
 2. Meta-net inputs: `precompute_kld` (theirs lists layers last-first) vs `bn_kl_features`, and
    `precompute_feat_stats` (mode layerwise) vs `layer_input_stats`; ours by default and with the
    authors' estimators (unbiased=True, eps=1e-5).
 3. Meta-nets (BNNet, ClampLRNet vs ours): initial weights from one seed, forward and gradient.
 4. The IFT hypergradient: their `Hypergrad(0.1, 3).grad` vs `ift_hypergradient` (scale "paper",
    no clipping, implicit term) on the same graph (model, batches, lambda).
 5. One meta step: their `meta_train` (one outer iteration) vs our `meta_step`, from the same
    lambda, model and batches in the same order (our schedule fed through their loader):
    A. LeNet-BN, LRNet and eta~ only, beta fixed at 0 (pretrained statistics on both sides);
    B. BatchNorm on the input only, both meta-nets, full-batch steps, their running statistics set
       to our client statistics with momentum 0: our documented BN departure then vanishes;
    C. LeNet-BN, both meta-nets, each side's own BN statistics (the documented departure).
    B and C with our default look-ahead (the paper's Eq. 10) and with lookahead="first_order"
    (theirs). The update of lambda is compared (in float64 by default: in float32 the update,
    ~1e-6 on weights ~0.1, is mostly rounding), with the validation loss and the time ratio.

    python -m benchmarks.parity.fedl2p --ref /tmp/fedl2p --learn2learn /tmp/learn2learn-0.1.7        # tiny, 1 seed
    python -m benchmarks.parity.fedl2p --ref /tmp/fedl2p --learn2learn /tmp/learn2learn-0.1.7 \
        --setting fmnist --data-root ../shared/data --seeds 0 1 2                    # full: ~2 CPU min
"""
from __future__ import annotations

import argparse
import time
import types

import torch
from torch import Tensor, nn
from torch.func import functional_call
from torch.nn import functional as F


from benchmarks.parity.fedl2p_setup import (Fixture, fmnist_fixture, input_bn_fixture, kld_twin,
                                            load_reference, rel, set_running, tiny_fixture, worst)
from fl_core.fedl2p.bn_mixing import bn_layers, bn_mixing, client_bn_stats
from fl_core.fedl2p.hypergrad import ift_hypergradient
from fl_core.fedl2p.metanets import bn_kl_features, bnnet, layer_input_stats, lrnet, lrnet_input
from fl_core.fedl2p.personalize import (ClientInputs, MetaNets, MetaStepSettings,
                                        fine_tune, meta_step, split_state)

REFERENCE_COMMIT = "fe1944e98f4c60c9dd9f4e1b36d94cd13afc57ee"


def batches(x: Tensor, y: Tensor, size: int) -> list[tuple[Tensor, Tensor]]:
    return [(x[i:i + size], y[i:i + size]) for i in range(0, x.shape[0], size)]


# ------------------------------------------------------------------ the components, either side
# Each takes `ref` (their modules: their side) or None (our side) and returns tensors.
def mixing(fix: Fixture, source: str, ref=None) -> tuple[Tensor, Tensor]:
    """Logits on x_val under the beta-mix (seeded beta), and d(logits . w)/d beta."""
    betas = (0.2 + 0.6 * torch.rand(len(bn_layers(fix.model)), generator=torch.Generator().manual_seed(fix.seed)))
    betas.requires_grad_(True)
    stats = client_bn_stats(fix.model, fix.x_train)
    if ref is None:
        with bn_mixing(fix.model, betas, stats if source == "client" else None, source):
            out = fix.model(fix.x_val)
    else:
        twin = kld_twin(ref, fix.model)
        if source == "client":
            set_running(ref, twin, stats)
        twin.train(source == "batch")
        ref.mu.set_kld_beta(twin, betas)
        out = twin(fix.x_val)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(7))
    return out.detach(), torch.autograd.grad((out * w).sum(), betas)[0]


def features(fix: Fixture, ref=None, estimators: str = "reference") -> tuple[Tensor, Tensor]:
    """(BNNet's input [B], LRNet's input [2M]); ours with the authors' estimators or ours ("ours")."""
    if ref is None:
        unbiased = estimators == "reference"
        means, sds = layer_input_stats(fix.model, fix.x_train, unbiased=unbiased, eps=1e-5 if unbiased else 0.0)
        return bn_kl_features(fix.model, fix.x_train, unbiased=unbiased), lrnet_input(means, sds)
    twin, loader = kld_twin(ref, fix.model), batches(fix.x_train, fix.y_train, fix.batch_size)
    kl = ref.mu.precompute_kld(twin, loader, None, "cpu").reshape(-1).flip(0)  # theirs: last layer first
    stats = ref.mu.precompute_feat_stats(twin, learnable(ref), loader, None, "cpu", "layerwise").reshape(-1)
    return kl, stats


def learnable(ref) -> tuple:
    return nn.Conv2d, nn.BatchNorm1d, nn.BatchNorm2d, ref.mu.KLDBatchNorm1d, ref.mu.KLDBatchNorm2d, nn.Linear


def metanet_forwards(fix: Fixture, ref=None, scale: float = 1.0) -> list[Tensor]:
    """BNNet and LRNet, each built from its seed as the side's code does (theirs: BNNet and
    ClampLRNet with cifar_fedl2p.yaml's init), on the (authors') inputs times `scale`: initial
    weights, outputs, and d(output . w)/d weights."""
    kl, stats = features(fix)
    num_bn, layers = kl.numel(), stats.numel() // 2
    tensors = len(list(fix.model.parameters()))
    out = []
    for seed, x, build in ((fix.seed, kl, "bn"), (fix.seed + 1, stats, "lr")):
        torch.manual_seed(seed)
        if ref is None:
            net = bnnet(num_bn) if build == "bn" else lrnet(layers, tensors, fix.lr)
            params = list(net.net.parameters())
        else:
            net = (ref.wn.BNNet(input_size=num_bn, output_size=num_bn) if build == "bn"
                   else ref.wn.ClampLRNet(input_size=2 * layers, output_size=tensors, max_limit=1000.0))
            net.apply(lambda m: ref.wn.weights_init(m, 0.1, 0.5 if build == "bn" else 1.0))
            params = list(net.parameters())
        y = net((scale * x).reshape(1, -1)).reshape(-1)
        w = torch.randn(y.shape, generator=torch.Generator().manual_seed(11))
        out += [p.detach().clone() for p in params] + [y.detach()]
        out += list(torch.autograd.grad((y * w).sum(), params))
    return out


def reference_inputs(fix: Fixture) -> ClientInputs:
    """Our ClientInputs with the authors' estimators (unbiased variances, eps in the SD)."""
    kl, stats = features(fix)
    return ClientInputs(client_bn_stats(fix.model, fix.x_train), kl, stats)


def new_metanets(fix: Fixture, use_bnnet: bool = True) -> MetaNets:
    torch.manual_seed(fix.seed + 5)
    return MetaNets(fix.model, fix.lr, use_bnnet=use_bnnet, fixed_beta=0.0)


def meta_tensors(nets: MetaNets) -> list[Tensor]:
    """BNNet's weights, LRNet's weights, eta~: their order (named_parameters puts eta~ first)."""
    bn = list(nets.bnnet.parameters()) if nets.bnnet is not None else []
    return bn + list(nets.lrnet.net.parameters()) + [nets.lrnet.post_multiplier]


def hypergradient(fix: Fixture, ref=None) -> list[Tensor]:
    """The IFT term -p . d(grad L_T)/d lambda (Q = 3, psi = 0.1, paper scale, no clip) for every
    meta tensor, on the graph of meta_step's steps 1-3 (e epochs, then a tracked look-ahead step)."""
    nets, inputs = new_metanets(fix), reference_inputs(fix)
    policy, bs = nets.policy(inputs), fix.batch_size
    tuned = fine_tune(fix.model, fix.model.state_dict(), fix.x_train, fix.y_train, policy, inputs.bn_stats,
                      epochs=fix.epochs, batch_size=bs, seed=fix.seed)
    params, buffers = split_state(fix.model, tuned)
    leaves = {n: p.detach().requires_grad_(True) for n, p in params.items()}
    with bn_mixing(fix.model, policy.betas, inputs.bn_stats):
        def loss(p, x, y):
            return F.cross_entropy(functional_call(fix.model, (p, buffers), (x,)), y)
        grads = torch.autograd.grad(loss(leaves, fix.x_train[:bs], fix.y_train[:bs]), list(leaves.values()))
        looked = {n: leaves[n] - policy.lrs[n] * g for n, g in zip(leaves, grads)}
        train, val = loss(looked, fix.x_train[bs:2 * bs], fix.y_train[bs:2 * bs]), loss(looked, fix.x_val, fix.y_val)
    meta = meta_tensors(nets)
    if ref is None:
        return ift_hypergradient(train, val, looked, meta, steps=3, psi=0.1, scale="paper", clip=None,
                                 direct=[False] * len(meta))
    return ref.cu.Hypergrad(learning_rate=0.1, truncate_iter=3).grad(val, train, meta, list(looked.values()))


# ------------------------------------------------------------------ one meta step
class ScriptedLoader:
    """A 'DataLoader' for their meta_train: the first `stats_passes` iterations are the client's
    training set in chunks (their precompute_* passes), later ones the given batch schedule."""

    def __init__(self, x: Tensor, y: Tensor, chunk: int, schedule: list, stats_passes: int):
        self.dataset, self.stats, self.schedule, self.left = x, batches(x, y, chunk), schedule, stats_passes

    def __iter__(self):
        if self.left > 0:
            self.left -= 1
            return iter(self.stats)
        return iter(self.schedule)


def our_schedule(fix: Fixture, seed: int) -> list:
    """Our meta_step's batches in order: e epochs (functional_sgd's order), the look-ahead batch,
    then L_T's batch (the next one, or the look-ahead batch again when there is none)."""
    n, bs = fix.x_train.shape[0], fix.batch_size
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    step = torch.randperm(n, generator=torch.Generator().manual_seed(seed + 1))
    fresh = step[bs:2 * bs] if n > bs else step[:bs]
    epoch = [order[i:i + bs] for i in range(0, n, bs)]
    return [(fix.x_train[i], fix.y_train[i]) for i in epoch * fix.epochs + [step[:bs], fresh]]


def meta_step_of(fix: Fixture, setting: str, meta_grad: str, lookahead: str = "exact", ref=None):
    """One meta step from the same lambda (setting A, B or C of the docstring; B's fixture is
    `input_bn_fixture(fix)`): (the update of lambda per tensor, the validation loss, seconds)."""
    both, seed = setting != "A", fix.seed + 17
    nets = new_metanets(fix, use_bnnet=both)
    before, inputs = [p.detach().clone() for p in meta_tensors(nets)], reference_inputs(fix)
    start = time.perf_counter()
    if ref is None:
        settings = MetaStepSettings(fix.epochs, fix.batch_size, meta_grad=meta_grad, lookahead=lookahead)
        val_loss = meta_step(fix.model, nets, fix.model.state_dict(), inputs, fix.x_train, fix.y_train, fix.x_val,
                             fix.y_val, settings, seed)["val_loss"]
        after = meta_tensors(nets)
    else:  # their nets hold our initial values; their eval-mode statistics are ours in setting B
        bn = ref.wn.BNNet(input_size=nets.bnnet.in_features, output_size=nets.bnnet.out_features) if both else None
        lr = ref.wn.ClampLRNet(input_size=nets.lrnet.in_features, output_size=nets.lrnet.out_features, max_limit=1e3)
        for theirs, ours in ((bn, nets.bnnet), (lr, nets.lrnet)):
            if ours is not None:
                theirs.load_state_dict(dict(zip(theirs.state_dict(), ours.net.state_dict().values())))
        rates = nn.ParameterList([nn.Parameter(v.detach().clone().reshape(1)) for v in nets.lrnet.post_multiplier])
        twin = kld_twin(ref, fix.model, momentum=0.0 if setting == "B" else 0.1)
        if setting == "B":
            set_running(ref, twin, inputs.bn_stats)
        meta_nets = {"bn_net": bn, "lr_net": lr} if both else {"lr_net": lr}
        optimizers = {name: torch.optim.SGD(net.parameters(), lr=1e-3) for name, net in meta_nets.items()}
        optimizers["learnable_lrs"] = torch.optim.SGD(list(rates), lr=1e-4, momentum=0.0)
        schedule = our_schedule(fix, seed)
        val_loss = ref.client.meta_train(
            model=ref.client.MAMLwLRs(twin, rates, first_order=True), meta_nets=meta_nets,
            meta_nets_config={"lr_net": types.SimpleNamespace(mode="layerwise")}, rnd_train_meta_nets=list(meta_nets),
            train_dataloader=ScriptedLoader(fix.x_train, fix.y_train, fix.batch_size, schedule, 1 + both),
            val_dataloader=[(fix.x_val, fix.y_val)], augment_validation=False,
            data_class=types.SimpleNamespace(jit_augment=lambda x: x, jit_normalize=lambda x: x),
            optimizers=optimizers, outer_loop_batches=1, inner_loop_batches=len(schedule) - 1, device="cpu",
            clamp_outer_gradients=1.0, round=1, meta_algorithm=meta_grad.upper(), lr_net_name="lr_net",
            hypergrad=ref.cu.Hypergrad(learning_rate=0.1, truncate_iter=3), inner_loop_lrs=rates,
            learnable_modules=learnable(ref), fixed_beta=None if both else 0)["fed_query_loss"]
        after = [*(bn.parameters() if both else []), *lr.parameters(), torch.cat(list(rates))]
    seconds = time.perf_counter() - start
    return [a.detach() - b for a, b in zip(after, before)], float(val_loss), seconds


# ------------------------------------------------------------------ driver
STEPS = [(s, g, la) for s in "ABC" for g in ("ift", "fomaml") for la in ("exact", "first_order")
         if s != "A" or la == "exact"]


def fixture_for(fix: Fixture, setting: str) -> Fixture:
    return input_bn_fixture(fix) if setting == "B" else fix


def compare(ref, fix: Fixture) -> dict[str, float]:
    """Every component's max relative difference on one fixture (see the module docstring)."""
    out: dict[str, float] = {}
    for source in ("batch", "client"):
        (oo, og), (to, tg) = mixing(fix, source), mixing(fix, source, ref)
        out[f"BN mixing, {source} statistics: output"], out[f"BN mixing, {source} statistics: d/d beta"] = \
            rel(oo, to), rel(og, tg)
    theirs = features(fix, ref)
    for estimators in ("ours", "reference"):
        ours = features(fix, estimators=estimators)
        out[f"KL per BN layer, {estimators} estimators"] = rel(ours[0], theirs[0])
        out[f"layer input mean/SD, {estimators} estimators"] = rel(ours[1], theirs[1])
    for scale in (1.0, 300.0):  # x300 drives outputs past the clamp (straight-through gradient)
        out[f"meta-nets: init, output, gradient (inputs x{scale:g})"] = worst(zip(
            metanet_forwards(fix, scale=scale), metanet_forwards(fix, ref, scale)))
    out["IFT hypergradient (implicit term)"] = worst(zip(hypergradient(fix), hypergradient(fix, ref)))
    theirs_of = {}
    for setting, meta_grad, lookahead in STEPS:
        f = fixture_for(fix, setting)
        if (setting, meta_grad) not in theirs_of:
            theirs_of[setting, meta_grad] = meta_step_of(f, setting, meta_grad, ref=ref)
        ours, theirs = meta_step_of(f, setting, meta_grad, lookahead), theirs_of[setting, meta_grad]
        tag = f"meta step {setting}, {meta_grad.upper()}, our look-ahead {lookahead}"
        out[f"{tag}: update of lambda"] = worst(zip(ours[0], theirs[0]))
        out[f"{tag}: validation loss"] = abs(ours[1] - theirs[1]) / abs(theirs[1])
        out[f"{tag}: seconds ours / theirs"] = ours[2] / theirs[2]
    return out


def pins(fix: Fixture, ref=None) -> dict[str, list[float]]:
    """The numbers tests/test_parity_fedl2p.py pins (theirs with `ref`, else ours): per tensor
    its sum and its sum of squares, so that a change anywhere in a tensor shows."""
    def summary(tensors):
        return [v for t in tensors for v in (float(t.sum()), float((t * t).sum()))]
    out = {f"mixing {s}": summary(mixing(fix, s, ref)) for s in ("batch", "client")}
    out |= {"features": summary(features(fix, ref)), "metanets": summary(metanet_forwards(fix, ref, 300.0)),
            "hypergradient": summary(hypergradient(fix, ref))}
    for setting, meta_grad in (("A", "ift"), ("A", "fomaml"), ("B", "ift"), ("B", "fomaml")):
        step = meta_step_of(fixture_for(fix, setting), setting, meta_grad, "first_order", ref)
        out[f"meta step {setting} {meta_grad}"] = summary(step[0]) + [step[1]]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ref", required=True, help="a checkout of github.com/royson/fedl2p")
    parser.add_argument("--learn2learn", help="learn2learn's source tree, if it is not importable")
    parser.add_argument("--setting", choices=("tiny", "fmnist"), default="tiny")
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--client", type=int, default=0)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--float32", action="store_true", help="run in float32 (default: float64, see the docstring)")
    parser.add_argument("--pins", action="store_true", help="print the reference's numbers for the test (tiny, seed 0)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32 if args.float32 else torch.float64)  # their buffers follow it too
    ref = load_reference(args.ref, args.learn2learn)
    if args.pins:
        for name, values in pins(tiny_fixture(0), ref).items():
            print(f"    {name!r}: {values!r},")
        return
    rows: dict[str, list[float]] = {}
    for seed in args.seeds:
        fix = tiny_fixture(seed) if args.setting == "tiny" else fmnist_fixture(args.data_root, seed, args.client)
        for name, value in compare(ref, fix).items():
            rows.setdefault(name, []).append(value)
    print(f"FedL2P parity against royson/fedl2p@{REFERENCE_COMMIT[:12]}, setting {args.setting}, seeds {args.seeds}, "
          f"{torch.get_default_dtype()}")
    print("max |ours - theirs| / max |theirs| per seed ('seconds' rows: our time / theirs, same process)")
    width = max(map(len, rows))
    for name, values in rows.items():
        print(f"  {name:<{width}}  " + "  ".join(f"{v:9.2f}" if "seconds" in name else f"{v:9.2e}" for v in values))


if __name__ == "__main__":
    main()
