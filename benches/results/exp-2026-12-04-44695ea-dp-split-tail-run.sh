#!/bin/bash
# Session 43 bundle (44695ea + exp-2026-12-04-44695ea-dp-split-tail.patch, NOTES step 102):
# gpu_gemm whole (every split configuration on the two data-parallel-head cases, with grid
# caps and repeats), then the split configurations with a head beside the rule's pick on ten
# shapes whose last wave is short, three rounds; about 6 minutes.
cd "$(dirname "$0")"
gunzip -c kernels_gpu.ptx.gz > kernels_gpu.ptx
source ./gpu-env.sh
COMMIT=44695ea-dirty-dp-split-tail
mkdir -p $OUT/r
pack() { tar -C $OUT -czf $OUT/r.tgz r; }
timeout 330 ./gpu_gemm --test-threads=1 > $OUT/r/tests-gpu_gemm.log 2>&1; echo "gemm rc=$? $SECONDS" >> $OUT/r/status
pack
i=0
while read -r S V; do
  i=$((i + 1))
  DISTGEMM_COMMIT=$COMMIT DISTGEMM_BENCH_RESULTS=$OUT/r/head-$i timeout 150 ./gemm --shape $S --variant $V --rounds 3 --min-block-ms 20 --settle-ms 50 > $OUT/r/head-$i.log 2>&1; echo "head-$i $S rc=$? $SECONDS" >> $OUT/r/status
  pack
done <<'GROUPS'
2048x13312x16384,1024x13312x16384 128x256s,128x128s
3001x13312x16384,8192x13312x16384 128x256s
1500x3584x18944,1500x3584x14336 128x256s,128x144s,128x128s
777x3584x18944 128x128s,128x256s
6000x8192x14336,4096x28672x8192 128x256s
6000x5120x8192 128x160s,128x256s
GROUPS
