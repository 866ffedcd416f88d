#!/bin/bash
# Session 45: the same bundle (main at ba3ccd4), call P: the PyTorch package's GPU checks
# (python/run.sh: check_ops.py with its random shapes, then the TP MLP example). About 5 minutes.
cd "$(dirname "$0")"
mkdir -p $OUT/r
pack() { tar -C $OUT -czf $OUT/r.tgz r; }
( while sleep 20; do pack; done ) & packer=$!
timeout 450 ./python/run.sh > $OUT/r/python.log 2>&1; echo "python/run.sh rc=$? $SECONDS" >> $OUT/r/status
kill $packer; pack
