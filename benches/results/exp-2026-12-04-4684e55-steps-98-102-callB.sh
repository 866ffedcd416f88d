#!/bin/bash
# Session 43 bundle, call B: step 101's wide transposed tiles (each shape with the two token
# counts that fit it), then step 102's data-parallel heads (split configurations as extras on
# shapes whose last wave is short), each beside the rule's pick, three rounds. About 8 minutes.
cd "$(dirname "$0")"
gunzip -c kernels_gpu.ptx.gz > kernels_gpu.ptx
source ./gpu-env.sh
COMMIT=4684e55-dirty-98-99-101-102
mkdir -p $OUT/r
pack() { tar -C $OUT -czf $OUT/r.tgz r; }
i=0
while read -r TAG S V; do
  i=$((i + 1))
  DISTGEMM_COMMIT=$COMMIT DISTGEMM_BENCH_RESULTS=$OUT/r/$TAG-$i timeout 120 ./gemm --shape $S --variant $V --rounds 3 --min-block-ms 20 --settle-ms 50 > $OUT/r/$TAG-$i.log 2>&1; echo "$TAG-$i $S rc=$? $SECONDS" >> $OUT/r/status
  pack
done <<'GROUPS'
wide-t 257x8192x7392,257x14784x8192 136x128t,160x128t
wide-t 257x16384x3072,270x8192x8192 136x128t,160x128t
wide-t 300x8192x4096,300x6144x8192 104x128t,160x128t
wide-t 350x8192x8192 120x128t,176x128t
wide-t 400x8192x7392 136x128t,200x128t
wide-t 440x8192x4096 160x128t,224x128t
wide-t 500x8192x8192 176x128t,256x128t
wide-t 777x3584x3584 200x128t,224x128t
wide-t 200x8192x8192 104x128t,200x128t
wide-t 220x8192x4096 112x128t,224x128t
wide-t 240x8192x8192 120x128t,256x128t
head 2048x13312x16384,1024x13312x16384 128x256s,128x128s
head 3001x13312x16384,8192x13312x16384 128x256s
head 1500x3584x18944,1500x3584x14336 128x256s,128x144s,128x128s
head 777x3584x18944,777x3584x14336 128x128s,128x256s
head 6000x8192x14336,4096x28672x8192 128x256s
head 6000x5120x8192 128x160s,128x256s
head 16384x57344x8192,8192x28672x8192 128x256s
GROUPS
