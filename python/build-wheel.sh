#!/usr/bin/env bash
# Builds the distgemm Python package's abi3 wheel (one wheel for CPython >= 3.9) into
# python/target/wheels/ and prints its path on the last line. With --install, also installs it
# (replacing an older one) into the environment of `python3` (or $PYTHON):
#
#   python/build-wheel.sh --install
#
# Needs the pinned Rust toolchain (scripts/toolchain.sh installs it), python3 >= 3.9 with
# venv + pip, and network to PyPI (maturin, first run only) and crates.io. maturin lives in a
# private venv under python/target/. The wheel embeds the kernels' PTX that the host crate's
# build script finds (target/ptx/kernels_gpu.ptx after `cargo xtask build-ptx`, else the
# committed copy).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
source "$root/scripts/toolchain.sh"
python="${PYTHON:-python3}"
install=0
for arg in "$@"; do
  case "$arg" in
    --install) install=1 ;;
    -h | --help) sed -n '2,13p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "build-wheel.sh: unknown argument $arg (known: --install)" >&2; exit 2 ;;
  esac
done

# Always this crate's own target dir, also when the caller exports CARGO_TARGET_DIR (the root
# workspace's artifacts differ: another lockfile and other features).
export CARGO_TARGET_DIR="$here/target"
tools="$here/target/build-venv"
if [ ! -x "$tools/bin/maturin" ]; then
  "$python" -m venv "$tools" >&2
  "$tools/bin/python" -m pip install --quiet --disable-pip-version-check "maturin>=1.9,<2" >&2
fi

wheels="$here/target/wheels"
rm -f "$wheels"/distgemm-*.whl
# maturin runs cargo in python/ (its own workspace, target dir python/target), with the
# repository's rust-toolchain.toml found in the parent directory.
(cd "$here" && "$tools/bin/maturin" build --release --out "$wheels" --interpreter "$python" >&2)
wheel="$(ls -t "$wheels"/distgemm-*.whl | head -n 1)"
if [ "$install" = 1 ]; then
  "$python" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps "$wheel" >&2
fi
echo "$wheel"
