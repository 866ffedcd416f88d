#!/usr/bin/env bash
# The project's test command (README, CI): format, lints, CPU tests, PTX build and PTX gates,
# a crate that depends on distgemm (host/tests/dependency.rs).
# Installs the pinned toolchain (rust-toolchain.toml) if missing; needs rustup and
# python3 + pip (check-ptx installs CUDA 13.0 ptxas/cuobjdump/nvdisasm wheels into
# target/cuda-tools on first use). No GPU needed: GPU tests skip themselves with a message.
# Every step runs even if an earlier one failed (except check-ptx, which needs build-ptx);
# the exit status is non-zero if any step failed. Logs: target/test-logs/.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/toolchain.sh
log_dir=target/test-logs
mkdir -p "$log_dir"
rm -f "$log_dir/cargo-test.log" "$log_dir/dependency-test.log"

results=()
failures=0
t0=$SECONDS
# step NAME COMMAND...: runs COMMAND, records ok/FAIL and its duration.
step() {
  local name="$1" start=$SECONDS rc=0
  shift
  echo
  echo "==> [$(date -u +%H:%M:%S)] $name"
  "$@" || rc=$?
  if [ $rc -eq 0 ]; then
    results+=("$(printf '%5ss  ok    %s' $((SECONDS - start)) "$name")")
  else
    results+=("$(printf '%5ss  FAIL  %s (exit %s)' $((SECONDS - start)) "$name" "$rc")")
    failures=$((failures + 1))
  fi
  return $rc
}
cargo_test() { cargo test --workspace 2>&1 | tee "$log_dir/cargo-test.log"; }
dependency_test() {
  cargo test -p distgemm --test dependency -- --ignored 2>&1 | tee "$log_dir/dependency-test.log"
}

step "cargo fmt --all --check" cargo fmt --all --check || true
step "cargo clippy --workspace --all-targets -- -D warnings" \
  cargo clippy --workspace --all-targets -- -D warnings || true
# The library alone (no `cli`, `baselines`, `diagnostics` or `testing` features) is what a
# tensor-parallel user builds: it must be lint- and doc-clean on its own.
step "cargo clippy -p distgemm --no-default-features -- -D warnings" \
  cargo clippy -p distgemm --no-default-features -- -D warnings || true
step "cargo doc -p distgemm --no-default-features --no-deps" \
  env RUSTDOCFLAGS="-D warnings" cargo doc -p distgemm --no-default-features --no-deps || true
step "cargo test --workspace" cargo_test || true
# check-ptx also fails unless the PTX contains .target sm_90a, wgmma.mma_async,
# cp.async.bulk.tensor and griddepcontrol (the instructions the GEMM kernels are built on).
if step "cargo xtask build-ptx" cargo xtask build-ptx; then
  step "cargo xtask check-ptx" cargo xtask check-ptx --no-build || true
else
  results+=("$(printf '%5s   skip  %s' - "cargo xtask check-ptx (build-ptx failed)")")
fi
# Crates that depend on distgemm by path get the kernels (host/tests/dependency.rs, #[ignore]d
# in the workspace run: about a minute cold). One depends on this checkout (the PTX build-ptx
# just wrote, else the committed one); one on a copy without target/ptx, which can only embed
# the committed host/ptx/kernels_gpu.ptx and says SKIPPED while there is none. Offline: the
# scratch crates reuse the workspace's Cargo.lock and the crates the steps above downloaded.
step "cargo test -p distgemm --test dependency -- --ignored" dependency_test || true
# The PyTorch package (python/, its own Cargo workspace): rustfmt and clippy on its crate, the
# abi3 wheel (maturin, in a venv under python/target), installed into a fresh venv, pytest.
step "python package: fmt, clippy, wheel, pytest (python/ci.sh)" python/ci.sh || true

echo
echo "==> summary"
for r in "${results[@]}"; do echo "  $r"; done
if [ -f "$log_dir/cargo-test.log" ]; then
  # The test runner's closing lines, totalled over every test binary.
  awk '/^test result:/ {
         n++; for (i = 2; i <= NF; i++) {
           if ($(i) ~ /^passed;?$/) p += $(i-1); if ($(i) ~ /^failed;?$/) f += $(i-1);
           if ($(i) ~ /^ignored;?$/) ig += $(i-1) } }
       END { if (n) printf "  cargo test: %d passed, %d failed, %d ignored in %d test binaries\n", p, f, ig, n }' \
    "$log_dir/cargo-test.log"
  skipped="$(grep -i 'skip' "$log_dir/cargo-test.log" | grep -i 'gpu' | grep -v '^test ' | sort -u || true)"
  if [ -n "$skipped" ]; then
    echo "  GPU tests skipped (no Hopper GPU here): $(wc -l <<<"$skipped"), e.g."
    head -n 3 <<<"$skipped" | cut -c1-110 | sed 's/^/    /'
  fi
fi
if [ -f "$log_dir/dependency-test.log" ] && grep -q '^SKIPPED' "$log_dir/dependency-test.log"; then
  grep '^SKIPPED' "$log_dir/dependency-test.log" | cut -c1-200 | sed 's/^/  /'
fi
if [ $failures -eq 0 ]; then
  echo "==> all checks passed in $((SECONDS - t0))s"
else
  echo "==> $failures step(s) FAILED after $((SECONDS - t0))s"
  exit 1
fi
