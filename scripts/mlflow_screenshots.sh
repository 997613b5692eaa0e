#!/usr/bin/env bash
# Screenshots of what a user sees in the MLflow UI for a finished sweep: the runs table and the
# chart view of the study's experiment. Starts `mlflow ui` on a free port, points headless
# Chromium at it, writes two PNGs and stops the server.
#   bash scripts/mlflow_screenshots.sh [RESULTS_DIR] [EXPERIMENT] [OUT_DIR]
# Defaults: results, fedselect_grid, RESULTS_DIR/screenshots. Needs chromium (apt-get install chromium).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
results="$(cd "${1:-results}" && pwd)"
experiment="${2:-fedselect_grid}"
out="${3:-$results/screenshots}"
python="$root/.venv/bin/python"
browser="$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)"
if [[ -z "$browser" ]]; then echo "error: no chromium on PATH (apt-get install chromium)" >&2; exit 2; fi
if [[ ! -f "$results/mlflow.db" ]]; then echo "error: no MLflow store at $results/mlflow.db" >&2; exit 2; fi
uri="sqlite:///$results/mlflow.db"
id="$("$python" - "$uri" "$experiment" <<'PY'
import sys
from mlflow import MlflowClient
found = MlflowClient(tracking_uri=sys.argv[1]).get_experiment_by_name(sys.argv[2])
print(found.experiment_id if found else "")
PY
)"
if [[ -z "$id" ]]; then echo "error: no experiment named $experiment in $uri" >&2; exit 2; fi
port="$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
mkdir -p "$out"
"$root/.venv/bin/mlflow" ui --backend-store-uri "$uri" --host 127.0.0.1 --port "$port" > "$out/mlflow-ui.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
  curl -fs "http://127.0.0.1:$port/health" > /dev/null 2>&1 && break
  sleep 0.5
done
shoot() {  # URL FILE
  if timeout 180 "$browser" --headless=new --no-sandbox --disable-gpu --hide-scrollbars --window-size=1600,1000 \
      --virtual-time-budget=15000 --screenshot="$2" "$1" > /dev/null 2>&1 && [[ -s "$2" ]]; then
    echo "wrote $2"
  else
    echo "error: chromium did not write $2 within 180 s" >&2
    return 1
  fi
}
base="http://127.0.0.1:$port/#/experiments/$id/runs"
shoot "$base?compareRunsMode=TABLE" "$out/mlflow_runs_table.png"
shoot "$base?compareRunsMode=CHART" "$out/mlflow_runs_chart.png"
