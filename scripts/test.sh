#!/usr/bin/env bash
# The project's test command (README, CI): format, lints, CPU tests, PTX build and PTX gates.
# Needs the pinned toolchain (rust-toolchain.toml; `rustup toolchain install` in the repo) and
# python3 + pip (check-ptx installs CUDA 13.0 ptxas/cuobjdump/nvdisasm wheels into
# target/cuda-tools on first use). No GPU needed: GPU tests skip themselves with a message.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
log_dir=target/test-logs
mkdir -p "$log_dir"

steps=()
current=""
step_start=0
t0=$SECONDS
begin() {
  current="$1"
  step_start=$SECONDS
  echo
  echo "==> [$(date -u +%H:%M:%S)] $current"
}
end() { steps+=("$(printf '%5ss  ok    %s' $((SECONDS - step_start)) "$current")"); current=""; }
summary() {
  local rc=$?
  echo
  echo "==> summary"
  local s
  for s in "${steps[@]+"${steps[@]}"}"; do echo "  $s"; done
  if [ -n "$current" ]; then
    printf '  %5ss  FAIL  %s\n' $((SECONDS - step_start)) "$current"
  fi
  if [ -f "$log_dir/cargo-test.log" ]; then
    # Closing lines of the test runner, totalled over every test binary.
    awk '/^test result:/ {
           n++; for (i = 1; i <= NF; i++) {
             if ($(i) ~ /^passed;?$/) p += $(i-1); if ($(i) ~ /^failed;?$/) f += $(i-1);
             if ($(i) ~ /^ignored;?$/) ig += $(i-1) } }
         END { if (n) printf "  cargo test: %d passed, %d failed, %d ignored in %d test binaries\n", p, f, ig, n }' \
      "$log_dir/cargo-test.log"
    local skips
    skips="$(grep -i 'skip' "$log_dir/cargo-test.log" | grep -i 'gpu' | grep -v '^test ' | sort -u | head -n 5 || true)"
    [ -z "$skips" ] || printf '  GPU tests skipped (no Hopper GPU here), e.g.:\n%s\n' "$(sed 's/^/    /' <<<"$skips")"
  fi
  if [ $rc -eq 0 ]; then
    echo "==> all checks passed in $((SECONDS - t0))s"
  else
    echo "==> FAILED (exit $rc) in step '$current' after $((SECONDS - t0))s"
  fi
}
trap summary EXIT

begin "cargo fmt --all --check"
cargo fmt --all --check
end

begin "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings
end

begin "cargo test --workspace"
cargo test --workspace 2>&1 | tee "$log_dir/cargo-test.log"
end

begin "cargo xtask build-ptx"
cargo xtask build-ptx
end

# check-ptx also fails unless the PTX contains .target sm_90a, wgmma.mma_async,
# cp.async.bulk.tensor and griddepcontrol.
begin "cargo xtask check-ptx"
cargo xtask check-ptx --no-build
end
