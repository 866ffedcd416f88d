#!/bin/bash
# Session 44: the same bundle of main at 0620aac, call T2: the PyTorch package's GPU checks
# (python/run.sh: check_ops.py with its random shapes, then the TP MLP example; two ranks
# sharing the GPU).
cd "$(dirname "$0")"
mkdir -p $OUT/r
pack() { tar -C $OUT -czf $OUT/r.tgz r; }
( while sleep 20; do pack; done ) & packer=$!
timeout 570 ./python/run.sh > $OUT/r/tests-0620aac-python.log 2>&1; echo "python/run.sh rc=$? $SECONDS" >> $OUT/r/status
kill $packer; pack
