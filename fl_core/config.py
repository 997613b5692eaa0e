"""RunConfig: every knob of one federated run, validated before any work starts.

The field names are the project's vocabulary (DESIGN.md, "Names"): they are the CLI flags (with
dashes), the Parquet columns and the MLflow params. Each field carries its help text, so the CLI
and the docs are generated from this one place.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

ALGORITHMS = ("fedselect", "fedavg", "local", "fedavg_ft", "fedper", "fedrep", "fedbabu", "lg_fedavg", "ditto",
              "fedpac", "lotteryfl")
FEDSELECT_VARIANTS = ("gradselect", "personalize_least", "layer", "random")
BLOCKS = ("A", "B", "C", "D")
DATASETS = ("digits", "mnist", "cifar10", "synthetic")
PARTITIONS = ("shards", "dirichlet", "iid")
MODELS = ("auto", "lenet", "cnn2", "resnet18_cifar", "resnet18")
SELECT_PARAMS = ("weights", "all")
WEIGHTINGS = ("uniform", "samples")
FEDSELECT_MODES = ("default", "faithful")
DEVICES = ("cpu", "cuda", "auto")

# Fields that change where or how fast a run happens, not what it computes: they are left out of
# the config hash so that the same experiment on a laptop and on a cluster shares one hash.
NON_SEMANTIC = ("data_root", "download", "device", "threads")


class ConfigError(ValueError):
    """A knob has a value outside what is allowed; the message names both."""


def _knob(default: Any, help: str, choices: tuple | None = None) -> Any:
    return field(default=default, metadata={"help": help, "choices": choices})


@dataclass(frozen=True)
class RunConfig:
    algorithm: str = _knob("fedselect", "federated algorithm", ALGORITHMS)
    dataset: str = _knob("digits", "dataset source (digits is bundled with scikit-learn: offline)", DATASETS)
    model: str = _knob("auto", "model; auto = lenet for 8x8/28x28 inputs, cnn2 for 32x32", MODELS)
    num_clients: int = _knob(10, "number of clients (all take part every round)")
    partition: str = _knob("shards", "how the training data is split over clients", PARTITIONS)
    shards_per_client: int = _knob(2, "shards: distinct classes per client")
    dir_alpha: float = _knob(0.5, "dirichlet: concentration of the per-class Dirichlet split (> 0; small = skewed)")
    samples_per_client: int | None = _knob(None, "cap on each client's training samples (the paper uses 100); none = no cap")
    test_samples_per_client: int | None = _knob(None, "cap on each client's test samples; none = its share of the test set")
    min_samples: int = _knob(10, "dirichlet: minimum training samples per client")
    rounds: int = _knob(20, "communication rounds")
    local_epochs: int = _knob(1, "local epochs per round (FedSelect: LocalAlt epochs, each a personal and a global pass)")
    batch_size: int = _knob(32, "local mini-batch size")
    lr: float = _knob(0.1, "local SGD learning rate")
    momentum: float = _knob(0.0, "local SGD momentum (buffers are reset every local update)")
    weight_decay: float = _knob(0.0, "local SGD weight decay")
    pers_rate: float = _knob(0.25, "FedSelect p: share of the still-global entries made personal each round, in [0, 1]")
    pers_limit: float = _knob(0.8, "FedSelect alpha: cap on the personal fraction of each tensor, in [0, 1]")
    select_params: str = _knob("weights", "FedSelect: tensors that may become personal (weights = *weight tensors; all = every parameter)", SELECT_PARAMS)
    fedselect_mode: str = _knob("default", "FedSelect semantics: default (DESIGN.md) or faithful (the public reference code)", FEDSELECT_MODES)
    mask_every: int = _knob(1, "FedSelect faithful mode: grow the mask every k rounds")
    fedselect_variant: str = _knob("gradselect", "FedSelect ablation (paper Table 3): gradselect = largest |Δ|; "
                                   "personalize_least = smallest |Δ|; layer = one whole block; random = random entries",
                                   FEDSELECT_VARIANTS)
    layer_block: str = _knob("A", "FedSelect layer ablation: the block made personal (A-D, see fl_core/models.py)", BLOCKS)
    weighting: str = _knob("uniform", "server averaging weights: uniform over clients or by training samples", WEIGHTINGS)
    ft_epochs: int = _knob(1, "FedAvg+FT and FedBABU: fine-tuning epochs before each evaluation")
    head_epochs: int = _knob(10, "FedRep: epochs training the head (body frozen) before the body epochs")
    ditto_lambda: float = _knob(1.0, "Ditto: weight λ of the proximal term λ/2·||v - w||² of the personal model (1 = the paper's clean-data setting)")
    fedpac_lambda: float = _knob(1.0, "FedPAC: weight λ of the feature-alignment loss (a mean over batch and feature entries, as the authors' MSELoss)")
    lottery_acc_threshold: float = _knob(0.5, "LotteryFL: prune only while local accuracy is above this (1 = never prune)")
    lottery_prune_step: float = _knob(0.2, "LotteryFL: share of the remaining weights pruned per pruning step")
    lottery_target_sparsity: float = _knob(0.5, "LotteryFL: stop pruning at this share of pruned weights (paper: 0.5 CIFAR-10, 0.9 MNIST)")
    seed: int = _knob(0, "seed of partition, initialisation and batch order")
    data_root: str | None = _knob(None, "folder with torchvision-layout data (default: $FL_DATA_ROOT or ./data)")
    download: bool = _knob(False, "download mnist/cifar10 if missing (needs internet)")
    device: str = _knob("cpu", "torch device for the run", DEVICES)
    threads: int | None = _knob(None, "torch CPU threads (none = torch's default)")

    # ------------------------------------------------------------------ validation
    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        for f in dataclasses.fields(self):
            choices = f.metadata.get("choices")
            value = getattr(self, f.name)
            if choices and value not in choices:
                raise ConfigError(f"{f.name}={value!r} is not allowed; choose one of {', '.join(choices)}")
        for name in ("pers_rate", "pers_limit"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ConfigError(f"{name}={value!r} is outside the allowed range [0, 1]")
        if not self.dir_alpha > 0:
            raise ConfigError(f"dir_alpha={self.dir_alpha!r} must be > 0")
        if not self.lr > 0:
            raise ConfigError(f"lr={self.lr!r} must be > 0")
        if not 0.0 <= self.momentum < 1.0:
            raise ConfigError(f"momentum={self.momentum!r} must be in [0, 1)")
        if self.weight_decay < 0:
            raise ConfigError(f"weight_decay={self.weight_decay!r} must be >= 0")
        positive = ("num_clients", "shards_per_client", "rounds", "local_epochs", "batch_size", "mask_every", "min_samples")
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)!r} must be an integer >= 1")
        for name in ("samples_per_client", "test_samples_per_client", "threads"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name}={value!r} must be >= 1 (or none)")
        for name in ("ft_epochs", "head_epochs"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}={getattr(self, name)!r} must be >= 0")
        for name in ("ditto_lambda", "fedpac_lambda"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}={getattr(self, name)!r} must be >= 0")
        for name in ("lottery_acc_threshold", "lottery_prune_step", "lottery_target_sparsity"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"{name}={getattr(self, name)!r} is outside the allowed range [0, 1]")

    # ------------------------------------------------------------------ helpers
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "RunConfig":
        """Build from a dict (e.g. a Tune config), rejecting unknown keys by name."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown config key(s) {', '.join(unknown)}; known keys: {', '.join(sorted(known))}")
        return cls(**values)

    def replace(self, **changes: Any) -> "RunConfig":
        return dataclasses.replace(self, **changes)

    def config_hash(self) -> str:
        """Short stable hash of everything that determines the results."""
        semantic = {k: v for k, v in self.to_dict().items() if k not in NON_SEMANTIC}
        blob = json.dumps(semantic, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]
