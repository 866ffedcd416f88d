#!/usr/bin/env bash
# CI check of the Python package (no GPU, no torch): rustfmt and clippy on its Rust crate,
# then builds the wheel, installs it into a fresh virtual environment with pytest, and runs
# python/tests there (tests/gpu/ holds the torchrun checks for GPU machines: not collected).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python3}"
source "$here/../scripts/toolchain.sh"
cd "$here"  # where the repository's rust-toolchain.toml applies
export CARGO_TARGET_DIR="$here/target"
cargo fmt --manifest-path "$here/Cargo.toml" --check
cargo clippy --manifest-path "$here/Cargo.toml" --release --all-targets -- -D warnings
wheel="$("$here/build-wheel.sh" | tail -n 1)"
echo "python/ci.sh: built $wheel ($(du -h "$wheel" | cut -f1))"

venv="$here/target/test-venv"
rm -rf "$venv"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$wheel" "pytest>=7"
# From outside the source tree, so `import distgemm` is the installed wheel, not python/distgemm.
cd "$venv"
"$venv/bin/python" -m pytest -q -p no:cacheprovider "$here/tests"
