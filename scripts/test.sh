#!/usr/bin/env bash
# The test suite: set up .venv if needed, then run pytest. Extra arguments go to pytest.
#   bash scripts/test.sh          the quick run: every test not marked slow, on every core (time: README)
#   bash scripts/test.sh --all    every test, the slow ones too (Ray sweeps, the site, real data), in one
#                                 process (the Ray tests share one cluster): CI's run
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
cd "$root"
if [[ "${1:-}" == "--all" ]]; then
  shift
  exec "$root/.venv/bin/python" -m pytest -m "" -n 0 "$@"
fi
exec "$root/.venv/bin/python" -m pytest "$@"
