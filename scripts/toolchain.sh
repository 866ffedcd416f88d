#!/usr/bin/env bash
# Installs the pinned nightly and its components from rust-toolchain.toml (idempotent: a no-op
# when they are there). Sourced by the other scripts; needs rustup (https://rustup.rs).
export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH"
if ! command -v rustup >/dev/null 2>&1; then
  echo "distgemm: rustup is not installed (see https://rustup.rs)" >&2
  exit 1
fi
# rustup >= 1.28 installs the toolchain file's toolchain and components with
# `rustup toolchain install`; older rustup does it on `rustup show`.
if ! rustup toolchain install --no-self-update >/dev/null 2>&1; then
  rustup show >/dev/null
fi
