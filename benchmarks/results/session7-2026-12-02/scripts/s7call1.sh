#!/bin/bash
# Next session GPU call 1: CUDA tests; the default GPT-2 recipe (1000 steps) with the payback order (read plan.candidates:
# does the blocks' share now read above ~0.30 and the blocks go first?), then eager; stall_s and 1000-step wall against eager
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
L=$OUT/log.txt
step() { local name=$1 limit=$2; shift 2; echo "== $name: $*" >> $L; local t0=$(date +%s); timeout $limit "$@" 2>&1 | tr '\r' '\n' | grep -v "it/s" >> $L; echo "$name ${PIPESTATUS[0]} $(( $(date +%s) - t0 ))s" | tee -a $L; }
step cuda-tests 170 python3 -m pytest -p no:logging -p no:cacheprovider --tb=short -q -m cuda tests/test_cuda.py tests/test_host_syncs.py tests/benchmarks/test_smoke.py
step recipe-callback 200 python3 -m recipes configs/gpt2_124m.yaml run_dir=/tmp/rec
mkdir -p $OUT/recipe && cp $(find /tmp/rec -name 'compile_report.json' | head -1) $OUT/recipe/ 2>/dev/null
step recipe-eager 90 python3 -m recipes configs/gpt2_124m.yaml run_dir=/tmp/rec-eager callback_enabled=false
