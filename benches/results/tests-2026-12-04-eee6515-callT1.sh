#!/bin/bash
# Session 44 bundle of main at eee6515 (kernels and committed PTX unchanged since 44695ea), call T1:
# every GPU test binary (gpu_collective, gpu_distributed, gpu_gemm, gpu_ranks, gpu_smoke;
# with the random shapes of gpu_gemm and gpu_distributed). About 6-7 minutes.
cd "$(dirname "$0")"
gunzip -f kernels_gpu.ptx.gz tests/*.gz 2>/dev/null; chmod +x tests/*
mkdir -p $OUT/r
pack() { tar -C $OUT -czf $OUT/r.tgz r; }
( while sleep 20; do pack; done ) & packer=$!
timeout 570 ./run-gpu-tests.sh > $OUT/r/tests-eee6515.log 2>&1; echo "run-gpu-tests rc=$? $SECONDS" >> $OUT/r/status
kill $packer; pack
