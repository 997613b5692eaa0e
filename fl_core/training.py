"""Local SGD over a subset of entries, and evaluation; shared by every algorithm.

One model object runs every client: a client's state is loaded into it (`load_state_dict`),
trained, and read back. Per-client data are tensors already on the device; a pass slices them
with a seeded permutation, so there is no DataLoader and no host sync inside the training step.
"""
from __future__ import annotations

import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn import functional as F

State = dict[str, Tensor]
# What one pass may change: name -> None (the whole tensor) or a float 0/1 tensor (those entries).
# Parameters not named are frozen for the pass.
UpdateSpec = Mapping[str, Tensor | None]
# A training loss other than cross-entropy: (model, x, y) -> scalar loss (e.g. FedPAC's alignment).
LossFn = Callable[[nn.Module, Tensor, Tensor], Tensor]


def cross_entropy(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    return F.cross_entropy(model(x), y)


def derive_seed(*parts: int | str) -> int:
    """A 63-bit seed from (run seed, round, client, purpose, ...): batch orders never share a stream."""
    words = [p if isinstance(p, int) else zlib.crc32(p.encode()) for p in parts]
    return int(np.random.SeedSequence(words).generate_state(2, dtype=np.uint64)[0] >> np.uint64(1))


@dataclass(frozen=True)
class SGDSettings:
    lr: float
    batch_size: int
    momentum: float = 0.0
    weight_decay: float = 0.0


def load_state(model: nn.Module, state: Mapping[str, Tensor]) -> None:
    model.load_state_dict(state, strict=True)


def read_state(model: nn.Module) -> State:
    return {name: t.detach().clone() for name, t in model.state_dict().items()}


class LocalTrainer:
    """Runs passes of masked SGD and evaluations on the one shared model."""

    def __init__(self, model: nn.Module, sgd: SGDSettings) -> None:
        self.model = model
        self.sgd = sgd
        self.params = dict(model.named_parameters())

    # ---------------------------------------------------------------- training
    def train_pass(self, state: State, x: Tensor, y: Tensor, update: UpdateSpec, seed: int,
                   loss_fn: LossFn = cross_entropy, prox: tuple[float, Mapping[str, Tensor]] | None = None,
                   lr: float | None = None) -> tuple[State, Tensor, int]:
        """One epoch over (x, y) changing only what `update` allows; returns (new state, loss sum, samples).

        `prox=(lam, reference)` adds lam/2 * ||w - reference||^2 to the loss of the trained tensors
        (Ditto's personal objective). `lr` overrides the base learning rate for this pass (a
        round's scheduled lr, a fine-tuning lr). The loss sum stays a device tensor so that
        callers decide when to synchronise.
        """
        model, sgd = self.model, self.sgd
        step = sgd.lr if lr is None else lr
        load_state(model, state)
        model.train()
        names = [n for n in self.params if n in update]
        for name, p in self.params.items():
            p.requires_grad_(name in update)
        trained = [self.params[n] for n in names]
        masks = [update[n] for n in names]
        masked_idx = [i for i, m in enumerate(masks) if m is not None]
        velocity = [torch.zeros_like(p) for p in trained] if sgd.momentum else None
        anchor = [prox[1][n] for n in names] if prox else None

        n = x.shape[0]
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).to(x.device)
        loss_sum = torch.zeros((), device=x.device)
        for start in range(0, n, sgd.batch_size):
            idx = order[start:start + sgd.batch_size]
            loss = loss_fn(model, x[idx], y[idx])
            for p in trained:
                p.grad = None
            loss.backward()
            with torch.no_grad():
                grads = [p.grad for p in trained]
                if sgd.weight_decay:
                    torch._foreach_add_(grads, trained, alpha=sgd.weight_decay)
                if anchor is not None:
                    torch._foreach_add_(grads, torch._foreach_sub(trained, anchor), alpha=prox[0])
                if velocity is not None:
                    torch._foreach_mul_(velocity, sgd.momentum)
                    torch._foreach_add_(velocity, grads)
                    grads = [v.clone() for v in velocity]
                if masked_idx:
                    torch._foreach_mul_([grads[i] for i in masked_idx], [masks[i] for i in masked_idx])
                torch._foreach_add_(trained, grads, alpha=-step)
                loss_sum += loss.detach() * idx.numel()
        for p in self.params.values():
            p.grad = None
            p.requires_grad_(True)
        return read_state(model), loss_sum, n

    def gradients(self, state: Mapping[str, Tensor], x: Tensor, y: Tensor, names: list[str] | None = None,
                  loss_fn: LossFn = cross_entropy) -> State:
        """Dense gradients of the mean loss on (x, y) (e.g. one batch) with respect to the named
        parameters (all by default), in train mode; no parameter is changed."""
        names = list(self.params) if names is None else names
        load_state(self.model, state)
        self.model.train()
        for name, p in self.params.items():
            p.requires_grad_(name in names)
        loss = loss_fn(self.model, x, y)
        grads = torch.autograd.grad(loss, [self.params[n] for n in names])
        for p in self.params.values():
            p.requires_grad_(True)
        return {n: g.detach() for n, g in zip(names, grads)}

    # ---------------------------------------------------------------- evaluation
    @torch.no_grad()
    def evaluate(self, model: Mapping[str, Tensor] | Callable[[Tensor], Tensor], x: Tensor, y: Tensor,
                 batch_size: int = 1024) -> int:
        """Number of correctly classified samples (accuracy = correct / len(y), per sample) of a
        state (loaded into the shared model, eval mode) or of a predictor `x -> logits`."""
        if callable(model):
            predict = model
        else:
            load_state(self.model, model)
            self.model.eval()
            predict = self.model
        correct = torch.zeros((), dtype=torch.long, device=x.device)
        for start in range(0, x.shape[0], batch_size):
            pred = predict(x[start:start + batch_size]).argmax(dim=1)
            correct += (pred == y[start:start + batch_size]).sum()
        self.model.train()
        return int(correct)
