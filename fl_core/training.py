"""Local SGD over a subset of entries, gradients and evaluation; shared by every algorithm.

One model object runs every client. Instead of copying a client's state into the model and
reading it back (two copies of the whole state per pass), the model's parameters and buffers are
*pointed at* the client's tensors for the duration of a call (`Tensor.data` for parameters, the
module's buffer slot for buffers) and pointed back at the model's own tensors afterwards:
  - `train_pass` makes one copy (the new state, which it returns) and trains it in place;
  - `evaluate` and `gradients` read the given state without copying its parameters.
So between calls the model holds its own (stale) tensors and never aliases a client's state;
code that runs the model itself loads a state first (`load_state`).

Per-client data are tensors already on the device; a pass slices them with a seeded
permutation, so there is no DataLoader and no host sync inside the training step.

A round allocates and frees many model-sized tensors (new states, masks as floats, deltas,
gradients). glibc's default malloc serves tensors above a moving threshold with fresh `mmap`s and
returns freed heap tops to the OS, so each of them is page-faulted in again (measured here: a
model-sized clone cost 4x the CPU time of a copy into reused memory). `tune_malloc`, called once
when a `LocalTrainer` is built, makes glibc keep and reuse that memory instead. The peak resident
size stays about the same (10 ResNet-18 clients, 5 rounds: 2.51 GB against 2.48 GB untuned;
either way glibc's heap holds ~0.8 GB of free fragments). FL_CORE_MALLOC_TUNING=0 opts out. A
sweep's trial workers preload an allocator that reuses those fragments (sweeps/allocator.py).
"""
from __future__ import annotations

import ctypes
import os
import platform
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from copy import deepcopy
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

State = dict[str, Tensor]
# What one pass may change: name -> None (the whole tensor) or a bool tensor (those entries; a
# float 0/1 tensor works the same). Parameters not named are frozen for the pass.
UpdateSpec = Mapping[str, Tensor | None]
# A training loss other than cross-entropy: (model, x, y) -> scalar loss (e.g. FedPAC's alignment).
LossFn = Callable[[nn.Module, Tensor, Tensor], Tensor]
# What `evaluate` scores: a state (run on the shared model) or any predictor x -> logits.
Evaluated = Mapping[str, Tensor] | Callable[[Tensor], Tensor]


def cross_entropy(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    return F.cross_entropy(model(x), y)


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed from (run seed, round, client, purpose, ...): batch orders never share a stream."""
    words = [p if isinstance(p, int) else zlib.crc32(p.encode()) for p in parts]
    return int(np.random.SeedSequence(words).generate_state(2, dtype=np.uint64)[0] >> np.uint64(1))


def precision_scope(precision: str, device: torch.device | str) -> AbstractContextManager:
    """What a round runs under for the `precision` knob: bf16 = torch.autocast to bfloat16 on the
    device's type (convolutions and matrix products in bfloat16, parameters and their updates in
    float32); fp32 = nothing changes. Autocast's cache of cast weights is off: it would keep a
    parameter's first bfloat16 copy for the whole round, while the trainer updates the parameters
    in place after every batch (and points them at other clients' tensors)."""
    if precision == "fp32":
        return nullcontext()
    if precision == "bf16":
        return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16, cache_enabled=False)
    raise ValueError(f"precision {precision!r}: expected fp32 or bf16")


def batch_order(seed: int, n: int, device: torch.device | str = "cpu") -> Tensor:
    """The order in which a pass seeded with `seed` visits n samples: the one rule every pass
    uses (`LocalTrainer.train_pass`, `functional.functional_sgd`), so that code outside the trainer
    (Per-FedAvg's batches, the parity scripts' replayed loaders) can reproduce its batches."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed)).to(device)


@dataclass(frozen=True)
class SGDSettings:
    lr: float
    batch_size: int
    momentum: float = 0.0
    weight_decay: float = 0.0


# ---------------------------------------------------------------- gradient corrections
# What a method changes in the plain SGD step, as a short list of transforms applied in a fixed
# order to each batch's gradients of the trained tensors (in place, under no_grad), before momentum
# and the update's masks: clipping, then additive corrections of the gradient, then weight decay,
# then the terms of the method's objective. `LocalTrainer.train_pass` adds weight decay itself.
Step = Callable[[list[Tensor], list[Tensor]], None]  # (gradients, trained tensors) -> None


@dataclass(frozen=True)
class ClipGradNorm:
    """Scale the loss gradient down to total L2 norm `max_norm` when it is larger, as
    `torch.nn.utils.clip_grad_norm_` before `optimizer.step()` (DisPFL's authors clip at 10)."""

    max_norm: float
    order = 0

    def step(self, names: Sequence[str]) -> Step:
        def clip(grads: list[Tensor], trained: list[Tensor]) -> None:
            norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
            torch._foreach_mul_(grads, torch.clamp(self.max_norm / (norm + 1e-6), max=1.0))
        return clip


@dataclass(frozen=True)
class ShiftGradient:
    """Add a fixed tensor per trained parameter (by name) to the gradient at every step: a
    correction of the gradient, not part of it (SCAFFOLD's c - c_k), so after clipping and before
    weight decay, the objective's terms and momentum act on the corrected gradient."""

    shift: Mapping[str, Tensor]
    order = 1

    def step(self, names: Sequence[str]) -> Step:
        shift = [self.shift[n] for n in names]
        return lambda grads, trained: torch._foreach_add_(grads, shift)


@dataclass(frozen=True)
class WeightDecay:
    """L2 weight decay, as SGD's `weight_decay` (added by `train_pass` from its settings)."""

    decay: float
    order = 2

    def step(self, names: Sequence[str]) -> Step:
        return lambda grads, trained: torch._foreach_add_(grads, trained, alpha=self.decay)


@dataclass(frozen=True)
class Proximal:
    """The gradient of lam/2 * ||w - reference||^2 over the trained tensors (Ditto's personal
    objective, FedProx's proximal term)."""

    lam: float
    reference: Mapping[str, Tensor]
    order = 3

    def step(self, names: Sequence[str]) -> Step:
        anchor = [self.reference[n] for n in names]
        return lambda grads, trained: torch._foreach_add_(grads, torch._foreach_sub(trained, anchor), alpha=self.lam)


Correction = ClipGradNorm | ShiftGradient | WeightDecay | Proximal
# A second model's update on the pass's batches (APFL's v, pFedMe's θ̃): called with the model as
# the pass holds it (its parameters before this batch's step) and the batch, before the pass's
# own forward; it keeps its model itself.
BatchStep = Callable[[nn.Module, Tensor, Tensor], None]


def clipped(max_norm: float | None) -> list[Correction]:
    """The corrections of a knob that clips when set: `ClipGradNorm(max_norm)`, none for None."""
    return [] if max_norm is None else [ClipGradNorm(max_norm)]


def load_state(model: nn.Module, state: Mapping[str, Tensor]) -> None:
    model.load_state_dict(state, strict=True)


def read_state(model: nn.Module) -> State:
    return {name: t.detach().clone() for name, t in model.state_dict().items()}


_MALLOC_TUNED: bool | None = None


def tune_malloc() -> bool:
    """glibc only, once per process: serve allocations up to 32 MiB (glibc's cap) from the heap
    and never trim it, so that freed tensors' pages are reused rather than returned and faulted in
    again. Returns whether the settings are in effect."""
    global _MALLOC_TUNED
    if _MALLOC_TUNED is None:
        _MALLOC_TUNED = False
        if os.environ.get("FL_CORE_MALLOC_TUNING", "1") != "0" and platform.system() == "Linux" \
                and platform.libc_ver()[0] == "glibc":
            try:
                mallopt = ctypes.CDLL("libc.so.6").mallopt
                mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
                m_trim_threshold, m_mmap_threshold = -1, -3
                _MALLOC_TUNED = bool(mallopt(m_mmap_threshold, 32 << 20)) and bool(mallopt(m_trim_threshold, 2**31 - 1))
            except (OSError, AttributeError):
                pass
    return _MALLOC_TUNED


def _as_factor(mask: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """A pass's mask as the 0/1 factor its gradients are multiplied by, made once per pass: a
    product with a bool tensor gives the same bits but takes ~3x as long on a ResNet's gradients
    (measured here), and a float mask built only for the pass is freed with it. Through uint8:
    the same values, ~5x faster than torch's bool conversion on CPU."""
    if mask is None or mask.dtype != torch.bool:
        return mask
    return mask.view(torch.uint8).to(dtype)


class LocalTrainer:
    """Runs passes of masked SGD and gradients on the one shared model, and scores states on its
    channels-last copy (`scoring_model`)."""

    def __init__(self, model: nn.Module, sgd: SGDSettings) -> None:
        tune_malloc()
        self.model = model
        self.sgd = sgd
        self.params = dict(model.named_parameters())
        # train()/eval() as a flag write per module when no module overrides `train` (nn.Module's
        # recursive walk costs more than a small model's whole step).
        self._modules = list(model.modules())
        self._plain_modes = all(type(m).train is nn.Module.train for m in self._modules)
        self._bound = False  # the model points at a caller's tensors (inside `bound`)
        self._scoring_copy: nn.Module | None = None  # `scoring_model`: made at the first scoring
        self._scoring_slots: dict[str, Tensor] = {}
        # Every state-dict entry: (owning module, attribute, is a parameter, the model's own tensor).
        self._slots: dict[str, tuple[nn.Module, str, bool, Tensor]] = {}
        for prefix, module in model.named_modules():
            for attr, p in module._parameters.items():
                if p is not None:
                    self._slots.setdefault(f"{prefix}.{attr}" if prefix else attr, (module, attr, True, p.data))
            for attr, b in module._buffers.items():
                if b is not None and attr not in module._non_persistent_buffers_set:
                    self._slots.setdefault(f"{prefix}.{attr}" if prefix else attr, (module, attr, False, b))
        if list(self._slots) != list(model.state_dict()):
            raise ValueError("LocalTrainer: the model's state-dict entries could not be mapped to its modules")

    def _mode(self, training: bool) -> None:
        if self._plain_modes:
            for m in self._modules:
                m.__dict__["training"] = training
        else:
            self.model.train(training)

    # ---------------------------------------------------------------- pointing the model at a state
    def _check_keys(self, state: Mapping[str, Tensor]) -> None:
        if len(state) != len(self._slots) or any(n not in state for n in self._slots):
            missing = [n for n in self._slots if n not in state]
            unexpected = [n for n in state if n not in self._slots]
            raise RuntimeError(f"state does not match the model: missing keys {missing}, unexpected keys {unexpected}")

    def _fits(self, name: str, t: Tensor) -> bool:
        """Whether `t` can stand in for the model's tensor as is (same shape, dtype, device, strides)."""
        home = self._slots[name][3]
        if t.shape != home.shape:
            raise RuntimeError(f"size mismatch for {name}: the state has {tuple(t.shape)}, "
                               f"the model {tuple(home.shape)}")
        return t.dtype == home.dtype and t.device == home.device and t.stride() == home.stride()

    def copy_state(self, state: Mapping[str, Tensor]) -> State:
        """A fresh copy of `state` laid out as the model's own tensors (what `load_state_dict`
        would have copied into it)."""
        self._check_keys(state)
        out = {}
        for name, (_, _, _, home) in self._slots.items():
            self._fits(name, state[name])
            out[name] = torch.empty_like(home).copy_(state[name])
        return out

    @contextmanager
    def bound(self, state: Mapping[str, Tensor], copy_buffers: bool = False) -> Iterator[nn.Module]:
        """The shared model computing with `state`'s tensors (no copy where they fit; in-place
        updates of the model's parameters and buffers land in them). `copy_buffers=True` gives
        the model copies of the buffers, so that a train-mode forward leaves `state` untouched.
        Not re-entrant: a loss or predictor must not call back into the trainer."""
        if self._bound:
            raise RuntimeError("LocalTrainer is already running a state (a loss_fn called back into it?)")
        self._check_keys(state)
        self._bound = True
        try:
            for name, (module, attr, is_param, _) in self._slots.items():
                t = state[name]
                if not self._fits(name, t) or (copy_buffers and not is_param):
                    t = torch.empty_like(self._slots[name][3]).copy_(t)
                if is_param:
                    module._parameters[attr].data = t
                else:
                    module._buffers[attr] = t
            yield self.model
        finally:
            for module, attr, is_param, home in self._slots.values():
                if is_param:
                    module._parameters[attr].data = home
                else:
                    module._buffers[attr] = home
            self._bound = False

    # ---------------------------------------------------------------- training
    def train_pass(self, state: State, x: Tensor, y: Tensor, update: UpdateSpec, seed: int,
                   loss_fn: LossFn = cross_entropy, corrections: Sequence[Correction] = (),
                   lr: float | None = None, momentum: float | None = None, inplace: bool = False,
                   velocity: dict[str, Tensor] | None = None,
                   batch_steps: Sequence[BatchStep] = ()) -> tuple[State, Tensor, int]:
        """One epoch over (x, y) changing only what `update` allows; returns (new state, loss sum, samples).

        The new state is a fresh dict of fresh tensors: `state`'s tensors are never modified and
        never shared with it. `inplace=True` instead trains `state`'s own tensors (those laid out
        as the model's) and returns a new dict of them: for a caller that drops the old state
        anyway, it saves a model-sized allocation and copy per pass, with the same numbers.
        `corrections` change the gradient before the step (`ClipGradNorm`, `ShiftGradient`,
        `Proximal`; applied in their fixed order with the settings' weight decay); `batch_steps`
        update a second model on each batch before the pass's own step (`BatchStep`). `lr` and
        `momentum` override `self.sgd`'s for this pass (per-round schedules, fine-tuning); the
        momentum buffer starts at zero in every pass, unless `velocity` is given: a dict of
        buffers by parameter name that the pass continues from and leaves updated (missing names
        start at zero), so that several passes make one optimizer's run (`momentum_scope="round"`).
        The loss sum stays a device tensor so that callers decide when to synchronise.
        """
        lr = self.sgd.lr if lr is None else lr
        momentum = self.sgd.momentum if momentum is None else momentum
        new = self._trained_copy(state, inplace)
        names = [n for n in self.params if n in update]
        for name, p in self.params.items():
            p.requires_grad_(name in update)
        trained = [self.params[n] for n in names]
        masks = [_as_factor(update[n], self.params[n].dtype) for n in names]
        masked_idx = [i for i, m in enumerate(masks) if m is not None]
        steps = self._gradient_steps(corrections, names)
        order = batch_order(seed, x.shape[0], x.device)
        loss_sum = torch.zeros((), device=x.device)
        try:
            with self.bound(new) as model:
                self._mode(True)
                velocity = self._velocity(velocity, momentum, names, trained)
                for start in range(0, x.shape[0], self.sgd.batch_size):
                    idx = order[start:start + self.sgd.batch_size]
                    for step in batch_steps:
                        step(model, x[idx], y[idx])
                    loss = loss_fn(model, x[idx], y[idx])
                    loss.backward()
                    with torch.no_grad():
                        grads = [p.grad for p in trained]
                        for step in steps:
                            step(grads, trained)
                        if velocity is not None:
                            torch._foreach_mul_(velocity, momentum)
                            torch._foreach_add_(velocity, grads)
                            grads = [v.clone() for v in velocity]
                        if masked_idx:
                            torch._foreach_mul_([grads[i] for i in masked_idx], [masks[i] for i in masked_idx])
                        torch._foreach_add_(trained, grads, alpha=-lr)
                        loss_sum += loss.detach() * idx.numel()
                    del grads  # gradients freed before the next forward, as `zero_grad(set_to_none=True)`
                    for p in trained:
                        p.grad = None
        finally:
            self._release_grads()
        return new, loss_sum, x.shape[0]

    def _gradient_steps(self, corrections: Sequence[Correction], names: list[str]) -> list[Step]:
        """The pass's gradient transforms for the trained tensors `names`, in their fixed order,
        with the settings' weight decay among them."""
        if self.sgd.weight_decay:
            corrections = [*corrections, WeightDecay(self.sgd.weight_decay)]
        return [c.step(names) for c in sorted(corrections, key=lambda c: c.order)]

    def _trained_copy(self, state: State, inplace: bool) -> State:
        """The state a pass trains: a fresh copy, or (`inplace`) `state`'s own tensors where they
        are laid out as the model's."""
        if not inplace:
            return self.copy_state(state)
        self._check_keys(state)
        return {n: t if self._fits(n, t) else torch.empty_like(self._slots[n][3]).copy_(t) for n, t in state.items()}

    @staticmethod
    def _velocity(velocity: dict[str, Tensor] | None, momentum: float, names: list[str],
                  trained: list[Tensor]) -> list[Tensor] | None:
        """The pass's momentum buffers: none without momentum, zeros, or those of `velocity`."""
        if not momentum:
            return None
        if velocity is None:
            return [torch.zeros_like(p) for p in trained]
        return [velocity.setdefault(name, torch.zeros_like(p)) for name, p in zip(names, trained)]

    def _release_grads(self) -> None:
        for p in self.params.values():
            p.grad = None
            p.requires_grad_(True)

    def gradients(self, state: Mapping[str, Tensor], x: Tensor, y: Tensor, names: Sequence[str] | None = None,
                  loss_fn: LossFn = cross_entropy, batch_size: int | None = None) -> State:
        """Dense gradients of the mean loss over (x, y) w.r.t. the parameters `names` (all by
        default), under `state`, with no update: `state` is unchanged (its BatchNorm running
        statistics too). Train mode, as in training (BatchNorm uses batch statistics). With
        `batch_size`, (x, y) is processed in chunks and their gradients weighted by chunk size.
        A parameter the loss does not reach gets a zero gradient."""
        names = list(self.params) if names is None else list(names)
        unknown = [n for n in names if n not in self.params]
        if unknown:
            raise KeyError(f"gradients: {unknown} are not parameters of the model")
        for name, p in self.params.items():
            p.requires_grad_(name in names)
        n = x.shape[0]
        chunk = n if batch_size is None else batch_size
        try:
            with self.bound(state, copy_buffers=True) as model:
                self._mode(True)
                for start in range(0, n, chunk):
                    xb, yb = x[start:start + chunk], y[start:start + chunk]
                    (loss_fn(model, xb, yb) * (xb.shape[0] / n)).backward()
                return {name: self.params[name].grad if self.params[name].grad is not None
                        else torch.zeros_like(self.params[name]) for name in names}
        finally:
            self._release_grads()

    # ---------------------------------------------------------------- evaluation
    def scoring_model(self) -> nn.Module | None:
        """The model's scoring copy in channels-last memory format (NHWC weights and activations),
        in eval mode, made at the first scoring; None for a model without convolutions. On CPU
        oneDNN's convolutions run faster in that format (`python -m benchmarks.scoring`), but only
        with weights kept in it: converting them on every call costs the gain. Its logits may
        differ from the shared model's in the last bits; in measured runs no prediction changed."""
        if self._scoring_copy is None and any(t.dim() == 4 for t in self.params.values()):
            copy = deepcopy(self.model).to(memory_format=torch.channels_last).eval().requires_grad_(False)
            for module in copy.modules():  # a recorder hooked on the shared model is not the copy's
                module._forward_hooks.clear()
                module._forward_pre_hooks.clear()
            self._scoring_copy, self._scoring_slots = copy, copy.state_dict()
        return self._scoring_copy

    def _load_scorer(self, state: Mapping[str, Tensor]) -> nn.Module:
        """The scoring copy holding `state`'s values (copied in, in its own format). Refused inside
        a pass, as `bound` refuses: a loss or predictor must not call back into the trainer."""
        if self._bound:
            raise RuntimeError("LocalTrainer is already running a state (a loss_fn called back into it?)")
        self._check_keys(state)
        for name, slot in self._scoring_slots.items():
            self._fits(name, state[name])  # a size mismatch is one error, never a broadcast
            slot.copy_(state[name])
        return self._scoring_copy

    @torch.no_grad()
    def evaluate(self, model: Evaluated, x: Tensor, y: Tensor, batch_size: int = 1024) -> int:
        """Number of correctly classified samples (accuracy = correct / len(y), per sample).

        `model` is a state (run on the model's channels-last scoring copy, `scoring_model`, or for a model
        without convolutions on the shared model in eval mode, without copying it) or a callable
        predictor `fn(x) -> logits` (an ensemble, a model with mixed BatchNorm statistics, ...),
        called as is under `torch.no_grad()`."""
        return int((self.predictions(model, x, batch_size) == y).sum())

    @torch.no_grad()
    def predictions(self, model: Evaluated, x: Tensor, batch_size: int = 1024) -> Tensor:
        """The predicted class of each sample (the argmax of its logits), as `evaluate` scores them."""
        if isinstance(model, Mapping):
            if x.dim() == 4 and self.scoring_model() is not None:
                return _predict(self._load_scorer(model), x.contiguous(memory_format=torch.channels_last), batch_size)
            with self.bound(model) as shared:
                self._mode(False)
                try:
                    return _predict(shared, x, batch_size)
                finally:
                    self._mode(True)
        if not callable(model):
            raise TypeError(f"evaluate takes a state dict or a predictor x -> logits, not {type(model).__name__}")
        return _predict(model, x, batch_size)


def _predict(fn: Callable[[Tensor], Tensor], x: Tensor, batch_size: int) -> Tensor:
    if not x.shape[0]:
        return torch.zeros(0, dtype=torch.long, device=x.device)
    return torch.cat([fn(x[start:start + batch_size]).argmax(dim=1) for start in range(0, x.shape[0], batch_size)])
