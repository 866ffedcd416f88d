#!/bin/bash
# Session 43 bundle (4684e55 + the step 102, 98, 99 and 101 patches; NOTES steps 98-102), call
# A: gpu_gemm whole (every new configuration and the split configurations' data-parallel
# heads in every case), then step 99's transposed tiles beside the rule's pick, three rounds.
# About 9 minutes.
cd "$(dirname "$0")"
gunzip -c kernels_gpu.ptx.gz > kernels_gpu.ptx
source ./gpu-env.sh
COMMIT=4684e55-dirty-98-99-101-102
mkdir -p $OUT/r
pack() { tar -C $OUT -czf $OUT/r.tgz r; }
timeout 420 ./gpu_gemm --test-threads=1 > $OUT/r/tests-gpu_gemm.log 2>&1; echo "gemm rc=$? $SECONDS" >> $OUT/r/status
pack
S=257x4608x3584,257x16384x3072,257x14784x8192,160x6144x8192,288x5120x8192,320x4096x8192,400x8192x7392
DISTGEMM_COMMIT=$COMMIT DISTGEMM_BENCH_RESULTS=$OUT/r/swapped timeout 150 ./gemm --shape $S --variant 80x128t,96x128t --rounds 3 --min-block-ms 20 --settle-ms 50 > $OUT/r/swapped.log 2>&1; echo "swapped rc=$? $SECONDS" >> $OUT/r/status
pack
