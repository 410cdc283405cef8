#!/bin/bash
# Session 7 GPU call 2: why the kept block plan (38.4 ms in its trial) ran 42.6 ms in the last 100 steps: an independent
# CUDA-event timeline of every batch, with and without the anatomy's profiler sessions; then host probes before/after
# single treatments in fresh processes (issue 19's after-effect: which treatment slows which kind of host work).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
L=$OUT/log.txt
step() { local name=$1 limit=$2; shift 2; echo "== $name: $*" >> $L; local t0=$(date +%s); timeout $limit "$@" 2>&1 | tr '\r' '\n' | grep -v "it/s" >> $L; echo "$name ${PIPESTATUS[0]} $(( $(date +%s) - t0 ))s" | tee -a $L; }
TL=cb step cb 150 python3 .gpu/timeline.py configs/gpt2_124m.yaml run_dir=/tmp/rec
TL=cb_noanat step cb_noanat 150 python3 .gpu/timeline.py configs/gpt2_124m.yaml run_dir=/tmp/rec_noanat callback.anatomy=false
tar czf $OUT/runs.tgz -C /tmp rec rec_noanat 2>/dev/null
for rep in 1 2; do for t in none prof30 inductor ro prof_cuda sleep; do
  timeout 60 python3 .gpu/hostprobe.py $t >> $OUT/hostprobe.jsonl 2>>$L; done; done
echo done | tee -a $L
