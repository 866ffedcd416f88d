#!/bin/bash
# Session 43 bundle of main (2138a9b), call T: every GPU test binary at main's PTX (gpu_smoke,
# gpu_distributed, gpu_gemm, the last since 4684e55 setting each case up once). About 5 minutes.
cd "$(dirname "$0")"
gunzip -c kernels_gpu.ptx.gz > kernels_gpu.ptx
source ./gpu-env.sh
mkdir -p $OUT/r
pack() { tar -C $OUT -czf $OUT/r.tgz r; }
for t in gpu_smoke gpu_distributed gpu_gemm; do
  timeout 200 ./$t --test-threads=1 > $OUT/r/tests-2138a9b-$t.log 2>&1; echo "$t rc=$? $SECONDS" >> $OUT/r/status
  pack
done
