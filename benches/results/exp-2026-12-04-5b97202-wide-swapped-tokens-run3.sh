#!/bin/bash
# Session 42 bundle, call 3 (NOTES step 101): the wide transposed tiles of 104-256 tokens
# beside the rule's pick on shapes whose rows sit just past a multiple of 128 (or of 2 x T),
# each shape with the two token counts that fit it, three rounds; about 5 minutes.
cd "$(dirname "$0")"
gunzip -c kernels_gpu.ptx.gz > kernels_gpu.ptx
source ./gpu-env.sh
COMMIT=5b97202-dirty-98-99-101
mkdir -p $OUT/r
pack() { tar -C $OUT -czf $OUT/r.tgz r; }
i=0
while read -r S V; do
  i=$((i + 1))
  DISTGEMM_COMMIT=$COMMIT DISTGEMM_BENCH_RESULTS=$OUT/r/wide-t-$i timeout 120 ./gemm --shape $S --variant $V --rounds 3 --min-block-ms 20 --settle-ms 50 > $OUT/r/wide-t-$i.log 2>&1; echo "wide-t-$i $S rc=$? $SECONDS" >> $OUT/r/status
  pack
done <<'GROUPS'
257x8192x7392,257x14784x8192 136x128t,160x128t
257x16384x3072,270x8192x8192 136x128t,160x128t
300x8192x4096,300x6144x8192 104x128t,160x128t
350x8192x8192 120x128t,176x128t
400x8192x7392 136x128t,200x128t
440x8192x4096 160x128t,224x128t
500x8192x8192 176x128t,256x128t
777x3584x3584 200x128t,224x128t
200x8192x8192 104x128t,200x128t
220x8192x4096 112x128t,224x128t
240x8192x8192 120x128t,256x128t
GROUPS
