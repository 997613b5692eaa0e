#!/usr/bin/env bash
# The main job: set up .venv if needed, then run the default FedSelect sweep (sweeps/fedselect_grid.py). Extra arguments are passed on.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
cd "$root"
exec "$root/.venv/bin/python" sweeps/fedselect_grid.py "$@"
