#!/bin/bash
# Session 7 GPU call 4: after the fixes (pinned non-blocking verification copies, cold-priced compiles, CUDA graphs only
# where they repay): CUDA tests, then the GPT-2 recipe cold and warm with the stall timers, then eager.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
L=$OUT/log.txt
step() { local name=$1 limit=$2; shift 2; echo "== $name: $*" >> $L; local t0=$(date +%s); timeout $limit "$@" 2>&1 | tr '\r' '\n' | grep -v "it/s" >> $L; echo "$name ${PIPESTATUS[0]} $(( $(date +%s) - t0 ))s" | tee -a $L; }
step cuda-tests 150 python3 -m pytest -p no:logging -p no:cacheprovider --tb=short -q -m cuda tests/test_cuda.py tests/test_host_syncs.py tests/benchmarks/test_smoke.py
TL=cold step cold 150 python3 .gpu/stallparts.py configs/gpt2_124m.yaml run_dir=/tmp/rec
TL=warm step warm 150 python3 .gpu/stallparts.py configs/gpt2_124m.yaml run_dir=/tmp/rec2
step eager 90 python3 -m recipes configs/gpt2_124m.yaml run_dir=/tmp/rec-eager callback_enabled=false
mkdir -p $OUT/reports; for d in rec rec2; do cp $(find /tmp/$d -name compile_report.json | head -1) $OUT/reports/$d.json 2>/dev/null; done
