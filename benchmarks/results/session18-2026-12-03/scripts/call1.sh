#!/bin/bash
# Session 18 call 1: held-input copies pinned vs pageable; ResNet-50's eager steps beside a child, with and
# without Lightning-like async steps and cuDNN's benchmark (NEXT item 1 of session 17).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
{ nvidia-smi -L; uptime; } > $OUT/machine.txt 2>&1
timeout 60 python3 -m benchmarks.diagnostics.holdcopy --copies 14 --mb 25 > $OUT/holdcopy.jsonl 2>$OUT/holdcopy-err.txt
timeout 60 python3 -m benchmarks.diagnostics.holdcopy --copies 32 --mb 25 --order pageable,pinned,pageable,pinned >> $OUT/holdcopy.jsonl 2>>$OUT/holdcopy-err.txt
cat $OUT/holdcopy.jsonl
for flags in "--async-steps --cudnn-benchmark" "--async-steps" "--cudnn-benchmark" "" ; do
  echo "== $flags"
  timeout 140 python3 -m benchmarks.diagnostics.child resnet50 --phases beside:10 --child-limit 110 $flags >> $OUT/child.jsonl 2>>$OUT/child-err.txt
  tail -1 $OUT/child.jsonl | cut -c1-1500
done
tail -c 2000 $OUT/child-err.txt
