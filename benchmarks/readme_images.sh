#!/usr/bin/env bash
# The README's report image (docs/img/report-conv.png), made afresh from today's report of
# the command the README's Report section shows:
#   servesim run --trace ../shared/traces/AzureLLMInferenceTrace_conv.csv --out runs/conv --report
# then a 1400 x 3200 px screenshot of the top of that report.html (the tables, the latency
# CDFs and the start of the step timeline) taken by headless Chromium, as the reader's
# browser draws it. Run it from anywhere after a change to what the report shows:
#   bash benchmarks/readme_images.sh
# config.json records the trace's absolute path; the copy of the page that is photographed
# shows it as the README writes it (../shared/traces/...), so the image names no machine.
# Needs chromium on PATH (apt-get install -y chromium) and ../shared/traces beside the
# repository (TRACES overrides it); pngquant, where installed, shrinks the image to 256
# colours. SERVESIM overrides the command (e.g. "python -m sim.app.cli").
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
traces=${TRACES:-../shared/traces}
read -r -a servesim <<< "${SERVESIM:-servesim}"
chromium=$(command -v chromium || command -v chromium-browser || command -v google-chrome) \
  || { echo "error: no chromium on PATH (apt-get install -y chromium)" >&2; exit 1; }
trace_file=AzureLLMInferenceTrace_conv.csv
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# the run directory is named conv, as in the README, so the report says "runs: conv"
"${servesim[@]}" run --trace "$traces/$trace_file" --out "$work/conv" \
  --report > "$work/run.log"
shown=$(sed -n 's/^  "trace": "\(.*\)",$/\1/p' "$work/conv/config.json")
sed "s|<td>$shown</td>|<td>../shared/traces/$trace_file</td>|" "$work/conv/report.html" \
  > "$work/report.html"
"$chromium" --headless --no-sandbox --disable-gpu --no-first-run --hide-scrollbars \
  --disable-background-networking --disable-component-update --disable-sync \
  --virtual-time-budget=15000 --user-data-dir="$work/profile" --window-size=1400,3200 \
  --screenshot="$work/report.png" "file://$work/report.html" 2> "$work/chromium.log" \
  || { tail -5 "$work/chromium.log" >&2; exit 1; }
if command -v pngquant > /dev/null; then
  pngquant --force --output "$work/report.png" 256 -- "$work/report.png"
fi
mkdir -p "$repo/docs/img"
cp "$work/report.png" "$repo/docs/img/report-conv.png"
echo "wrote $repo/docs/img/report-conv.png ($(wc -c < "$repo/docs/img/report-conv.png") bytes)"
