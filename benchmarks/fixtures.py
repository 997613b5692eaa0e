"""Benchmark inputs that need no download, a byte count of what a client holds, and the report
files the docs include.

`random_federated` builds `FederatedData` directly from random tensors of any image shape (e.g.
CIFAR's 3x32x32, which no offline source provides); each client sees 2 of the classes, every
class a fixed random prototype plus noise, so training moves weights as on real data.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from fl_core import kernels
from fl_core.data import ClientData, FederatedData


def random_federated(num_clients: int, shape: tuple[int, int, int], n_train: int, n_test: int,
                     num_classes: int = 10, seed: int = 0, n_val: int = 0) -> FederatedData:
    """`num_clients` clients with `n_train`/`n_test` (and `n_val` validation) float32 samples of
    `shape`, 2 classes each."""
    g = torch.Generator().manual_seed(seed)
    protos = torch.randn(num_classes, *shape, generator=g)
    clients, train_hist, test_hist, val_hist = [], [], [], []
    for k in range(num_clients):
        classes = torch.tensor([(2 * k) % num_classes, (2 * k + 1) % num_classes])

        def draw(n: int) -> tuple[torch.Tensor, torch.Tensor]:
            y = classes[torch.randint(0, 2, (n,), generator=g)]
            return protos[y] + 0.8 * torch.randn(n, *shape, generator=g), y

        x_tr, y_tr = draw(n_train)
        x_te, y_te = draw(n_test)
        x_va, y_va = draw(n_val) if n_val else (None, None)  # n_val = 0 draws nothing: the data are as before
        clients.append(ClientData(x_tr, y_tr, x_te, y_te, x_va, y_va))
        train_hist.append(np.bincount(y_tr.numpy(), minlength=num_classes))
        test_hist.append(np.bincount(y_te.numpy(), minlength=num_classes))
        val_hist.append(np.bincount(y_va.numpy(), minlength=num_classes) if n_val else np.zeros(num_classes))
    return FederatedData(clients, num_classes, shape, np.stack(train_hist).astype(np.int64),
                         np.stack(test_hist).astype(np.int64),
                         np.stack(val_hist).astype(np.int64))


def _storages(obj: Any, seen: dict[int, int]) -> None:
    if isinstance(obj, torch.Tensor):
        storage = obj.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    elif isinstance(obj, dict):
        for v in obj.values():
            _storages(v, seen)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _storages(v, seen)


def client_bytes(client, model: nn.Module, selectable: list[str]) -> tuple[int, int, int]:
    """(bytes of every tensor storage a client holds between rounds, counted once each through
    `ClientState.to_dict()`: state, mask, extras; the model's parameter and buffer bytes; the bytes
    of its masks bit-packed, ceil(numel / 8) per selectable tensor)."""
    seen: dict[int, int] = {}
    _storages(client.to_dict(), seen)
    model_bytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    numels = dict((n, p.numel()) for n, p in model.named_parameters())
    packed = sum((numels[n] + 7) // 8 for n in selectable)
    return sum(seen.values()), model_bytes, packed


def machine_caption() -> str:
    """Where a benchmark ran: the CPU's instruction sets, the kernels in effect, torch's threads."""
    return (f"CPU: {kernels.machine_isa()}; kernels: {kernels.describe()}; "
            f"{torch.get_num_threads()} torch thread(s)")


def write_report(out: Path | None, lines: list[str], caption: str) -> None:
    """A benchmark's printed Markdown table and its caption, also written to `out` (a file the
    docs include, so that their numbers are this run's) when given."""
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("\n".join(lines) + "\n\n" + caption + "\n")
