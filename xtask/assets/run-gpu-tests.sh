#!/usr/bin/env bash
# Runs distgemm's GPU tests (and, on request, its benches) from a bundle made by
# `cargo xtask bundle`. Needs only an NVIDIA driver: no Rust, no CUDA toolkit, no network.
# cuBLAS/cuBLASLt/NCCL (used by baselines) are looked up in a CUDA toolkit or in the
# nvidia/*/lib folders of an installed PyTorch.
#
# Usage: ./run-gpu-tests.sh [--benches | --benches-only] [--list] [--sanitize TOOL] [FILTER] [-- ARGS...]
#   FILTER          run only tests (and benches) whose name contains FILTER (libtest filter)
#   --benches       also run the bench binaries (after the tests)
#   --benches-only  run only the bench binaries
#   --list          list the tests of every binary instead of running them
#   --sanitize TOOL run the test binaries under `compute-sanitizer --tool TOOL` (memcheck,
#                   racecheck, synccheck, initcheck); slow: combine with a FILTER. Errors in
#                   cuBLAS's nvjet kernels are counted apart and do not fail the run
#   -- ARGS...      extra arguments passed to every test/bench binary
# Exit status: 0 if every binary passed, 1 if any failed, 2 on bad usage.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
usage() { sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

filter=""
run_tests=1
run_benches=0
list=0
sanitizer=()
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --benches) run_benches=1 ;;
    --benches-only) run_benches=1; run_tests=0 ;;
    --list) list=1 ;;
    --sanitize)
      shift
      [ $# -gt 0 ] || { echo "run-gpu-tests.sh: --sanitize needs a tool name" >&2; exit 2; }
      tool_path="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n 1)"
      if [ -z "$tool_path" ]; then
        echo "run-gpu-tests.sh: compute-sanitizer not found (PATH or /usr/local/cuda*/bin)" >&2; exit 2
      fi
      # Every kernel runs instrumented (`--kernel-name-exclude` makes racecheck fail with an
      # internal error on driver 580); `judge_sanitized` then counts the errors in cuBLAS's
      # own kernels (`nvjet_*`, the baselines and some references), which are not ours to
      # check, apart from the rest.
      sanitizer=("$tool_path" --tool "$1") ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    -*) echo "run-gpu-tests.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
    *)
      if [ -n "$filter" ]; then
        echo "run-gpu-tests.sh: only one FILTER allowed (got '$filter' and '$1')" >&2; exit 2
      fi
      filter="$1" ;;
  esac
  shift
done

# Environment of every GPU run: PTX, NVLS off, baseline libraries (sets lib_dirs).
source "$HERE/gpu-env.sh" || exit 1

echo "== distgemm GPU bundle: $HERE"
[ -f "$HERE/MANIFEST.txt" ] && sed -n '2,3p' "$HERE/MANIFEST.txt"
echo "DISTGEMM_PTX=$DISTGEMM_PTX DISTGEMM_REQUIRE_GPU=$DISTGEMM_REQUIRE_GPU"
echo "NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST=$TORCH_SYMM_MEM_DISABLE_MULTICAST NVSHMEM_DISABLE_NVLS=$NVSHMEM_DISABLE_NVLS"
echo "library folders added to LD_LIBRARY_PATH: ${lib_dirs[*]:-(none)}"
for lib in libcublas.so libcublasLt.so libnccl.so; do
  where=""
  for d in "${lib_dirs[@]+"${lib_dirs[@]}"}"; do
    f="$(ls "$d/$lib"* 2>/dev/null | head -n 1)"
    if [ -n "$f" ]; then where="$f"; break; fi
  done
  if [ -z "$where" ] && command -v ldconfig >/dev/null 2>&1; then
    where="$(ldconfig -p 2>/dev/null | awk -v l="$lib" 'index($1, l) == 1 { print $NF; exit }')"
  fi
  echo "  $lib: ${where:-NOT FOUND (baselines that need it will report an error)}"
done

if command -v nvidia-smi >/dev/null 2>&1; then
  echo "== nvidia-smi"
  nvidia-smi || echo "(nvidia-smi failed: rc $?)"
  nvidia-smi topo -m 2>/dev/null || true
else
  echo "== nvidia-smi not found (is the NVIDIA driver installed?)"
fi

# ---- run --------------------------------------------------------------------------------
cd "$HERE" || exit 1
passed=()
failed=()
run_one() { # name command...
  local name="$1" rc start
  shift
  echo
  echo "== $name: $*"
  start=$SECONDS
  "$@"
  rc=$?
  if [ $rc -eq 0 ]; then
    passed+=("$name ($((SECONDS - start))s)")
  else
    failed+=("$name (exit $rc, $((SECONDS - start))s)")
  fi
}

# Under --sanitize: runs `name command...` with its output also in a file, and fails it if the
# test process failed or the sanitizer reported an error outside cuBLAS's `nvjet_*` kernels
# (an error report is a `========= ` line naming the error, the next lines where it happened).
judge_sanitized() { # name command...
  local name="$1" log rc counts
  shift
  log="$(mktemp)"
  "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  counts="$(awk '
    /========= (Error|Invalid|Race|Barrier|Uninitialized|Internal|Program hit)/ &&
      !/Target application (returned an error|terminated before first instrumented)/ {
      if (open) { if (text ~ /nvjet/) theirs++; else ours++ }
      open = 1; text = $0; left = 3; next
    }
    open && left > 0 { text = text " " $0; left--; if (left == 0) { if (text ~ /nvjet/) theirs++; else ours++; open = 0 } }
    END { if (open) { if (text ~ /nvjet/) theirs++; else ours++ } print ours + 0, theirs + 0 }
  ' "$log")"
  rm -f "$log"
  echo "== sanitizer errors in $name: ${counts% *} in our kernels, ${counts#* } in cuBLAS (nvjet, not ours)"
  [ $rc -eq 0 ] && [ "${counts% *}" -eq 0 ]
}

ran=0
if [ $run_tests -eq 1 ]; then
  for bin in "$HERE"/tests/*; do
    [ -f "$bin" ] && [ -x "$bin" ] || continue
    ran=$((ran + 1))
    if [ $list -eq 1 ]; then
      run_one "tests/$(basename "$bin")" "$bin" --list ${filter:+"$filter"} "${extra[@]+"${extra[@]}"}"
    elif [ ${#sanitizer[@]} -gt 0 ] && ! "$bin" --list ${filter:+"$filter"} 2>/dev/null | grep -q ': test$'; then
      # compute-sanitizer fails a process that never touches the GPU.
      echo "== tests/$(basename "$bin"): no test matches '${filter}', not sanitized"
      ran=$((ran - 1))
    else
      name="tests/$(basename "$bin")"
      if [ ${#sanitizer[@]} -gt 0 ]; then
        run_one "$name" judge_sanitized "$name" "${sanitizer[@]}" "$bin" --test-threads=1 --nocapture ${filter:+"$filter"} "${extra[@]+"${extra[@]}"}"
      else
        run_one "$name" "$bin" --test-threads=1 --nocapture ${filter:+"$filter"} "${extra[@]+"${extra[@]}"}"
      fi
    fi
  done
  [ $ran -eq 0 ] && echo "run-gpu-tests.sh: no test binaries in $HERE/tests"
fi
if [ $run_benches -eq 1 ]; then
  nb=0
  for bin in "$HERE"/benches/*; do
    [ -f "$bin" ] && [ -x "$bin" ] || continue
    nb=$((nb + 1))
    # Like `cargo bench -- FILTER`: the filter, then --bench.
    if [ $list -eq 1 ]; then
      run_one "benches/$(basename "$bin")" "$bin" --list ${filter:+"$filter"} "${extra[@]+"${extra[@]}"}"
    else
      run_one "benches/$(basename "$bin")" "$bin" ${filter:+"$filter"} --bench "${extra[@]+"${extra[@]}"}"
    fi
  done
  [ $nb -eq 0 ] && echo "run-gpu-tests.sh: no bench binaries in $HERE/benches"
  ran=$((ran + nb))
fi

echo
echo "== summary: ${#passed[@]} passed, ${#failed[@]} failed"
for p in "${passed[@]+"${passed[@]}"}"; do echo "  PASS $p"; done
for f in "${failed[@]+"${failed[@]}"}"; do echo "  FAIL $f"; done
if [ $ran -eq 0 ]; then
  echo "run-gpu-tests.sh: nothing was run" >&2
  exit 1
fi
[ ${#failed[@]} -eq 0 ] || exit 1
exit 0
