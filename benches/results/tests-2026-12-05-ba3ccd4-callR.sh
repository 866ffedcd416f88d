#!/bin/bash
# Session 45: `cargo xtask bundle --only cli,tests,python` of main at ba3ccd4, call R: the f64
# reference on the GPU (reference::gpu::products). 1) gpu_smoke's reference_products_* tests
# (bit for bit against the host's sums; tails, padded rows, two chunks); 2) `run --check`
# above the CPU cap, every element on the GPU: TP 1 bf16 / e4m3 row, a preset at 4096 tokens
# (how long the check takes), two ranks sharing the GPU (bf16 / e4m3 row); 3) gpu_gemm (every
# element against cuBLASLt and against the f64 reference). About 6 minutes.
cd "$(dirname "$0")"
mkdir -p $OUT/r
pack() { tar -C $OUT -czf $OUT/r.tgz r; }
( while sleep 20; do pack; done ) & packer=$!
timeout 150 ./run-gpu-tests.sh reference_products > $OUT/r/smoke-reference.log 2>&1; echo "reference_products rc=$? $SECONDS" >> $OUT/r/status
source ./gpu-env.sh
cli() { # name args...
  local name="$1"; shift
  local start=$SECONDS
  timeout 150 ./bin/distgemm "$@" > $OUT/r/cli-$name.log 2>&1
  echo "cli $name rc=$? $((SECONDS - start))s" >> $OUT/r/status
}
cli tp1-bf16 run --schedule ag-a --tp 1 --m 2048 --n 4096 --k 4096 --backend cuda --check --format json
cli tp1-e4m3 run --schedule ag-a --tp 1 --m 2048 --n 4096 --k 4096 --backend cuda --check --format json --dtype e4m3 --scales row
cli preset run --schedule ag-a --tp 1 --preset llama3-70b-fc1 --tokens 4096 --backend cuda --check
cli ranks-bf16 run --schedule rs-a --tp 2 --m 2048 --n 2048 --k 4096 --ranks 2 --share-gpu --check
cli ranks-e4m3 run --schedule rs-a --tp 2 --m 2048 --n 2048 --k 4096 --ranks 2 --share-gpu --check --dtype e4m3 --scales row
timeout 330 ./tests/gpu_gemm > $OUT/r/gpu_gemm.log 2>&1; echo "gpu_gemm rc=$? $SECONDS" >> $OUT/r/status
kill $packer; pack
