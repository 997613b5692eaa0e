"""Shared fixtures: tiny runs on the synthetic source (8x8, 10 classes) so that tests take seconds."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from fl_core.config import RunConfig

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def tiny(**overrides) -> RunConfig:
    """A FedSelect run small enough for unit tests (4 clients, synthetic data, 3 rounds)."""
    base = dict(algorithm="fedselect", dataset="synthetic", num_clients=4, partition="shards",
                shards_per_client=3, rounds=3, batch_size=16, lr=0.05, pers_rate=0.3, pers_limit=0.6,
                threads=1)
    return RunConfig(**(base | overrides))


@pytest.fixture(autouse=True)
def _deterministic_threads():
    torch.set_num_threads(1)
    yield
