#!/usr/bin/env bash
# Screenshots of what a user sees in the MLflow UI for a finished sweep, at a laptop's width (1400 px
# by default): the runs table and the chart view of the sweep's saved view. Starts `mlflow ui` on the
# results folder's store on a free port, points headless Chromium at it, writes the PNGs and stops
# the server.
#   bash scripts/mlflow_screenshots.sh [RESULTS_DIR] [EXPERIMENT] [OUT_DIR] [SWEEP]
# Defaults: results, fedselect_grid, RESULTS_DIR/screenshots, no sweep (the whole experiment).
# With SWEEP, both pages are the sweep's view, opened by the link the sweep's summary prints
# (`sweeps.mlflow_view.sweep_view_url`): its trials in start order (by validation accuracy where
# there is a split), the accuracy and the swept knobs as the first columns, every trial in the
# charts. Writes OUT_DIR/mlflow_runs.png and mlflow_chart.png (the names docs/ uses); with
# ASSISTANT=1 also mlflow_runs_assistant.png, the table as a first visit from localhost shows it,
# beside the Assistant panel MLflow 3.17 opens then. WIDTH and HEIGHT (environment) set the window.
# The pictures in docs/ were made by
#   .venv/bin/python -m sweeps.run fedselect_grid --rounds 3 --seeds 0 --results /tmp/mlsweep --name fedselect-grid
#   bash scripts/mlflow_screenshots.sh /tmp/mlsweep fedselect_grid docs fedselect-grid
# Needs chromium (apt-get install chromium) and curl.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
results="$(cd "${1:-results}" && pwd)"
experiment="${2:-fedselect_grid}"
out="${3:-$results/screenshots}"
sweep="${4:-}"
width="${WIDTH:-1400}"
height="${HEIGHT:-900}"
python="$root/.venv/bin/python"
browser="$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)"
if [[ -z "$browser" ]]; then echo "error: no chromium on PATH (apt-get install chromium)" >&2; exit 2; fi
if [[ ! -f "$results/mlflow.db" ]]; then echo "error: no MLflow store at $results/mlflow.db" >&2; exit 2; fi
uri="sqlite:///$results/mlflow.db"
port="$("$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
# Opened from localhost or 127.0.0.1, MLflow 3.17 opens its Assistant panel on the first visit, over
# a quarter of the page (until the user closes it, once). The pictures of the steady state reach
# the server under a name of its own, where the panel stays shut; the assistant picture uses
# 127.0.0.1.
alias="mlflow.screenshot"
urls="$(PYTHONPATH="$root" "$python" - "$uri" "$experiment" "$sweep" "http://$alias:$port" <<'PY'
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
local_url="${table_url/$alias/127.0.0.1}"
mkdir -p "$out"
log="$(mktemp -t mlflow-ui.XXXXXX.log)"
"$root/.venv/bin/mlflow" ui --backend-store-uri "$uri" --host 127.0.0.1 --port "$port" --workers 1 \
  --allowed-hosts "$alias:$port,127.0.0.1:$port" --cors-allowed-origins "http://$alias:$port" > "$log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null; wait "$server" 2>/dev/null || true' EXIT
for _ in $(seq 1 120); do
  curl -fs "http://127.0.0.1:$port/health" > /dev/null 2>&1 && break
  sleep 0.5
done
if ! curl -fs "http://127.0.0.1:$port/health" > /dev/null 2>&1; then
  echo "error: mlflow ui did not start within 60 s; its log ($log):" >&2
  tail -20 "$log" >&2
  exit 1
fi
shoot() {  # URL FILE
  # Each picture in a fresh profile: a first visit, with no columns or panel state left by another.
  # --run-all-compositor-stages-before-draw: without it the charts are still spinners when the picture is taken
  local profile
  profile="$(mktemp -d -t mlflow-shot.XXXXXX)"
  if timeout 180 "$browser" --headless=new --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$profile" \
      --window-size="$width,$height" --host-resolver-rules="MAP $alias 127.0.0.1" \
      --run-all-compositor-stages-before-draw --virtual-time-budget=30000 --screenshot="$2" "$1" \
      > /dev/null 2>&1 && [[ -s "$2" ]]; then
    rm -rf "$profile"
    # a 256-colour palette: a quarter of the bytes, the same picture to the eye (Pillow comes with matplotlib)
    "$python" -c 'import sys; from PIL import Image
Image.open(sys.argv[1]).convert("RGB").quantize(256).save(sys.argv[1], optimize=True)' "$2"
    echo "wrote $2 ($1)"
  else
    rm -rf "$profile"
    echo "error: chromium did not write $2 within 180 s" >&2
    return 1
  fi
}
shoot "$table_url" "$out/mlflow_runs.png"
shoot "$chart_url" "$out/mlflow_chart.png"
if [[ "${ASSISTANT:-0}" == 1 ]]; then shoot "$local_url" "$out/mlflow_runs_assistant.png"; fi
