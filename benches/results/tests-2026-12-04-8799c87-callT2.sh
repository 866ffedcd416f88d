#!/bin/bash
# Session 44: the same bundle of main at 8799c87, call T2: the PyTorch package's GPU checks
# (python/run.sh: check_ops.py with its random shapes, then the TP MLP example; two ranks
# sharing the GPU), then benches/gemm as split into modules at 81c773d (built at 8799c87; text moved, so
# its rows and file names should read as before) on two small shapes.
cd "$(dirname "$0")"
mkdir -p $OUT/r
pack() { tar -C $OUT -czf $OUT/r.tgz r; }
( while sleep 20; do pack; done ) & packer=$!
timeout 450 ./python/run.sh > $OUT/r/tests-8799c87-python.log 2>&1; echo "python/run.sh rc=$? $SECONDS" >> $OUT/r/status
source ./gpu-env.sh
DISTGEMM_COMMIT=8799c87 DISTGEMM_BENCH_RESULTS=$OUT/r timeout 100 ./benches/gemm --shape 2048x2048x2048,16x8192x8192 --variant 128x128 --rounds 2 --min-block-ms 20 --settle-ms 20 > $OUT/r/bench-8799c87.log 2>&1; echo "gemm bench rc=$? $SECONDS" >> $OUT/r/status
kill $packer; pack
