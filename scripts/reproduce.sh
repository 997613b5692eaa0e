#!/usr/bin/env bash
# Run a study the docs report and regenerate its files under docs/results/ (scripts/reproduce.py):
#   bash scripts/reproduce.sh --list | NAME [--tables-only] | default --check
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/setup.sh"
cd "$root"
exec "$root/.venv/bin/python" -m scripts.reproduce "$@"
