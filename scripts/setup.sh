#!/usr/bin/env bash
# Create the project-local virtualenv .venv and install the project into it.
# Idempotent: a second call with an unchanged pyproject.toml installs nothing.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
python="${PYTHON:-python3.11}"
command -v "$python" >/dev/null || python=python3

stamp="$venv/.installed-$(sha256sum "$root/pyproject.toml" | cut -c1-16)"
if [ -f "$stamp" ]; then
    exit 0
fi
if [ ! -x "$venv/bin/python" ]; then
    echo "[setup] creating $venv" >&2
    "$python" -m venv "$venv"
fi
echo "[setup] installing the project and its dependencies into $venv (first time: a few minutes)" >&2
log="$venv/setup.log"
if ! { "$venv/bin/python" -m pip install --upgrade pip && "$venv/bin/python" -m pip install -e "$root[test,docs]"; } >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "[setup] failed; full log: $log" >&2
    exit 1
fi
rm -f "$venv"/.installed-*
touch "$stamp"
echo "[setup] done" >&2
