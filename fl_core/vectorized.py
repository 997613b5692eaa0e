"""Clients trained together: one batched SGD pass for the K clients of a round (issue 54's foundation).

Why. A small model's training step is a few dozen kernels of a few microseconds each. Trained
client by client, as `LocalTrainer.train_pass` does, a round launches K times as many of them one
after the other; on a GPU each is over before the next is launched, so the device mostly waits on
Python and the launch queue, and on a CPU each small kernel pays its dispatch cost. Here the K
clients' states are stacked on a leading client axis and every batch index b runs *one* forward,
one backward and one optimizer step for all of them: `torch.func.functional_call` of the shared
model under `torch.func.grad` (per client) under `torch.func.vmap` (over clients), then the SGD
step on the stacked tensors with `torch._foreach_*`. A convolution under vmap becomes one grouped
convolution of K groups, a linear layer one batched matrix product. On a CPU the arithmetic is
the same either way and vmap adds layout copies, so there the batched pass gains only for the
tiniest model, if at all (`python -m benchmarks.vectorized_round`); the launches it saves are a
GPU's.

What it computes. `train_pass_together(model, states, xs, ys, updates, seeds, lr=..., batch_size=...,
momentum=..., weight_decay=...)` returns, for each client k, what
`LocalTrainer(model, SGDSettings(lr, batch_size, momentum, weight_decay)).train_pass(states[k],
xs[k], ys[k], updates[k], seeds[k])` returns (default cross-entropy loss, no corrections, momentum
buffers starting at zero): the new state, the loss sum and the sample count. The same rules:

- client k visits its samples in `batch_order(seeds[k], n_k)`, in batches of `batch_size`, its own
  order whatever the other clients hold;
- clients hold different numbers of samples. At batch index b a client's batch may be short (its
  last) or absent (it has fewer batches). Batches are padded to the longest real one at b; every
  sample carries a 0/1 weight and a client's loss is the sum of its real samples' losses over
  their count, i.e. the mean over its real batch, as the loop's `F.cross_entropy`. A client with
  no batch at b is *inactive*: its gradient, momentum buffer and parameters are multiplied by
  per-client 0/1 factors so that they stay bit-identical (it takes no step, its momentum does not
  decay);
- weight decay is added to the gradient before momentum (`WeightDecay`), v = m·v + g, the update's
  masks multiply the step after momentum, p -= lr·step; parameters not named in the update are not
  trained and come back bit-identical, as do entries whose mask is 0.

Exactness. The numbers are the loop's up to floating-point rounding: a grouped convolution and a
padded batch sum in another order than K separate convolutions of real batches. In float64 the
two agree to ~1e-16. In float32 a client usually agrees to |a - b| <= 1e-6 + 1e-5 |b| after an
epoch, but not always: where rounding puts a ReLU input on the other side of 0 in one computation
only, that sample's gradient changes by its whole size and momentum carries the changed step on
(measured up to ~1e-3 after an epoch of cnn2 with momentum 0.9). The loop differs from itself as
much when run on 2 threads instead of 1, or on channels-last inputs: the training dynamics, not
this code, amplify the rounding. Frozen tensors and masked-out entries are bit-identical to the
start, and two calls on the same inputs give the same bits. The result's tensors are fresh, one
storage per tensor (not views of the stacked tensors, which would keep all K clients' memory alive
and be saved whole).

What is refused (`vectorizable(model)` gives the reason, None when a model can be batched; a
caller runs the loop instead):
- BatchNorm: in training it normalises with the batch's own statistics and updates running
  statistics from them; padded batches would change both. Computing each client's statistics over
  its real samples only is possible but is not written here, and
  `torch.func.replace_all_batch_norm_modules_` (no running statistics) is another algorithm;
- any other buffer (a forward may change it in place, which the batched pass does not track);
- dropout with p > 0 (its random draws cannot follow the loop's random stream).

A momentum buffer carried across passes (`velocities`, as the loop's `velocity`) is supported; an
inactive client's buffer is left bit-identical, which is what the next pass continues from.

Not here (the caller keeps the loop for them): other losses (`loss_fn`), gradient corrections
(`ShiftGradient`, `Proximal`, `ClipGradNorm`), `batch_steps`, `inplace`, autocast (bf16).

`evaluate_together` scores K states at once (eval mode, so BatchNorm models with running
statistics are scored too), counting correct predictions as `LocalTrainer.evaluate` does.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap
from torch.nn import functional as F

from .training import State, UpdateSpec, batch_order


def _named_kinds(model: nn.Module, word: str) -> list[str]:
    """Names of the submodules whose class (or a base class) has `word` in its name."""
    return [name or "(the model)" for name, m in model.named_modules()
            if any(word in c.__name__ for c in type(m).__mro__)]


def vectorizable(model: nn.Module) -> str | None:
    """Why `model` cannot be trained by `train_pass_together` (a sentence naming the model and its
    modules), or None when it can."""
    kind = type(model).__name__
    bn = _named_kinds(model, "BatchNorm")
    if bn:
        return (f"{kind} has BatchNorm ({', '.join(bn)}): in training it normalises with each batch's statistics "
                f"and updates running statistics from them, and the batched pass pads short batches, so both "
                f"would differ from the client's own; such a model trains client by client")
    buffers = [name for name, _ in model.named_buffers()]
    if buffers:
        return (f"{kind} holds buffers ({', '.join(buffers)}) that a training forward may change in place, which "
                f"the batched pass does not track; such a model trains client by client")
    dropout = [name for name, m in model.named_modules()
               if any("Dropout" in c.__name__ for c in type(m).__mro__) and getattr(m, "p", 0) > 0]
    if dropout:
        return (f"{kind} has dropout ({', '.join(dropout)}): its random draws cannot follow the loop's random "
                f"stream; such a model trains client by client")
    return None


@dataclass(frozen=True)
class _Plan:
    """Which samples each client trains on at each batch index b, gathered from the clients' samples
    concatenated: `index[b]` (K, batch_size) rows of that concatenation (padding points at row 0),
    `keep[b]` the 0/1 weight of each (1: a real sample), `count[b]` each client's real samples at b,
    `active[b]` 1.0 where that count is positive, `width[b]` the longest real batch at b."""

    index: Tensor
    keep: Tensor
    count: Tensor
    active: Tensor
    width: list[int]


def _plan(sizes: Sequence[int], seeds: Sequence[int], batch_size: int, device: torch.device,
          dtype: torch.dtype = torch.float32) -> _Plan:
    batches = max(math.ceil(n / batch_size) for n in sizes)
    k_count, slots = len(sizes), batches * batch_size
    index = torch.zeros(k_count, slots, dtype=torch.long)
    keep = torch.zeros(k_count, slots, dtype=dtype)
    offset = 0
    for k, (n, seed) in enumerate(zip(sizes, seeds)):
        index[k, :n] = batch_order(seed, n) + offset
        keep[k, :n] = 1.0
        offset += n
    index = index.view(k_count, batches, batch_size).transpose(0, 1).contiguous()
    keep = keep.view(k_count, batches, batch_size).transpose(0, 1).contiguous()
    count = keep.sum(dim=2)
    width = [min(batch_size, max(sizes) - b * batch_size) for b in range(batches)]
    return _Plan(index.to(device), keep.to(device), count.to(device), (count > 0).to(device=device, dtype=dtype), width)


def _client_loss(model: nn.Module, trained: dict[str, Tensor], rest: dict[str, Tensor], x: Tensor, y: Tensor,
                 keep: Tensor, count: Tensor) -> tuple[Tensor, Tensor]:
    """One client's loss on its (padded) batch: the mean cross-entropy over its real samples (0
    when it has none); the value again as the auxiliary output."""
    logits = functional_call(model, (trained, rest), (x,))
    loss = (F.cross_entropy(logits, y, reduction="none") * keep).sum() / count.clamp(min=1.0)
    return loss, loss.detach()


def _check_lists(states: Sequence[State], xs: Sequence[Tensor], ys: Sequence[Tensor], updates: Sequence[UpdateSpec],
                 seeds: Sequence[int], velocities: Sequence[dict[str, Tensor]] | None) -> None:
    lengths = {"states": len(states), "xs": len(xs), "ys": len(ys), "updates": len(updates), "seeds": len(seeds)}
    if velocities is not None:
        lengths["velocities"] = len(velocities)
    if len(set(lengths.values())) != 1:
        listed = ", ".join(f"{k} {v}" for k, v in lengths.items())
        raise ValueError(f"train_pass_together: the per-client lists differ in length ({listed}); "
                         f"each needs one entry per client")
    if not states:
        raise ValueError("train_pass_together: no clients given (the lists are empty)")


def _check_clients(model: nn.Module, states: Sequence[State], xs: Sequence[Tensor], ys: Sequence[Tensor],
                   updates: Sequence[UpdateSpec]) -> list[str]:
    """The trained parameter names (in the model's order), after checking every client's inputs
    against client 0's and the model's; one ValueError naming what differs."""
    keys = list(model.state_dict())
    params = dict(model.named_parameters())
    first = set(updates[0])
    device, sample = xs[0].device, tuple(xs[0].shape[1:])
    for k, (state, x, y, update) in enumerate(zip(states, xs, ys, updates)):
        if set(state) != set(keys):
            raise ValueError(f"client {k}'s state does not match the model: missing {sorted(set(keys) - set(state))}, "
                             f"unexpected {sorted(set(state) - set(keys))}")
        if set(update) != first:
            raise ValueError(f"client {k}'s update names differ from client 0's: extra {sorted(set(update) - first)}, "
                             f"missing {sorted(first - set(update))}; a batched pass trains the same tensors for "
                             f"every client (masks may differ)")
        if x.shape[0] != y.shape[0] or tuple(x.shape[1:]) != sample or x.device != device or y.device != device:
            raise ValueError(f"client {k}'s data: x {tuple(x.shape)} on {x.device}, y {tuple(y.shape)} on {y.device}; "
                             f"expected as many labels as samples, samples of shape {sample} on {device} (client 0's)")
        for name, mask in update.items():
            if mask is not None and name in params and tuple(mask.shape) != tuple(params[name].shape):
                raise ValueError(f"client {k}'s mask for {name} has shape {tuple(mask.shape)}, the parameter "
                                 f"{tuple(params[name].shape)}")
    return [n for n in params if n in first]


def _stacked_masks(names: Sequence[str], updates: Sequence[UpdateSpec], trained: Mapping[str, Tensor]
                   ) -> dict[int, Tensor]:
    """Position in `names` -> the clients' masks stacked as 0/1 factors (K, *shape), for each
    tensor that some client masks (a client without a mask for it: all ones)."""
    out = {}
    for i, name in enumerate(names):
        masks = [u[name] for u in updates]
        if all(m is None for m in masks):
            continue
        p = trained[name]
        out[i] = torch.stack([torch.ones_like(p[0]) if m is None else m.to(device=p.device, dtype=p.dtype)
                              for m in masks])
    return out


def _write_back(velocities: Sequence[dict[str, Tensor]], names: Sequence[str], stacked: Sequence[Tensor]) -> None:
    """Each client's momentum buffers into its dict: copied into the tensors it held (which the
    loop would have updated in place), new tensors for names it did not hold."""
    for k, buffers in enumerate(velocities):
        for name, v in zip(names, stacked):
            if name in buffers:
                buffers[name].copy_(v[k])
            else:
                buffers[name] = v[k].clone()


def _per_client(factor: Tensor, ranks: Sequence[int]) -> list[Tensor]:
    """A (K,) factor as views that broadcast against each stacked tensor of rank 1 + r."""
    return [factor.view(-1, *([1] * r)) for r in ranks]


def _step(params: list[Tensor], grads: list[Tensor], velocity: list[Tensor] | None, masks: Mapping[int, Tensor],
          active: list[Tensor], decay: list[Tensor] | None, lr: float, weight_decay: float) -> None:
    """The loop's SGD step on the stacked tensors, for active clients only: weight decay into the
    gradient, momentum (inactive clients' buffers kept: their decay factor is 1 and their gradient
    0), masks on the step, p -= lr * active * step."""
    if weight_decay:
        torch._foreach_add_(grads, params, alpha=weight_decay)
    steps = grads
    if velocity is not None:
        torch._foreach_mul_(grads, active)
        torch._foreach_mul_(velocity, decay)
        torch._foreach_add_(velocity, grads)
        steps = list(velocity)
        if masks:  # the masked steps are new tensors: the buffers stay unmasked, as the loop's clones
            for i, masked in zip(masks, torch._foreach_mul([velocity[i] for i in masks], list(masks.values()))):
                steps[i] = masked
    elif masks:
        torch._foreach_mul_([steps[i] for i in masks], list(masks.values()))
    torch._foreach_addcmul_(params, active, steps, value=-lr)


def train_pass_together(model: nn.Module, states: Sequence[State], xs: Sequence[Tensor], ys: Sequence[Tensor],
                        updates: Sequence[UpdateSpec], seeds: Sequence[int], *, lr: float, batch_size: int,
                        momentum: float = 0.0, weight_decay: float = 0.0,
                        velocities: Sequence[dict[str, Tensor]] | None = None) -> tuple[list[State], Tensor, list[int]]:
    """One epoch of local SGD for K clients at once: (K new states, loss sums (K,) on the data's
    device, sample counts), client k's as `LocalTrainer.train_pass(states[k], xs[k], ys[k],
    updates[k], seeds[k])` with these settings (see the module's docstring for what is equal and
    what is refused). `model` is only the template of the computation (its own tensors are neither
    read nor changed); the given states are never modified.

    `velocities`, with momentum, are the clients' momentum buffers by parameter name, continued
    from and left updated as `train_pass`'s `velocity` (missing names start at zero), so that
    several passes make one optimizer's run (`momentum_scope="round"`)."""
    reason = vectorizable(model)
    if reason is not None:
        raise ValueError(f"train_pass_together: {reason}")
    if batch_size < 1:
        raise ValueError(f"train_pass_together: batch_size {batch_size!r}; expected at least 1")
    _check_lists(states, xs, ys, updates, seeds, velocities)
    names = _check_clients(model, states, xs, ys, updates)
    device = xs[0].device
    stacked = {n: torch.stack([s[n].to(device) for s in states]) for n in model.state_dict()}
    trained = {n: stacked[n] for n in names}
    rest = {n: t for n, t in stacked.items() if n not in trained}
    sizes = [int(x.shape[0]) for x in xs]
    loss_sums = torch.zeros(len(states), device=device)
    velocity = None
    if momentum:
        given = velocities or [{}] * len(states)
        velocity = [torch.stack([v[n].to(device) if n in v else torch.zeros_like(p[0]) for v in given])
                    for n, p in trained.items()]
    params_dtype = trained[names[0]].dtype if names else torch.float32
    if names and max(sizes) > 0:
        _train(model, trained, rest, torch.cat(list(xs)), torch.cat(list(ys)),
               _plan(sizes, seeds, batch_size, device, params_dtype), _stacked_masks(names, updates, trained),
               loss_sums, velocity, lr, momentum, weight_decay)
    if velocity is not None and velocities is not None:
        _write_back(velocities, list(trained), velocity)
    new = [{n: t[k].clone() for n, t in stacked.items()} for k in range(len(states))]
    return new, loss_sums, sizes


def _train(model: nn.Module, trained: dict[str, Tensor], rest: dict[str, Tensor], x: Tensor, y: Tensor, plan: _Plan,
           masks: Mapping[int, Tensor], loss_sums: Tensor, velocity: list[Tensor] | None, lr: float, momentum: float,
           weight_decay: float) -> None:
    """The batch loop on the stacked tensors (`trained` and `velocity` updated in place,
    `loss_sums` accumulated)."""
    params = list(trained.values())
    ranks = [p.dim() - 1 for p in params]
    # momentum's factor per client and batch: m where the client steps, 1 where it does not
    decay = torch.ones_like(plan.active).masked_fill_(plan.active > 0, momentum) if momentum else None
    gradient = vmap(grad(partial(_client_loss, model), has_aux=True))
    modes = [(m, m.training) for m in model.modules()]
    model.train()
    try:
        for b, width in enumerate(plan.width):
            idx, keep = plan.index[b, :, :width], plan.keep[b, :, :width]
            grads, losses = gradient(trained, rest, x[idx], y[idx], keep, plan.count[b])
            with torch.no_grad():
                loss_sums += losses * plan.count[b]
                _step(params, [grads[n] for n in trained], velocity, masks, _per_client(plan.active[b], ranks),
                      None if decay is None else _per_client(decay[b], ranks), lr, weight_decay)
            del grads
    finally:
        for m, training in modes:
            m.training = training


@torch.no_grad()
def evaluate_together(model: nn.Module, states: Sequence[State], xs: Sequence[Tensor], ys: Sequence[Tensor],
                      batch_size: int = 1024) -> list[int]:
    """Correctly classified samples of each client k (its state on its (xs[k], ys[k])), scored in
    eval mode with the K states stacked and vmapped, `batch_size` samples per client per chunk:
    the counts `LocalTrainer.evaluate` gives, up to predictions that rounding flips (its channels-
    last scoring copy rounds its logits otherwise). Eval mode uses BatchNorm's running statistics,
    so BatchNorm models are scored too; a model with dropout is scored without it, as by the loop."""
    if len(states) != len(xs) or len(xs) != len(ys):
        raise ValueError(f"evaluate_together: the per-client lists differ in length (states {len(states)}, "
                         f"xs {len(xs)}, ys {len(ys)}); each needs one entry per client")
    if not states:
        return []
    sizes = [int(x.shape[0]) for x in xs]
    if max(sizes) == 0:
        return [0] * len(states)
    device = xs[0].device
    stacked = {n: torch.stack([s[n].to(device) for s in states]) for n in model.state_dict()}
    plan = _plan(sizes, [0] * len(sizes), batch_size, device)  # any order: only the counts matter
    x, y = torch.cat(list(xs)), torch.cat(list(ys))
    predict = vmap(lambda state, xb: functional_call(model, state, (xb,)).argmax(dim=1))
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    correct = torch.zeros(len(states), device=device)
    try:
        for b, width in enumerate(plan.width):
            idx, keep = plan.index[b, :, :width], plan.keep[b, :, :width]
            correct += ((predict(stacked, x[idx]) == y[idx]).float() * keep).sum(dim=1)
    finally:
        for m, training in modes:
            m.training = training
    return [int(c) for c in correct.tolist()]
