#!/bin/bash
# Session 45: the same bundle (main at ba3ccd4), call T: every other test binary (gpu_gemm ran
# in call R): gpu_smoke, gpu_distributed (its bound checks now on GPU sums), gpu_ranks,
# gpu_collective and the CPU ones. About 5 minutes.
cd "$(dirname "$0")"
mkdir -p $OUT/r
pack() { tar -C $OUT -czf $OUT/r.tgz r; }
( while sleep 20; do pack; done ) & packer=$!
source ./gpu-env.sh
for bin in tests/*; do
  name=$(basename $bin)
  [ "$name" = gpu_gemm ] && continue
  start=$SECONDS
  timeout 300 ./$bin > $OUT/r/$name.log 2>&1
  echo "$name rc=$? $((SECONDS - start))s" >> $OUT/r/status
done
kill $packer; pack
