"""Model checkpoints between the stages of a two-stage study (FedL2P: pretrain, then personalize).

A finished run can write its final server model to `<checkpoint_dir>/<config_hash>.pt`
(`save_model`): the state dict together with what produced it (the run's config hash, its
semantic knobs, the model's name and the data it was trained on). A later run names that
checkpoint with the `pretrained` knob (the hash) and starts every client and the server from it
(`load_pretrained`). The second run refuses, with one ConfigError and before any data is loaded,
a checkpoint that is missing, unreadable, written under another hash, or trained on other data or
another model: personalizing a model pretrained elsewhere would compare unlike things.

"Same data" means equal data knobs (`data_identity`: dataset, options, partition, clients,
sizes, validation split, unseen pool, seed), so the pretraining saw exactly the clients (and never
the unseen ones) that the second stage personalizes. The file is written atomically.
"""
from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import torch

from .config import DATA_KNOBS, NON_SEMANTIC, ConfigError, RunConfig

FORMAT = 1
DEFAULT_DIR = "checkpoints"


def data_identity(config: RunConfig) -> dict[str, Any]:
    """The data knobs that decide a run's clients (where the files live is left out)."""
    return {k: getattr(config, k) for k in DATA_KNOBS if k not in NON_SEMANTIC}


def checkpoint_path(config: RunConfig, config_hash: str) -> Path:
    return Path(config.checkpoint_dir or DEFAULT_DIR).expanduser() / f"{config_hash}.pt"


def server_model(global_state: dict[str, torch.Tensor], client_states: list[dict[str, torch.Tensor]],
                 shared: list[str]) -> dict[str, torch.Tensor]:
    """The model a finished run hands on: the server's `shared` entries (the averaged parameters)
    and, for every other floating-point entry (BN running statistics, which FedAvg keeps local
    here), the plain mean over `client_states` (the seen clients), as a FedAvg that averages the
    whole state dict (the FedL2P authors' pretraining) would hold. Integer buffers (BN's batch
    counters) are the first client's."""
    out = {}
    for name, value in global_state.items():
        if name in shared or not client_states:
            out[name] = value.detach().clone()
        elif value.is_floating_point():
            out[name] = torch.stack([c[name].to(value.dtype) for c in client_states]).mean(0)
        else:
            out[name] = client_states[0][name].clone()
    return out


def torch_save_atomic(obj: Any, path: str | os.PathLike) -> Path:
    """`torch.save(obj)` to `path` atomically (temp file beside it, then rename), so a crash never
    leaves a half-written file; the folder is created. Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(buffer.getvalue())
    os.replace(tmp, path)
    return path


def save_model(config: RunConfig, model_name: str, state: dict[str, torch.Tensor],
               folder: str | os.PathLike | None = None) -> Path:
    """Write `state` (the run's final server model) as `<folder>/<config hash>.pt`, atomically;
    `folder` defaults to the config's `checkpoint_dir`. Returns the path."""
    key = config.config_hash()
    path = Path(folder) / f"{key}.pt" if folder is not None else checkpoint_path(config, key)
    payload = {"format": FORMAT, "config_hash": key, "algorithm": config.algorithm, "model": model_name,
               "data": data_identity(config), "config": config.semantic_dict(),
               "state": {n: t.detach().cpu().clone() for n, t in state.items()}}
    return torch_save_atomic(payload, path)


def read_pretrained(config: RunConfig, model_name: str) -> dict[str, Any]:
    """The checkpoint `config.pretrained` names, checked against this run (module docstring);
    raises one ConfigError saying what is wrong and how to make the right one."""
    key = config.pretrained
    path = checkpoint_path(config, key)
    if not path.is_file():
        raise ConfigError(f"pretrained={key}: no checkpoint {path}; run the pretraining first (a run with config "
                          f"hash {key} writes it: the study's pretrain stage, or `python -m fl_core ... "
                          f"--checkpoint-dir {path.parent}`), or point checkpoint_dir at the folder that holds it")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unreadable file is the same user error
        raise ConfigError(f"pretrained={key}: {path} could not be read as a checkpoint: {err}") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ConfigError(f"pretrained={key}: {path} is not a checkpoint of format {FORMAT} "
                          f"(written by fl_core.checkpoints.save_model)")
    if payload["config_hash"] != key:
        raise ConfigError(f"pretrained={key}: {path} holds the model of run {payload['config_hash']}, not of {key}")
    if payload["model"] != model_name:
        raise ConfigError(f"pretrained={key}: the checkpoint is a {payload['model']} and this run trains a "
                          f"{model_name}; pretrain the same model")
    ours = data_identity(config)
    differ = [f"{k}={payload['data'].get(k)!r} there, {v!r} here" for k, v in ours.items()
              if payload["data"].get(k) != v]
    if differ:
        raise ConfigError(f"pretrained={key}: the checkpoint was trained on other data ({'; '.join(differ)}); "
                          f"pretrain on this run's data setting and seed")
    return payload


def load_pretrained(config: RunConfig, model_name: str, model: torch.nn.Module) -> dict[str, Any]:
    """Load the checked checkpoint into `model` (every key and shape must match); returns it."""
    payload = read_pretrained(config, model_name)
    own = model.state_dict()
    state = payload["state"]
    wrong = sorted(set(own) ^ set(state)) + [k for k in own if k in state and own[k].shape != state[k].shape]
    if wrong:
        raise ConfigError(f"pretrained={config.pretrained}: the checkpoint's tensors do not fit this model "
                          f"({', '.join(wrong[:5])})")
    model.load_state_dict(state, strict=True)
    return payload
