#!/usr/bin/env bash
# compute-sanitizer (memcheck, synccheck, racecheck) on distgemm's distributed runs and
# collective tests, from a bundle made by `cargo xtask bundle`.
#
# Every pipelined schedule and two single-stage ones run TP = 2 at 512 x 768 x 528 with
# `distgemm run --check`: as two rank processes (`--ranks 2`, sharing GPU 0 when there is one
# GPU; `--target-processes all` instruments both), and, with two or more GPUs, also in one
# process (`--tp 2`); rs-a and rs-b also with pushed partials (`--rs-partials push`: the
# neighbour's copy-engine push and the kernel's wait before its first C load); ag-a and rs-a
# also in FP8 (e4m3, 512 x 768 x 512; ag-a with tensor-wise scales, rs-a with row-wise ones),
# all as two rank processes. Then every gpu_collective test under each tool. A run fails on any
# sanitizer error (`--error-exitcode`) or a failed check. Usage:
#
#   ./run-sanitizers.sh [RESULTS_DIR]     (default: $OUT if set, else ./results)
#
# Writes the full output to RESULTS_DIR/sanitizers.log and one line per run to stdout; exit
# status 0 only if every run was clean. About 2 minutes on one H200.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/gpu-env.sh" || exit 1
dir="${1:-${OUT:-$PWD/results}}"
mkdir -p "$dir"
log="$dir/sanitizers.log"
cs="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n 1)"
if [ -z "$cs" ]; then
  echo "run-sanitizers.sh: compute-sanitizer not found (PATH or /usr/local/cuda*/bin)" >&2
  exit 2
fi
gpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')"
export DISTGEMM_ALLOW_SHARED_GPU=1
echo "# compute-sanitizer: $("$cs" --version | tail -n 1); $gpus GPU(s); $(date -u +%FT%TZ); $(sed -n 2p "$HERE/MANIFEST.txt" 2>/dev/null)" > "$log"

failed=0
runs=0
run() { # label command...
  local label="$1" rc
  shift
  echo "== $label" | tee -a "$log"
  timeout 120 "$@" >> "$log" 2>&1
  rc=$?
  runs=$((runs + 1))
  echo "rc=$rc" | tee -a "$log"
  [ $rc -eq 0 ] || failed=$((failed + 1))
}

shape=(--tp 2 --m 512 --n 768 --k 528 --check --timeout-ms 30000)
# FP8: K and K/TP multiples of 16.
fp8_shape=(--tp 2 --m 512 --n 768 --k 512 --dtype e4m3 --check --timeout-ms 30000)
share=()
[ "$gpus" -lt 2 ] && share=(--share-gpu)
for tool in memcheck synccheck racecheck; do
  for s in "ag-a tensor" "rs-a row"; do
    read -r sched scales <<< "$s"
    run "$tool $sched e4m3 ($scales scales) TP=2, two rank processes" "$cs" --tool "$tool" \
      --target-processes all --error-exitcode 9 "$HERE/bin/distgemm" run --schedule "$sched" \
      "${fp8_shape[@]}" --scales "$scales" --ranks 2 "${share[@]}"
  done
  for s in ag-a ag-b rs-a rs-b ag-a-single rs-b-single; do
    run "$tool $s TP=2, two rank processes" "$cs" --tool "$tool" --target-processes all \
      --error-exitcode 9 "$HERE/bin/distgemm" run --schedule "$s" "${shape[@]}" --ranks 2 "${share[@]}"
    if [ "$gpus" -ge 2 ]; then
      run "$tool $s TP=2, one process" "$cs" --tool "$tool" --error-exitcode 9 \
        "$HERE/bin/distgemm" run --schedule "$s" "${shape[@]}" --backend cuda
    fi
  done
  for s in rs-a rs-b; do
    run "$tool $s pushed partials TP=2, two rank processes" "$cs" --tool "$tool" \
      --target-processes all --error-exitcode 9 "$HERE/bin/distgemm" run --schedule "$s" \
      "${shape[@]}" --rs-partials push --ranks 2 "${share[@]}"
  done
  run "$tool gpu_collective" "$cs" --tool "$tool" --error-exitcode 9 \
    "$HERE/tests/gpu_collective" --test-threads=1
done
# The GEMM kernel alone on the decode cases with every configuration (split-K hand-offs,
# the 16-row tiles whose wgmmas read past their A slot): out-of-bounds and misaligned
# accesses, global and shared.
run "memcheck gpu_gemm decode shapes, every configuration" "$cs" --tool memcheck \
  --error-exitcode 9 "$HERE/tests/gpu_gemm" --test-threads=1 decode_shapes_bf16
echo "== sanitizers: $runs runs, $failed failed (log: $log)"
[ $failed -eq 0 ]
