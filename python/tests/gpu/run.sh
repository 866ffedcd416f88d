#!/usr/bin/env bash
# The distgemm package's GPU checks on a machine with PyTorch (CUDA) and no network:
#
#   python/tests/gpu/run.sh [--quick] [WHEEL]
#
# Installs WHEEL (default: the newest distgemm-*.whl beside this script — the bundle's
# python/ folder — or in python/target/wheels/ of a repository checkout) into a throwaway
# folder on PYTHONPATH (no network, the system's torch untouched), then runs, under torchrun
# with 2 ranks (TP=2; both on GPU 0 with gloo when there is one GPU):
#   1. check_ops.py: every op, both dtypes, the presets and ragged shapes, bad inputs;
#   2. examples/torch_tp_mlp.py: the Llama MLP block against the unsharded computation.
# Exit status: non-zero if either fails. Set NPROC to change the number of ranks.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
quick=()
wheel=""
for arg in "$@"; do
  case "$arg" in
    --quick) quick=(--quick) ;;
    -h | --help) sed -n '2,13p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) wheel="$arg" ;;
  esac
done
if [ -z "$wheel" ]; then
  wheel="$(ls -t "$here"/distgemm-*.whl "$here"/../../target/wheels/distgemm-*.whl 2>/dev/null | head -n 1 || true)"
fi
if [ -z "$wheel" ] || [ ! -f "$wheel" ]; then
  echo "run.sh: no distgemm wheel found; build one with python/build-wheel.sh and pass its path" >&2
  exit 2
fi
example=""
for cand in "$here/torch_tp_mlp.py" "$here/../../../examples/torch_tp_mlp.py"; do
  [ -f "$cand" ] && example="$cand" && break
done

export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export DISTGEMM_TIMEOUT_S="${DISTGEMM_TIMEOUT_S:-20}"
nproc="${NPROC:-2}"
tmp="$(mktemp -d)"
site="$tmp/site"
# Installed into a private folder on PYTHONPATH (the system's torch stays as it is): by pip when
# it is there, else by unpacking the wheel, which is what installing a wheel amounts to.
if ! python3 -m pip install --quiet --no-index --no-deps --disable-pip-version-check \
  --target "$site" "$wheel" 2>"$tmp/pip.log"; then
  echo "run.sh: pip could not install the wheel ($(tail -n 1 "$tmp/pip.log")); unpacking it" >&2
  python3 -m zipfile -e "$wheel" "$site"
fi
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
cd "$tmp"  # outside any source tree: `import distgemm` is the installed wheel
echo "run.sh: $(basename "$wheel") in $site; $(python3 -c 'import torch, distgemm; print("torch", torch.__version__, "CUDA", torch.version.cuda, "| distgemm", distgemm.__version__, "from", distgemm.__file__)')"
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader || true

status=0
echo "==> check_ops.py (${nproc} ranks)"
python3 -m torch.distributed.run --standalone --nproc-per-node "$nproc" \
  "$here/check_ops.py" "${quick[@]}" || status=1
if [ -n "$example" ]; then
  echo "==> torch_tp_mlp.py (${nproc} ranks)"
  python3 -m torch.distributed.run --standalone --nproc-per-node "$nproc" \
    "$example" --check || status=1
else
  echo "run.sh: examples/torch_tp_mlp.py not found beside this script or in the checkout" >&2
  status=1
fi
rm -rf "$tmp"
exit $status
