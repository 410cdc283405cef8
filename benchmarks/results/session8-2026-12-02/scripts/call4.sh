#!/bin/bash
# Session 8 GPU call 4: after background compiles were priced into the payback rule and the anatomy made CPU-only by
# default: CUDA tests; the default GPT-2 recipe (1000 steps, cold); eager ResNet-18 before and after a default
# CompileCallback() fit and after profiler sessions, with the host clock beside them.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
L=$OUT/log.txt
step() { local name=$1 limit=$2; shift 2; echo "== $name: $*" >> $L; local t0=$(date +%s.%N)
  timeout $limit "$@" > /tmp/$name.txt 2>&1; local rc=$?; local t1=$(date +%s.%N)
  tr '\r' '\n' < /tmp/$name.txt | grep -v "it/s\|Warning\|warn(" | tail -60 >> $L
  echo "$name rc=$rc $(python3 -c "print(round($t1-$t0,1))")s" | tee -a $L; }
step cuda-tests 120 python3 -m pytest -p no:logging -p no:cacheprovider --tb=short -q -m cuda tests/test_cuda.py tests/test_host_syncs.py
step recipe-bg 130 python3 -m recipes configs/gpt2_124m.yaml run_dir=/tmp/rec
cp $(find /tmp/rec -name compile_report.json | head -1) $OUT/compile_report.json 2>/dev/null
python3 -m benchmarks.diagnostics.hostclock run --out $OUT/clock.jsonl --interval 0.5 & CLOCK=$!
timeout 80 python3 -m benchmarks.diagnostics.aftereffect resnet18_cifar 'eager,callback,eager,@profile,eager' > $OUT/steps.jsonl 2>/tmp/diag.txt
echo "diag rc=$?" | tee -a $L; kill $CLOCK
cut -c1-120 $OUT/steps.jsonl
grep -h "compile report\|speedup\|steps in\|prepared\|background" /tmp/recipe-bg.txt | cut -c1-300 | head -12
