#!/bin/bash
# Session 42 bundle, call 3 (NOTES step 101): the wide transposed tiles of 136-256 tokens
# beside the rule's pick on shapes whose rows sit just past a multiple of 128 (or of 2 x T),
# three rounds, in two halves.
cd "$(dirname "$0")"
gunzip -c kernels_gpu.ptx.gz > kernels_gpu.ptx
source ./gpu-env.sh
COMMIT=5b97202-dirty-98-99-101
mkdir -p $OUT/r
pack() { tar -C $OUT -czf $OUT/r.tgz r; }
S1=257x8192x7392,257x14784x8192,257x16384x3072,270x8192x8192,300x8192x4096
S2=350x8192x8192,400x8192x7392,440x8192x4096,500x8192x8192,777x3584x3584
V=136x128t,160x128t,176x128t,200x128t,224x128t,256x128t
for s in 1 2; do
  eval SS=\$S$s
  DISTGEMM_COMMIT=$COMMIT DISTGEMM_BENCH_RESULTS=$OUT/r/wide-t-$s timeout 270 ./gemm --shape $SS --variant $V --rounds 3 --min-block-ms 20 --settle-ms 50 > $OUT/r/wide-t-$s.log 2>&1; echo "wide-t-$s rc=$? $SECONDS" >> $OUT/r/status
  pack
done
