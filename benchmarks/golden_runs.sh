#!/usr/bin/env bash
# Golden CLI runs: runs a fixed set of servesim commands into DIR and prints one sha256 per
# output file (CSV and JSON records, and the commands' terminal output with wall times
# removed). A change that must not alter results leaves this listing byte-identical:
#   bash benchmarks/golden_runs.sh runs/golden-before > before.txt   (on the old commit)
#   bash benchmarks/golden_runs.sh runs/golden-after > after.txt && diff before.txt after.txt
# Commands run inside OUT_DIR with relative --out paths, so the listing does not depend on
# where OUT_DIR is. SERVESIM overrides the command (e.g. "python -m sim.cli" for an old tree).
# Needs ../shared/traces beside the repository for the trace runs.
set -euo pipefail
out=${1:?usage: golden_runs.sh OUT_DIR}
repo=$(cd "$(dirname "$0")/.." && pwd)
traces=$(cd "${TRACES:-$repo/../shared/traces}" && pwd)
read -r -a servesim <<< "${SERVESIM:-servesim}"
rm -rf "$out" && mkdir -p "$out" && cd "$out"
conv=$traces/AzureLLMInferenceTrace_conv.csv
code=$traces/AzureLLMInferenceTrace_code.csv
moon=$traces/mooncake_conversation_trace.jsonl
n=0
go() {  # go NAME ARGS...: one servesim command, its stdout kept without wall times (nor
        # the progress lines a run longer than a few seconds prints on stderr)
  local name=$1; shift
  n=$((n + 1))
  "${servesim[@]}" "$@" 2>&1 \
    | sed -E '/^servesim: .* elapsed/d; s/in [0-9.]+ s/in X s/g; s/[0-9.]+ s wall/X s wall/g' \
    > "$name.stdout" || echo "exit $?" >> "$name.stdout"
}
go default run --out "default"
go conv run --trace "$conv" --out "conv"
go code-continuous run --trace "$code" --num-requests 2000 --policy continuous --out "code"
go static run --policy static --num-requests 300 --out "static"
go compare run --model llama-3.1-8b --gpu a100-40gb --trace "$conv" --num-requests 2000 \
  --time-scale 2 --max-tokens 2048 --max-model-len 8192 --out "compare" \
  --compare static,continuous,chunked,continuous:reserve,chunked:reserve,chunked:swap
go sysprompt-block run --scenario system-prompts --prefix-cache block --num-requests 500 --out "sysprompt"
go priority-swap run --queue priority --preemption-mode swap --num-gpu-blocks 600 \
  --max-model-len 8192 --num-requests 400 --rate 20 --out "prio"
go closed-loop run --concurrency 8 --think-time 1 --num-requests 300 --out "closed"
go tp70b run --model llama-3.1-70b --gpu h100-sxm --tensor-parallel-size 4 --num-requests 300 --out "tp"
go profile run --profile "$repo"/calibration/profiles/cpu-qwen2.5-0.5b.json --num-requests 100 --rate 0.5 --out "profile"
go steptime-full run --step-time 0.01 --full-steps --num-requests 200 --max-num-batched-tokens 256 --out "full"
go diagram diagram --scenario teaching
go sweep sweep --trace "$conv" --num-requests 500 --max-num-seqs 16,64 --rate 4,8 --seeds 0,1 --workers 1 --out "sweep"
go plan plan --trace "$conv" --model llama-3.1-8b --gpu h100-sxm --slo-ttft 2 --slo-tpot 0.1 \
  --target-rate 20 --num-requests 500 --seeds 0 --workers 1 --out "plan"
go moon-none run --trace "$moon" --prefix-cache none --out "moon-none"
go moon-block run --trace "$moon" --prefix-cache block --out "moon-block"
go moon-radix run --trace "$moon" --prefix-cache radix --out "moon-radix"
go cluster run --scenario multi-turn --prefix-cache radix --replicas 4 --router cache-aware \
  --num-requests 600 --out "cluster"
go cluster-approx run --trace "$conv" --num-requests 3000 --replicas 3 --router cache-aware-approx \
  --time-scale 3 --out "cluster-approx"
go cluster-rr run --trace "$conv" --num-requests 3000 --replicas 2 --router round-robin --out "cluster-rr"
# Wall times are the only figures allowed to differ between two runs of the same code.
sed -i -E 's/"elapsed_s": [0-9.e+-]+/"elapsed_s": X/' plan/plan.json
sed -i -E 's/Planned in [0-9.]+ s of wall time/Planned in X s of wall time/' plan/capacity.md
find . -type f \( -name '*.csv' -o -name '*.json' -o -name '*.stdout' -o -name '*.md' \) \
  ! -name 'sweep.json' | LC_ALL=C sort | xargs sha256sum
