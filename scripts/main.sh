#!/usr/bin/env bash
# The main job: set up .venv if needed, then run the default study. Extra arguments are passed on.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
cd "$root"
exec "$root/.venv/bin/python" -m fl_core --algorithm fedselect --dataset digits --partition shards \
    --shards-per-client 2 --num-clients 10 --rounds 20 --pers-rate 0.25 --pers-limit 0.8 --seed 0 \
    --results results/demo "$@"
