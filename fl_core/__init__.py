"""fl_core: the federated-learning engine (pure PyTorch; no Ray, no MLflow).

One federated run: `Simulation(RunConfig(...)).run()` yields a `RoundResult` per round.
From the shell: `python -m fl_core --help`.
"""
from importlib import metadata as _metadata

try:
    __version__ = _metadata.version("fedselect-sweeps")
except _metadata.PackageNotFoundError:  # running from a source tree that was not installed
    __version__ = "0.0.0+unknown"
