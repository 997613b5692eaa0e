"""Does FedL2P's Neumann series converge here? The largest Hessian eigenvalue of the training loss at
the fine-tuned weights, and what `--steps` meta steps do to a client's validation loss under each
meta-gradient.

The series H⁻¹v ≈ ψ Σ_j (I − ψH)^j v converges only when ψ·λ_max(H) < 2 (and sums positive terms
when < 1). With the paper's ψ = 0.1 that needs λ_max < 20. This script pretrains the FedL2P
study's model (FedAvg, 15 rounds, LeNet-BN on `--dataset` mnist_c or fmnist_c under four
corruptions, Dir(0.1), seed 0), then for its seen clients estimates λ_max by power iteration
(Hessian-vector products on one training batch at the weights after e = 5 epochs of fine-tuning
under the initial policy) and runs `--steps` meta steps from the initial λ with IFT (ψ = 0.1 and
0.01; LRNet with and without the direct term; ψ = 1/λ_max, the curvature-aware step at which the
series converges with positive terms) and with FOMAML+, printing the objective FedL2P minimises
(the validation loss after fine-tuning under the policy) before and after, and the ratio after /
before (below 1: the meta-gradient helped), with each variant's CPU seconds.

    python -m benchmarks.fedl2p_neumann --data-root ../shared/data      # 10 clients, 10 steps: ~2 min
    python -m benchmarks.fedl2p_neumann --data-root ../shared/data --dataset fmnist_c       # ~3 CPU min
    python -m benchmarks.fedl2p_neumann --dataset fmnist_c --variants fomaml --meta-lr-scale 10
"""
from __future__ import annotations

import argparse
import copy
import tempfile
import time
from dataclasses import replace

import torch
from torch.func import functional_call
from torch.nn import functional as F


from fl_core.checkpoints import save_model
from fl_core.config import RunConfig
from fl_core.fedl2p.bn_mixing import bn_mixing
from fl_core.fedl2p.personalize import fine_tune, meta_step, split_state
from fl_core.functional import hvp
from fl_core.simulation import Simulation


# key -> (name, the meta-step settings it changes); {}: IFT at psi = 1 / lambda_max of the client
VARIANTS = {"ift": ("IFT, psi 0.1 (paper)", dict(neumann_psi=0.1)),
            "ift-psi0.01": ("IFT, psi 0.01", dict(neumann_psi=0.01)),
            "ift-direct": ("IFT, psi 0.1, direct term for LRNet too", dict(ift_direct="all")),
            "ift-curvature": ("IFT, psi 1/lambda_max", {}), "fomaml": ("FOMAML+", dict(meta_grad="fomaml"))}


def validation_loss(sim: Simulation, nets, k: int, seed: int) -> float:
    """Client k's validation loss after e epochs of fine-tuning under the policy of `nets`."""
    algo, model, client, data = sim.algorithm, sim.trainer.model, sim.clients[k], sim.data.clients[k]
    inputs = algo.client_inputs(k, client, data)
    with torch.no_grad():
        policy = nets.policy(inputs).detached()
    tuned = fine_tune(model, client.state, data.x_train, data.y_train, policy, inputs.bn_stats,
                      epochs=algo.params.ft_epochs, batch_size=sim.config.batch_size, seed=seed)
    params, buffers = split_state(model, tuned)
    with torch.no_grad(), bn_mixing(model, policy.betas, inputs.bn_stats):
        return float(F.cross_entropy(functional_call(model, (params, buffers), (data.x_val,)), data.y_val))


def top_eigenvalue(sim: Simulation, k: int, seed: int, iterations: int = 30) -> float:
    """λ_max of the training-batch loss's Hessian at the fine-tuned weights (power iteration)."""
    algo, model, client, data = sim.algorithm, sim.trainer.model, sim.clients[k], sim.data.clients[k]
    inputs = algo.client_inputs(k, client, data)
    with torch.no_grad():
        policy = algo.nets.policy(inputs).detached()
    tuned = fine_tune(model, client.state, data.x_train, data.y_train, policy, inputs.bn_stats,
                      epochs=algo.params.ft_epochs, batch_size=sim.config.batch_size, seed=seed)
    params, buffers = split_state(model, tuned)
    leaves = {n: p.detach().requires_grad_(True) for n, p in params.items()}
    batch = slice(0, sim.config.batch_size)
    with bn_mixing(model, policy.betas, inputs.bn_stats):
        loss = F.cross_entropy(functional_call(model, (leaves, buffers), (data.x_train[batch],)), data.y_train[batch])
    generator = torch.Generator().manual_seed(seed)
    vector = {n: torch.randn(p.shape, generator=generator) for n, p in leaves.items()}
    value = 0.0
    for _ in range(iterations):
        norm = torch.sqrt(sum((t * t).sum() for t in vector.values()))
        vector = {n: t / norm for n, t in vector.items()}
        product = hvp(loss, leaves, vector)
        value = float(sum((product[n] * vector[n]).sum() for n in vector))
        vector = product
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-root", default="../shared/data")
    parser.add_argument("--dataset", choices=("mnist_c", "fmnist_c"), default="mnist_c",
                        help="MNIST or Fashion-MNIST under the four default corruptions (default: mnist_c)")
    parser.add_argument("--pretraining-rounds", type=int, default=15, help="FedAvg rounds (default: 15, the study's)")
    parser.add_argument("--clients", type=int, default=10, help="seen clients measured (default: 10, all)")
    parser.add_argument("--steps", type=int, default=10, help="meta steps per variant (default: 10)")
    parser.add_argument("--variants", nargs="+", choices=tuple(VARIANTS), default=list(VARIANTS),
                        help="meta-gradients compared (default: all): "
                             + "; ".join(f"{k} = {name}" for k, (name, _) in VARIANTS.items()))
    parser.add_argument("--meta-lr-scale", type=float, default=1.0,
                        help="multiply the paper's meta learning rates (1e-3, 1e-3, 1e-4) by this (default: 1)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    folder = tempfile.mkdtemp()
    data = dict(dataset=args.dataset, data_root=args.data_root, partition="domain_dirichlet", dir_alpha=0.1,
                num_clients=12, unseen_clients=2, samples_per_client=150, test_samples_per_client=200,
                val_fraction=0.2, model="lenet_bn", seed=0, batch_size=32, checkpoint_dir=folder)
    pre = RunConfig(algorithm="fedavg", rounds=args.pretraining_rounds, eval_every=args.pretraining_rounds, lr=0.05,
                    momentum=0.9, **data)
    sim = Simulation(pre)
    list(sim.run())
    save_model(pre, sim.model_name, sim.final_model())
    scale = args.meta_lr_scale
    rates = dict(meta_lr_bn=1e-3 * scale, meta_lr_lr=1e-3 * scale, meta_lr_post=1e-4 * scale)
    learner = Simulation(RunConfig(algorithm="fedl2p", pretrained=pre.config_hash(), lr=0.01, ft_epochs=5,
                                   meta_grad="ift", **rates, **data))
    algo = learner.algorithm
    algo.nets.load_state_dict(algo.meta_state)
    variants = {VARIANTS[v][0]: VARIANTS[v][1] for v in args.variants}
    seen = [k for k, info in enumerate(algo.clients_info) if info.seen][:args.clients]
    print(f"{'client':>6} {'lambda_max':>10} {'psi*lmax (0.1)':>14} {'psi*lmax (0.01)':>15}  "
          + "  ".join(f"{name:>24}" for name in variants) + "   (L_V before -> after, ratio)")
    ratios = {name: [] for name in variants}
    cpu = {name: 0.0 for name in variants}
    for k in seen:
        top = top_eigenvalue(learner, k, seed=7)
        before = validation_loss(learner, algo.nets, k, seed=7)
        cells = []
        for name, change in variants.items():
            nets = copy.deepcopy(algo.nets)
            change = change or dict(neumann_psi=1.0 / max(top, 1e-3))  # curvature-aware: psi * lambda_max = 1
            settings = replace(algo.settings(), **change)
            start = time.process_time()
            client, d = learner.clients[k], learner.data.clients[k]
            inputs = algo.client_inputs(k, client, d)
            for step in range(args.steps):
                meta_step(learner.trainer.model, nets, client.state, inputs, d.x_train, d.y_train, d.x_val, d.y_val,
                          settings, seed=100 + step)
            cpu[name] += time.process_time() - start
            after = validation_loss(learner, nets, k, seed=7)
            ratios[name].append(after / before)
            cells.append(f"{before:.3f} -> {after:.3f} ({after / before:.2f})")
        print(f"{k:>6} {top:>10.1f} {0.1 * top:>14.2f} {0.01 * top:>15.2f}  " + "  ".join(f"{c:>24}" for c in cells))
    print("mean ratio after / before: " + ", ".join(f"{n} {sum(r) / len(r):.3f}" for n, r in ratios.items()))
    print("clients helped (ratio < 1): "
          + ", ".join(f"{n} {sum(x < 1 for x in r)}/{len(r)}" for n, r in ratios.items()))
    print("CPU seconds per client: " + ", ".join(f"{n} {t / len(seen):.1f}" for n, t in cpu.items()))


if __name__ == "__main__":
    main()
