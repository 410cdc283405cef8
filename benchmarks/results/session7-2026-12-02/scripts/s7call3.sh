#!/bin/bash
# Session 7 GPU call 3: where the GPT-2 recipe's stall goes (host timers around verification's parts), cold then warm.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
L=$OUT/log.txt
step() { local name=$1 limit=$2; shift 2; echo "== $name: $*" >> $L; local t0=$(date +%s); timeout $limit "$@" 2>&1 | tr '\r' '\n' | grep -v "it/s" >> $L; echo "$name ${PIPESTATUS[0]} $(( $(date +%s) - t0 ))s" | tee -a $L; }
TL=cold step cold 150 python3 .gpu/stallparts.py configs/gpt2_124m.yaml run_dir=/tmp/rec
TL=warm step warm 150 python3 .gpu/stallparts.py configs/gpt2_124m.yaml run_dir=/tmp/rec2
