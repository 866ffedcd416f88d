#!/usr/bin/env bash
# The main job on a fresh machine: installs the pinned toolchain, builds the PTX and the
# `distgemm` CLI (release), then runs it with the given arguments, e.g.
#   ./scripts/run.sh run --schedule ag-a --tp 4 --m 512 --n 512 --k 512 --check
# Without Hopper GPUs `--backend auto` (the default) runs the CPU executor and says so.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/toolchain.sh
cargo xtask build-ptx >&2
cargo build --release --quiet --bin distgemm
exec target/release/distgemm "$@"
