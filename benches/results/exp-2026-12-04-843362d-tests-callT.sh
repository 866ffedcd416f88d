#!/bin/bash
# Session 44 bundle of main, call T: every GPU test binary at main's PTX (unchanged since
# 2138a9b): gpu_smoke and gpu_distributed built at 2138a9b, gpu_gemm at 843362d (each case set up
# once since 4684e55; 40 random shapes a dtype and 24 in FP8 on the rules' picks since 6156e50 and 843362d). About 6 minutes.
cd "$(dirname "$0")"
gunzip -c kernels_gpu.ptx.gz > kernels_gpu.ptx
source ./gpu-env.sh
mkdir -p $OUT/r
pack() { tar -C $OUT -czf $OUT/r.tgz r; }
for t in gpu_gemm gpu_smoke gpu_distributed; do
  timeout 330 ./$t --test-threads=1 > $OUT/r/tests-843362d-$t.log 2>&1; echo "$t rc=$? $SECONDS" >> $OUT/r/status
  pack
done
