#!/usr/bin/env bash
# The whole GPU check-and-bench matrix of a bundle in one call (what a lease should spend its
# device time on): every test binary, the PyTorch package's torchrun checks, then the GEMM
# benchmark (stage shapes with every tile
# configuration, then every shape), the distributed benchmark table (a)-(f), the token
# sweep and the NVLink power-state probe, with `nvidia-smi dmon` (power, clocks) logged
# alongside. Results (JSON + markdown)
# and logs go to RESULTS_DIR (default: $OUT if set, else ./results). Each step has its own
# time limit, so one stuck step cannot eat the lease; the short table of every step is
# printed at the end.
#
# With --pack, everything ends up in RESULTS_DIR/matrix.tar.gz (for transfers that return
# only a few files).
#
# With --steps LIST (comma-separated: tests, python, sanitize, gemm-variants, gemm-all,
# gemm-grid, distgemm, distgemm-sweep, nvlink-states) only those steps run, e.g. to split the matrix over
# several calls (a device call lasts at most 10 minutes): the tests took ~8 minutes on one
# H200 (gpu_ranks' schedules section alone 400 s), the distgemm table ~8 minutes (1 s of
# settling per block), python ~1 minute, sanitize (run-sanitizers.sh) ~2. gemm-grid (the
# decode and prefill shapes of three models, `benches/gemm --grid`) runs only when listed.
#
# Usage: ./run-gpu-matrix.sh [--tp N] [--skip-tests] [--steps LIST] [--quick] [--pack] [RESULTS_DIR]
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
tp=""
skip_tests=0
steps="tests,python,sanitize,gemm-variants,gemm-all,distgemm,distgemm-sweep,nvlink-states"
pack=0
quick=()
dir=""
while [ $# -gt 0 ]; do
  case "$1" in
    --tp) shift; tp="${1:?--tp needs a number}" ;;
    --skip-tests) skip_tests=1 ;;
    --steps) shift; steps="${1:?--steps needs a list}" ;;
    --quick) quick=(--quick) ;;
    --pack) pack=1 ;;
    -h|--help) sed -n '2,18p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "run-gpu-matrix.sh: unknown option $1" >&2; exit 2 ;;
    *) dir="$1" ;;
  esac
  shift
done
dir="${dir:-${OUT:-$PWD/results}}"
mkdir -p "$dir"
export DISTGEMM_BENCH_RESULTS="$dir"
source "$HERE/gpu-env.sh" || exit 1
echo "baseline library folders: ${lib_dirs[*]:-(none)}"

# Power draw and clocks once a second for the whole matrix (throttling shows up here).
dmon_pid=""
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi dmon -s pc -d 1 > "$dir/dmon.log" 2>&1 &
  dmon_pid=$!
fi

summary=()
step() { # name seconds command...
  local name="$1" limit="$2" start=$SECONDS rc
  shift 2
  case ",$steps," in *",$name,"*) ;; *) return 0 ;; esac
  echo "== $name (limit ${limit}s)"
  timeout "$limit" "$@" > "$dir/$name.log" 2>&1
  rc=$?
  summary+=("$(printf '%5ss  exit %-3s %s' $((SECONDS - start)) "$rc" "$name")")
  return $rc
}

if [ $skip_tests -eq 0 ]; then
  step tests 590 "$HERE/run-gpu-tests.sh"
  [ -f "$dir/tests.log" ] && grep -E "^  (PASS|FAIL)" "$dir/tests.log"
  step python 300 "$HERE/python/run.sh"
  [ -f "$dir/python.log" ] && grep -E "^check_ops:|^torch_tp_mlp:.*PASS|FAIL" "$dir/python.log"
  step sanitize 400 "$HERE/run-sanitizers.sh" "$dir"
  [ -f "$dir/sanitize.log" ] && grep -E "^== sanitizers:" "$dir/sanitize.log"
fi

step gemm-variants 150 "$HERE/benches/gemm" --quick --variants --reps 20
step gemm-all 300 "$HERE/benches/gemm" --reps 20 "${quick[@]+"${quick[@]}"}"
step gemm-grid 540 "$HERE/benches/gemm" --grid
step distgemm 590 "$HERE/benches/distgemm" ${tp:+--tp "$tp"} "${quick[@]+"${quick[@]}"}"
step distgemm-sweep 300 "$HERE/benches/distgemm" ${tp:+--tp "$tp"} --sweep --no-torch
step nvlink-states 60 "$HERE/benches/nvlink_states"

[ -n "$dmon_pid" ] && kill "$dmon_pid" 2>/dev/null
echo
echo "== matrix summary (logs and results in $dir)"
for s in "${summary[@]}"; do echo "  $s"; done
grep -h -A1 "geometric mean" "$dir"/gemm-*.log 2>/dev/null
grep -h "^- llama" "$dir/distgemm.log" 2>/dev/null
if [ $pack -eq 1 ]; then
  packed="$(mktemp)"
  tar -czf "$packed" -C "$dir" . && rm -rf "${dir:?}"/* && mv "$packed" "$dir/matrix.tar.gz"
  echo "packed into $dir/matrix.tar.gz"
fi
