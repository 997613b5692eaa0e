#!/usr/bin/env bash
# Screenshots of what a user sees in the MLflow UI for a finished sweep: the runs table and the
# chart view of the study's experiment. Starts `mlflow ui` on a free port, points headless
# Chromium at it, writes two PNGs and stops the server.
#   bash scripts/mlflow_screenshots.sh [RESULTS_DIR] [EXPERIMENT] [OUT_DIR] [SWEEP]
# Defaults: results, fedselect_grid, RESULTS_DIR/screenshots, no sweep (the whole experiment).
# With SWEEP, both pages are the sweep's view, opened by the link the sweep's summary prints
# (`sweeps.mlflow_view.sweep_view_url`): its trials, best acc_mean first, its knobs and final
# metrics as columns, every trial in the charts. Needs chromium (apt-get install chromium).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
results="$(cd "${1:-results}" && pwd)"
experiment="${2:-fedselect_grid}"
out="${3:-$results/screenshots}"
sweep="${4:-}"
python="$root/.venv/bin/python"
browser="$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)"
if [[ -z "$browser" ]]; then echo "error: no chromium on PATH (apt-get install chromium)" >&2; exit 2; fi
if [[ ! -f "$results/mlflow.db" ]]; then echo "error: no MLflow store at $results/mlflow.db" >&2; exit 2; fi
uri="sqlite:///$results/mlflow.db"
port="$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
# The browser reaches the server under a name of its own: opened from localhost or 127.0.0.1,
# MLflow 3.17 pops its Assistant panel open on the first visit, over a third of the page.
alias="mlflow.screenshot"
host="http://$alias:$port"
urls="$(PYTHONPATH="$root" "$python" - "$uri" "$experiment" "$sweep" "$host" <<'PY'
import sys
from mlflow import MlflowClient
from sweeps.mlflow_view import runs_view_url, sweep_view_url
uri, experiment, sweep, host = sys.argv[1:]
found = MlflowClient(tracking_uri=uri).get_experiment_by_name(experiment)
if found:
    for mode in ("TABLE", "CHART"):
        print(sweep_view_url(uri, experiment, sweep, mode, host) if sweep else
              runs_view_url(found.experiment_id, None, mode, host))
PY
)"
if [[ -z "$urls" ]]; then echo "error: no experiment named $experiment in $uri" >&2; exit 2; fi
table_url="$(sed -n 1p <<< "$urls")"
chart_url="$(sed -n 2p <<< "$urls")"
mkdir -p "$out"
"$root/.venv/bin/mlflow" ui --backend-store-uri "$uri" --host 127.0.0.1 --port "$port" --workers 1 \
  --allowed-hosts "$alias:$port,127.0.0.1:$port" --cors-allowed-origins "$host" > "$out/mlflow-ui.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
  curl -fs "http://127.0.0.1:$port/health" > /dev/null 2>&1 && break
  sleep 0.5
done
shoot() {  # URL FILE
  # --run-all-compositor-stages-before-draw: without it the charts are still spinners when the picture is taken
  if timeout 180 "$browser" --headless=new --no-sandbox --disable-gpu --hide-scrollbars --window-size=1600,1000 \
      --host-resolver-rules="MAP $alias 127.0.0.1" --run-all-compositor-stages-before-draw \
      --virtual-time-budget=30000 --screenshot="$2" "$1" > /dev/null 2>&1 && [[ -s "$2" ]]; then
    echo "wrote $2 ($1)"
  else
    echo "error: chromium did not write $2 within 180 s" >&2
    return 1
  fi
}
shoot "$table_url" "$out/mlflow_runs_table.png"
shoot "$chart_url" "$out/mlflow_runs_chart.png"
