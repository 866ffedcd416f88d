#!/bin/bash
# Session 43 bundle of main (2138a9b; NOTES step 103), call D: the producer announcing a
# stage's bytes after its copies (kernels_gpu-arm.ptx, exp-2026-12-04-e7fb831-arm-after-loads.patch)
# against main's PTX under one binary: gpu_gemm with the new PTX, then the decode grid (1, 16
# and 128 tokens) and five controls, main and new alternately, twice. About 9 minutes.
cd "$(dirname "$0")"
gunzip -c kernels_gpu.ptx.gz > kernels_gpu.ptx
gunzip -c kernels_gpu-arm.ptx.gz > kernels_gpu-arm.ptx
source ./gpu-env.sh
mkdir -p $OUT/r
pack() { tar -C $OUT -czf $OUT/r.tgz r; }
DISTGEMM_PTX=$PWD/kernels_gpu-arm.ptx timeout 200 ./gpu_gemm --test-threads=1 > $OUT/r/tests-arm-gpu_gemm.log 2>&1; echo "gemm-arm rc=$? $SECONDS" >> $OUT/r/status
pack
for i in 1 2; do
  for side in main arm; do
    ptx=$PWD/kernels_gpu.ptx; [ $side = arm ] && ptx=$PWD/kernels_gpu-arm.ptx
    DISTGEMM_PTX=$ptx DISTGEMM_COMMIT=2138a9b-arm-$side-$i DISTGEMM_BENCH_RESULTS=$OUT/r/grid-$side-$i timeout 100 ./gemm --grid --filter m1 --rounds 2 --min-block-ms 30 --settle-ms 50 > $OUT/r/grid-$side-$i.log 2>&1; echo "grid-$side-$i rc=$? $SECONDS" >> $OUT/r/status
    DISTGEMM_PTX=$ptx DISTGEMM_COMMIT=2138a9b-arm-$side-$i DISTGEMM_BENCH_RESULTS=$OUT/r/ctl-$side-$i timeout 60 ./gemm --shape 16x4096x4096,64x6144x4096,128x5120x8192,2048x8192x4096,8192x8192x8192 --rounds 2 --min-block-ms 30 --settle-ms 50 > $OUT/r/ctl-$side-$i.log 2>&1; echo "ctl-$side-$i rc=$? $SECONDS" >> $OUT/r/status
    pack
  done
done
