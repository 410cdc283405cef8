#!/bin/bash
# Session 9 GPU call 3: issue 19's after-effect after callback_pad on gpt2_varlen, bisected (eager windows
# between treatments: the callback fit, gc.freeze, dynamo reset; the host clock beside them); issue 20's
# BERT masked-LM: every tensor's error, compiled against eager and both against fp32; the CUDA tests.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
L=$OUT/log.txt; E=/tmp/err; mkdir -p $E
python3 -m benchmarks.diagnostics.hostclock run --out $OUT/clock.jsonl --interval 0.5 & CLOCK=$!
t0=$(date +%s); echo "== numerics hf_bert_mlm" >> $L
timeout 100 python3 -m benchmarks.diagnostics.numerics hf_bert_mlm --top 15 > $OUT/numerics.jsonl 2>$E/numerics.txt
echo "numerics rc=$? $(( $(date +%s) - t0 ))s" | tee -a $L
t0=$(date +%s); echo "== diag varlen" >> $L
timeout 280 python3 -m benchmarks.diagnostics.aftereffect gpt2_varlen 'eager,callback_pad,eager,@gcfreeze,eager,@reset,eager' \
  --eager-steps 192 >> $OUT/steps.jsonl 2>$E/diag.txt
echo "diag rc=$? $(( $(date +%s) - t0 ))s" | tee -a $L
kill $CLOCK
t0=$(date +%s); echo "== cuda-tests" >> $L
timeout 150 python3 -m pytest -p no:logging -p no:cacheprovider --tb=short -q -m cuda tests/test_cuda.py tests/test_host_syncs.py \
  2>&1 | tail -15 >> $L
echo "cuda-tests rc=${PIPESTATUS[0]} $(( $(date +%s) - t0 ))s" | tee -a $L
tail -c 3000 $E/diag.txt > $OUT/diag-stderr-tail.txt; tail -c 3000 $E/numerics.txt > $OUT/numerics-stderr-tail.txt
cut -c1-400 $OUT/numerics.jsonl | head -20
cut -c1-300 $OUT/steps.jsonl
