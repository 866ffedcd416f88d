#!/bin/bash
# Session 44: `cargo xtask bundle --only tests,python` of main at 8799c87 (kernels and committed
# PTX unchanged since 44695ea), call T1: every test binary (gpu_collective, gpu_distributed,
# gpu_gemm, gpu_ranks, gpu_smoke and the CPU ones; with the random shapes of gpu_gemm,
# gpu_distributed and gpu_ranks). About 7 minutes.
cd "$(dirname "$0")"
mkdir -p $OUT/r
pack() { tar -C $OUT -czf $OUT/r.tgz r; }
( while sleep 20; do pack; done ) & packer=$!
timeout 570 ./run-gpu-tests.sh > $OUT/r/tests-8799c87.log 2>&1; echo "run-gpu-tests rc=$? $SECONDS" >> $OUT/r/status
kill $packer; pack
