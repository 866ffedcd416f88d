# Sourced by run-gpu-tests.sh and run-gpu-matrix.sh (with HERE = the bundle folder): the
# environment of every GPU run — the bundle's PTX, NVLink SHARP/multicast off, GPU tests that
# fail rather than skip — and the folders of cuBLAS/cuBLASLt/NCCL (for the baselines) prepended
# to LD_LIBRARY_PATH; `lib_dirs` lists them.
# Sourced on its own, HERE is this file's folder.
HERE="${HERE:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}"
export DISTGEMM_PTX="$HERE/kernels_gpu.ptx"
export DISTGEMM_BUNDLE_DIR="$HERE"
[ -d "$HERE/peers" ] && export DISTGEMM_PEERS_DIR="$HERE/peers"
# No NVLink SHARP / multicast objects (not available to these jobs).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export RUST_BACKTRACE="${RUST_BACKTRACE:-1}"
# GPU tests fail instead of skipping when no usable Hopper GPU is found (set it to 0 to allow skips).
export DISTGEMM_REQUIRE_GPU="${DISTGEMM_REQUIRE_GPU:-1}"

# The bundle carries the PTX gzipped: unpacked here on first use.
if [ ! -f "$DISTGEMM_PTX" ] && [ -f "$DISTGEMM_PTX.gz" ]; then
  gunzip -c "$DISTGEMM_PTX.gz" > "$DISTGEMM_PTX.part" && mv "$DISTGEMM_PTX.part" "$DISTGEMM_PTX"
fi
if [ ! -f "$DISTGEMM_PTX" ]; then
  echo "gpu-env.sh: $DISTGEMM_PTX is missing: rebuild the bundle with 'cargo xtask bundle'" >&2
  return 1
fi

# ---- libraries for the baselines (cuBLAS, cuBLASLt, NCCL) and the GPU trace (CUPTI) ------
lib_dirs=()
has_libs() {
  local d="$1" f
  for f in "$d"/libcublas.so* "$d"/libcublasLt.so* "$d"/libnccl.so* "$d"/libcupti.so*; do
    [ -e "$f" ] && return 0
  done
  return 1
}
add_dir() {
  local d="$1" seen
  [ -d "$d" ] || return 0
  d="$(cd "$d" && pwd -P)"
  for seen in "${lib_dirs[@]+"${lib_dirs[@]}"}"; do [ "$seen" = "$d" ] && return 0; done
  has_libs "$d" && lib_dirs+=("$d")
  return 0
}
for base in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda /usr/local/cuda-*; do
  [ -n "$base" ] || continue
  add_dir "$base/lib64"
  add_dir "$base/lib"
  add_dir "$base/targets/x86_64-linux/lib"
  add_dir "$base/extras/CUPTI/lib64"
done
# pip wheels (e.g. those PyTorch depends on): site-packages/nvidia/<pkg>/lib
for py in python3 python; do
  command -v "$py" >/dev/null 2>&1 || continue
  while IFS= read -r d; do add_dir "$d"; done < <("$py" - 2>/dev/null <<'EOF'
import glob, os, site, sys
roots = []
try:
    import nvidia  # namespace package installed by the nvidia-* wheels
    roots += list(getattr(nvidia, "__path__", []))
except Exception:
    pass
sp = []
try:
    sp += site.getsitepackages()
except Exception:
    pass
try:
    sp.append(site.getusersitepackages())
except Exception:
    pass
sp += [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
roots += [os.path.join(p, "nvidia") for p in sp]
seen = set()
for r in roots:
    for d in sorted(glob.glob(os.path.join(r, "*", "lib")) + glob.glob(os.path.join(r, "*", "lib64"))):
        if d not in seen:
            seen.add(d)
            print(d)
EOF
  )
  break
done
for g in /usr/lib/python3*/site-packages/nvidia/*/lib /usr/local/lib/python3*/dist-packages/nvidia/*/lib \
         /usr/local/lib/python3*/site-packages/nvidia/*/lib "$HOME"/.local/lib/python3*/site-packages/nvidia/*/lib \
         /opt/conda/lib/python3*/site-packages/nvidia/*/lib; do
  add_dir "$g"
done
if [ ${#lib_dirs[@]} -gt 0 ]; then
  joined="$(IFS=:; echo "${lib_dirs[*]}")"
  export LD_LIBRARY_PATH="$joined${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

