#!/usr/bin/env bash
# Nsight Compute kernel durations of `benches/gemm` shapes at boost and at base clocks, from a
# bundle made by `cargo xtask bundle`: the measurement of kernels-gpu/NOTES.md steps 50-52,
# where a kernel's base-clock time over its boost-clock time says whether it is bound by the
# SM clock (ratio ~1.28, the boost clock over ncu's base clock) or by memory (~1.0).
#
# For every shape and clock setting, ncu records `gpu__time_duration.sum` of every launch of
# our GEMM kernels and cuBLASLt's (its GEMM and split-K reduce kernels) while
# `benches/gemm --shape SHAPE [--variant VARIANTS]` runs 20 repetitions of each contender in one
# round, then one table per shape and clock gives each kernel's grid, launch count, median and
# minimum (µs). Usage:
#
#   ./run-ncu-durations.sh [--clocks boost,base] SHAPES [VARIANTS] [RESULTS_DIR]
#   ./run-ncu-durations.sh --summarize RESULTS_DIR
#
#   SHAPES       MxNxK[,MxNxK...], as `benches/gemm --shape`
#   VARIANTS     configuration names for `--variant` (NAME[,NAME...]), or "" for the rule's only
#   RESULTS_DIR  default: $OUT if set, else ./results
#   --clocks     which of ncu's clock settings to run: boost (`--clock-control none`) and/or
#                base (`--clock-control base`); default both
#   --summarize  only rebuild the tables from the raw ncu output already in RESULTS_DIR
#
# Writes RESULTS_DIR/ncu-<shape>-<clock>.txt (raw) and RESULTS_DIR/ncu-durations.md (tables,
# also printed). About 15-30 s per shape and clock on one H200.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
usage() { sed -n '2,24p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

clocks="boost,base"
summarize_only=0
positional=()
while [ $# -gt 0 ]; do
  case "$1" in
    --clocks)
      shift
      [ $# -gt 0 ] || { echo "run-ncu-durations.sh: --clocks needs boost, base or both" >&2; exit 2; }
      clocks="$1" ;;
    --summarize) summarize_only=1 ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "run-ncu-durations.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
    *) positional+=("$1") ;;
  esac
  shift
done

summarize() { # dir: one markdown table per raw file, into dir/ncu-durations.md and stdout
  python3 - "$1" <<'PY'
import collections, glob, os, re, statistics, sys
out = ["# Nsight Compute kernel durations (gpu__time_duration.sum), µs", ""]
launch = re.compile(r"^\s+(.*?) \((\d+), (\d+), (\d+)\)x\((\d+), (\d+), (\d+)\), Context")
metric = re.compile(r"gpu__time_duration\.sum\s+(\S+)\s+([\d.,]+)")
scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3,
         "s": 1e6, "second": 1e6}
files = sorted(glob.glob(os.path.join(sys.argv[1], "ncu-*-*.txt")))
if not files:
    sys.exit(f"run-ncu-durations.sh: no ncu-<shape>-<clock>.txt in {sys.argv[1]}")
for path in files:
    shape, clock = os.path.basename(path)[4:-4].rsplit("-", 1)
    times = collections.defaultdict(list)
    kernel = None
    for line in open(path, errors="replace"):
        m = launch.match(line)
        if m:
            name = re.sub(r"^void ", "", m.group(1))
            name = re.split(r"[<(]", name, maxsplit=1)[0]
            grid = "x".join(g for g in m.group(2, 3, 4))
            kernel = (name, grid)
            continue
        m = metric.search(line)
        if m and kernel and m.group(1) in scale:
            times[kernel].append(float(m.group(2).replace(",", "")) * scale[m.group(1)])
            kernel = None
    out += [f"## {shape}, {clock} clocks", "",
            "| kernel | grid | launches | median µs | min µs |", "|---|---|---:|---:|---:|"]
    for (name, grid), v in sorted(times.items()):
        out.append(f"| {name} | {grid} | {len(v)} | {statistics.median(v):.2f} | {min(v):.2f} |")
    if not times:
        out.append("| (no kernel recorded: see the raw file) | | | | |")
    out.append("")
text = "\n".join(out)
open(os.path.join(sys.argv[1], "ncu-durations.md"), "w").write(text + "\n")
print(text)
PY
}

if [ "$summarize_only" = 1 ]; then
  [ "${#positional[@]}" -le 1 ] || { usage >&2; exit 2; }
  summarize "${positional[0]:-${OUT:-$PWD/results}}"
  exit $?
fi
[ "${#positional[@]}" -ge 1 ] && [ "${#positional[@]}" -le 3 ] || { usage >&2; exit 2; }
shapes="${positional[0]}"
variants="${positional[1]:-}"
dir="${positional[2]:-${OUT:-$PWD/results}}"

source "$HERE/gpu-env.sh" || exit 1
ncu="$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -n 1)"
if [ -z "$ncu" ]; then
  echo "run-ncu-durations.sh: ncu not found (PATH or /usr/local/cuda*/bin)" >&2
  exit 2
fi
mkdir -p "$dir"
variant_args=()
[ -n "$variants" ] && variant_args=(--variant "$variants")
failed=0
IFS=',' read -r -a shape_list <<< "$shapes"
IFS=',' read -r -a clock_list <<< "$clocks"
for shape in "${shape_list[@]}"; do
  for clock in "${clock_list[@]}"; do
    case "$clock" in
      boost) control=none ;;
      base) control=base ;;
      *) echo "run-ncu-durations.sh: unknown clock setting '$clock' (boost or base)" >&2; exit 2 ;;
    esac
    raw="$dir/ncu-$shape-$clock.txt"
    echo "== $shape, $clock clocks"
    if ! timeout 300 "$ncu" --clock-control "$control" --metrics gpu__time_duration.sum \
        --kernel-name regex:'gemm_|nvjet|splitKreduce' \
        "$HERE/benches/gemm" --shape "$shape" "${variant_args[@]}" --reps 20 --rounds 1 \
        --min-block-ms 1 --settle-ms 1 > "$raw" 2>&1; then
      echo "run-ncu-durations.sh: ncu failed on $shape ($clock clocks); see $raw" >&2
      failed=1
    fi
  done
done
summarize "$dir" || failed=1
exit "$failed"
