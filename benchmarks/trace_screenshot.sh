#!/usr/bin/env bash
# docs/img/chrome-trace.png: a small run's chrome_trace.json as Perfetto's web UI draws it.
# Perfetto's UI is a web page (ui.perfetto.dev), so this needs network access as well as
# chromium on PATH (apt-get install -y chromium). The trace is served on 127.0.0.1:9001,
# the address Perfetto's UI accepts a trace from (?url=), with the CORS header it asks
# for; headless Chromium opens the UI on it and saves a 1600 x 1000 px screenshot.
#   bash benchmarks/trace_screenshot.sh
# SERVESIM overrides the command (e.g. "python -m sim.app.cli").
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
read -r -a servesim <<< "${SERVESIM:-servesim}"
chromium=$(command -v chromium || command -v chromium-browser || command -v google-chrome) \
  || { echo "error: no chromium on PATH (apt-get install -y chromium)" >&2; exit 1; }
work=$(mktemp -d)
server_pid=""
cleanup() { [ -n "$server_pid" ] && kill "$server_pid" 2> /dev/null; rm -rf "$work"; }
trap cleanup EXIT
# two replicas, a queue that builds and drains: every kind of track in a few seconds
"${servesim[@]}" run --num-requests 300 --rate 12 --replicas 2 --out "$work/run" \
  --chrome-trace > "$work/run.log"
cat > "$work/serve.py" <<'PY'
import http.server, sys
class Cors(http.server.SimpleHTTPRequestHandler):
    def end_headers(self):
        self.send_header("Access-Control-Allow-Origin", "https://ui.perfetto.dev")
        super().end_headers()
http.server.ThreadingHTTPServer(("127.0.0.1", 9001), Cors).serve_forever()
PY
(cd "$work/run" && exec python3 "$work/serve.py") > "$work/server.log" 2>&1 &
server_pid=$!
sleep 1
"$chromium" --headless --no-sandbox --no-first-run --hide-scrollbars \
  --virtual-time-budget=30000 --user-data-dir="$work/profile" --window-size=1600,1000 \
  --screenshot="$work/trace.png" \
  "https://ui.perfetto.dev/#!/?url=http://127.0.0.1:9001/chrome_trace.json" \
  2> "$work/chromium.log" || { tail -5 "$work/chromium.log" >&2; exit 1; }
[ -s "$work/trace.png" ] || { echo "error: no screenshot: Perfetto's UI (ui.perfetto.dev) needs network access" >&2; exit 1; }
mkdir -p "$repo/docs/img"
cp "$work/trace.png" "$repo/docs/img/chrome-trace.png"
echo "wrote $repo/docs/img/chrome-trace.png ($(wc -c < "$repo/docs/img/chrome-trace.png") bytes)"
