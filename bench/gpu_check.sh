#!/usr/bin/env bash
# The whole path on one GPU host, in under 5 minutes, ending in a summary table (docs/materialize.md,
# "The GPU check: bench/gpu_check.sh").
#
#   bench/gpu_check.sh                       # reports and logs under a fresh temp dir
#   OUT=/tmp/gpu-check bench/gpu_check.sh    # or under $OUT
#   REQUIRE_GPU=1 bench/gpu_check.sh         # exit 1 instead of 0 when no GPU is visible (CI on GPU runners)
#
# Steps (each under `timeout`, all under a 270 s deadline):
#   nccl-w1-materialize     NCCL at world 1 (device tensors), --budget-from-device, --materialize on cuda:0
#   nccl-w1-weights-launch  --budget-from-device with --weights-gib, the model and flags from a launch command
#   nccl-w1-spec-kimi       the same with the kimi-k3 preset and spec decoding (intermediate state too)
#   gloo-w4-shared-gpu      4 ranks sharing the GPU: gloo exchange, every pool materialised on cuda:0
#   gloo-w4-device-oom      4 ranks whose pools cannot all fit the GPU: a real out-of-memory, status error
#   derive-materialize-cuda every stage of pp 8 allocated on the GPU one at a time (single process)
#   sweep-cuda              the 145-budget sweep derived on the GPU, then 1,000,000 budgets
#   sweep-gloo-w4-cuda      a distributed sweep: 4 gloo ranks, each deriving its stage on the GPU
#   pytest-gpu              the test suite's GPU-marked tests
# A step passes when its exit code and report status are the expected ones (a verdict of "error" is
# the expected outcome of the OOM step). Without a visible GPU every step is skipped with the reason.
set -uo pipefail

cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
OUT="${OUT:-$(mktemp -d -t gpu-check.XXXXXX)}"
mkdir -p "$OUT"
DEADLINE_S="${DEADLINE_S:-270}"
START=$(date +%s)
QWEN=(--model-config tests/fixtures/qwen3_next_80b_a3b.json)
TORCHRUN=("$PY" -m torch.distributed.run --standalone)

rows=()
failures=0

gpu_name() {
    if command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -n 4
    else
        echo "no nvidia-smi on PATH"
    fi
}

report_status() {  # the "status" field of a JSON report, or "-"
    [[ -s "$1" ]] || { echo "-"; return; }
    "$PY" -c 'import json,sys; print(json.load(open(sys.argv[1])).get("status", "-"))' "$1" 2>/dev/null || echo "-"
}

# step NAME TIMEOUT_S EXPECTED_RC EXPECTED_STATUS REPORT -- COMMAND...
# EXPECTED_RC "any" ignores the exit code (torchrun turns every failure into 1: the report decides).
# EXPECTED_STATUS "STATUS~TEXT" also requires TEXT in the report (an error for the expected reason).
step() {
    local name=$1 limit=$2 want_rc=$3 want_status=$4 report=$5
    shift 6
    local left=$(( DEADLINE_S - ($(date +%s) - START) ))
    if (( left < 10 )); then
        rows+=("$name|-|skipped: past the ${DEADLINE_S}s deadline|0|SKIP")
        return
    fi
    (( limit > left )) && limit=$left
    local t0 rc status verdict want_text=""
    if [[ "$want_status" == *"~"* ]]; then
        want_text=${want_status#*~}; want_status=${want_status%%~*}
    fi
    t0=$(date +%s.%N)
    timeout --kill-after=5 "$limit" "$@" >"$OUT/$name.log" 2>&1
    rc=$?
    local secs
    secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    status="-"
    [[ "$report" != "-" ]] && status=$(report_status "$report")
    verdict=PASS
    if [[ $rc == 124 || $rc == 137 ]]; then
        verdict=FAIL; status="timeout after ${limit}s"
    elif [[ "$want_rc" != any && "$rc" != "$want_rc" ]]; then
        verdict=FAIL
    elif [[ "$want_status" != "-" && "$status" != "$want_status" ]]; then
        verdict=FAIL
    elif [[ -n "$want_text" ]] && ! grep -qF "$want_text" "$report"; then
        verdict=FAIL; status="$status, no '$want_text'"
    fi
    [[ $verdict == FAIL ]] && failures=$((failures + 1))
    rows+=("$name|$rc|$status|$secs|$verdict")
    echo "== $name: exit $rc, status $status, ${secs}s, $verdict (log: $OUT/$name.log)"
    [[ $verdict == FAIL ]] && tail -n 15 "$OUT/$name.log" | sed 's/^/   | /'
}

summary() {
    echo
    echo "gpu_check summary ($(date -u +%Y-%m-%dT%H:%M:%SZ), $(( $(date +%s) - START )) s in all)"
    echo "GPU: $(gpu_name | paste -sd ';' -)"
    printf '%-26s %-5s %-34s %-8s %s\n' step exit status seconds result
    printf '%-26s %-5s %-34s %-8s %s\n' ---- ---- ------ ------- ------
    local r
    for r in "${rows[@]}"; do
        IFS='|' read -r a b c d e <<<"$r"
        printf '%-26s %-5s %-34s %-8s %s\n' "$a" "$b" "$c" "$d" "$e"
    done
    echo "reports and logs: $OUT"
}

echo "gpu_check: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname)"
echo "GPU: $(gpu_name | paste -sd ';' -)"
"$PY" -c 'import torch; print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, "
          f"{torch.cuda.device_count()} device(s) visible")' 2>&1 | head -n 1

if ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    why="no CUDA GPU visible to torch (CPU-only build or no device)"
    echo "gpu_check: $why: skipping every GPU step"
    for name in nccl-w1-materialize nccl-w1-weights-launch nccl-w1-spec-kimi gloo-w4-shared-gpu gloo-w4-device-oom \
                derive-materialize-cuda sweep-cuda sweep-gloo-w4-cuda pytest-gpu; do
        rows+=("$name|-|skipped: no GPU|0|SKIP")
    done
    summary
    [[ "${REQUIRE_GPU:-0}" == 1 ]] && exit 1
    exit 0
fi

# Memory of GPU 0 in GiB, to size the deliberate out-of-memory step so it cannot fit.
GPU_GIB=$("$PY" -c 'import torch; print(int(torch.cuda.get_device_properties(0).total_memory / 2**30))')

step nccl-w1-materialize 60 0 consistent "$OUT/nccl-w1.json" -- \
    "${TORCHRUN[@]}" --nproc-per-node 1 -m checker check "${QWEN[@]}" --backend nccl --allow-single-rank \
    --budget-from-device --mem-fraction-static 0.85 --materialize --timeout-s 45 --report "$OUT/nccl-w1.json"

# The memory handed to sizing as the installed release computes it: free before and after 20 GiB of
# weights, --mem-fraction-static; the checker's own launch-command form.
step nccl-w1-weights-launch 60 0 consistent "$OUT/nccl-w1-weights.json" -- \
    "${TORCHRUN[@]}" --nproc-per-node 1 -m checker check --backend nccl --allow-single-rank \
    --budget-from-device --weights-gib 20 --timeout-s 45 --report "$OUT/nccl-w1-weights.json" -- \
    python -m sglang.launch_server --model-path tests/fixtures/launch-model --mem-fraction-static 0.85

step nccl-w1-spec-kimi 60 0 consistent "$OUT/nccl-w1-spec.json" -- \
    "${TORCHRUN[@]}" --nproc-per-node 1 -m checker check --model kimi-k3 --backend nccl --allow-single-rank \
    --budget-from-device --mem-fraction-static 0.85 --max-running-requests 64 --speculative-num-draft-tokens 4 \
    --materialize --timeout-s 45 --report "$OUT/nccl-w1-spec.json"

# 4 x 16 GiB budgets: each pool about 7.6 GiB on the one GPU, together far below its memory.
step gloo-w4-shared-gpu 60 0 consistent "$OUT/gloo-w4.json" -- \
    "${TORCHRUN[@]}" --nproc-per-node 4 -m checker check --model kimi-k3 --pp-size 4 --backend gloo \
    --budget-gib 16 --materialize --materialize-device cuda --timeout-s 45 --report "$OUT/gloo-w4.json"

# Each rank is promised the whole GPU: 4 pools of ~47% of it cannot all fit. Expect status error
# with the ranks that ran out of device memory named (torchrun itself exits 1).
step gloo-w4-device-oom 60 any "error~out of memory" "$OUT/gloo-w4-oom.json" -- \
    "${TORCHRUN[@]}" --nproc-per-node 4 -m checker check --model kimi-k3 --pp-size 4 --backend gloo \
    --budget-gib "$GPU_GIB" --materialize --materialize-device cuda --timeout-s 45 \
    --report "$OUT/gloo-w4-oom.json"

step derive-materialize-cuda 45 0 - - -- \
    "$PY" -m checker derive --model kimi-k3 --pp-size 8 --budget-gib 40 --materialize \
    --materialize-device cuda

step sweep-cuda 60 0 - - -- bash -c "
    '$PY' -m checker sweep --device cuda --report '$OUT/sweep-145.json' &&
    '$PY' -m checker sweep --device cuda --budgets 4:39.999964:0.000036 --no-progress"

step sweep-gloo-w4-cuda 60 0 - - -- \
    "${TORCHRUN[@]}" --nproc-per-node 4 -m checker sweep --backend gloo --device cuda --pp-size 4 \
    --timeout-s 45 --report "$OUT/sweep-gloo-w4.json"

if "$PY" -c 'import pytest' 2>/dev/null; then
    step pytest-gpu 90 0 - - -- "$PY" -m pytest tests -m gpu -q -p no:cacheprovider -p no:xdist
else
    rows+=("pytest-gpu|-|skipped: pytest not installed|0|SKIP")
fi

summary
(( failures == 0 ))
