"""Per-client tensors: load a source, partition it, slice out each client's data.

The result is built once per trial (on CPU) and moved to the trial's device with
:meth:`FederatedData.to`; training then indexes these tensors directly, without a
DataLoader per client per round.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .partition import partition as make_partition
from .sources import load_source


@dataclass
class ClientData:
    """One client's train and test tensors."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor

    @property
    def n_train(self) -> int:
        return int(self.y_train.shape[0])

    @property
    def n_test(self) -> int:
        return int(self.y_test.shape[0])

    def to(self, device) -> "ClientData":
        """A copy with all tensors on ``device``."""
        return ClientData(self.x_train.to(device), self.y_train.to(device),
                          self.x_test.to(device), self.y_test.to(device))


@dataclass
class FederatedData:
    """All clients' data plus the realised per-client label histograms."""

    clients: list[ClientData]
    num_classes: int
    input_shape: tuple[int, int, int]
    train_hist: np.ndarray  # (num_clients, num_classes) int64 train label counts
    test_hist: np.ndarray  # (num_clients, num_classes) int64 test label counts

    def to(self, device) -> "FederatedData":
        """A copy with every client's tensors on ``device`` (histograms are shared)."""
        return FederatedData([c.to(device) for c in self.clients], self.num_classes,
                             self.input_shape, self.train_hist, self.test_hist)


def build_federated_data(*, dataset: str, num_clients: int, partition: str, seed: int,
                         shards_per_client: int = 2, dir_alpha: float = 0.5,
                         samples_per_client: int | None = None,
                         test_samples_per_client: int | None = None,
                         min_samples: int = 10, data_root=None,
                         download: bool = False) -> FederatedData:
    """Load ``dataset``, split it with scheme ``partition`` and return per-client tensors."""
    data = load_source(dataset, data_root=data_root, download=download)
    y_train, y_test = data.y_train.numpy(), data.y_test.numpy()
    splits = make_partition(
        y_train, y_test, scheme=partition, num_clients=num_clients, seed=seed,
        num_classes=data.num_classes, shards_per_client=shards_per_client,
        dir_alpha=dir_alpha, samples_per_client=samples_per_client,
        test_samples_per_client=test_samples_per_client, min_samples=min_samples)

    clients = []
    for split in splits:
        tr, te = torch.from_numpy(split.train), torch.from_numpy(split.test)
        # Advanced indexing copies, so every client owns contiguous tensors.
        clients.append(ClientData(data.x_train[tr], data.y_train[tr],
                                  data.x_test[te], data.y_test[te]))

    def hist(y, idx_of):
        return np.stack([np.bincount(y[idx_of(s)], minlength=data.num_classes)
                         for s in splits]).astype(np.int64)

    return FederatedData(clients, data.num_classes, data.input_shape,
                         hist(y_train, lambda s: s.train), hist(y_test, lambda s: s.test))
