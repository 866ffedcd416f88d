#!/bin/bash
# Session 43 bundle, call C (NOTES step 98): step 98's six widths beside the rule's pick on the fifteen shapes
# the area model's guessed costs favour most, three rounds, in two halves.
cd "$(dirname "$0")"
gunzip -c kernels_gpu.ptx.gz > kernels_gpu.ptx
source ./gpu-env.sh
COMMIT=4684e55-dirty-98-99-101-102
mkdir -p $OUT/r
pack() { tar -C $OUT -czf $OUT/r.tgz r; }
S1=400x3584x3584,257x4608x3584,600x2560x8192,777x6144x4096,257x14784x8192,1500x3584x3584,2200x2304x16384,777x3072x8192
S2=777x3584x3584,600x5120x8192,777x3584x14336,400x13312x16384,777x4096x4096,600x6144x4096,1500x2560x8192,2048x13312x16384,512x13312x16384
V=128x112,128x168,128x176,128x200,128x208,128x240
for s in 1 2; do
  eval SS=\$S$s
  DISTGEMM_COMMIT=$COMMIT DISTGEMM_BENCH_RESULTS=$OUT/r/widths-$s timeout 270 ./gemm --shape $SS --variant $V --rounds 3 --min-block-ms 20 --settle-ms 50 > $OUT/r/widths-$s.log 2>&1; echo "widths-$s rc=$? $SECONDS" >> $OUT/r/status
  pack
done
