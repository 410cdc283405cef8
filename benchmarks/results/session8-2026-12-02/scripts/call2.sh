#!/bin/bash
# Session 8 GPU call 2: issue 19's after-effect bisected on ResNet-18 CIFAR (eager windows between treatments, three
# processes, the host clock beside them); HF GPT-2 under the 15.3 GiB cap again without the in-fit A/B (call 1's
# fit died of an OOM); issue 20's BERT masked-LM encoder under the callback.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
L=$OUT/log.txt; E=/tmp/err; mkdir -p $E
python3 -m benchmarks.diagnostics.hostclock run --out $OUT/clock.jsonl --interval 0.5 & CLOCK=$!
diag() { local n=$1 limit=$2 steps=$3; t0=$(date +%s); echo "== diag $n: $steps" >> $L
  timeout $limit python3 -m benchmarks.diagnostics.aftereffect resnet18_cifar "$steps" >> $OUT/steps.jsonl 2>$E/diag$n.txt
  echo "diag $n rc=$? $(( $(date +%s) - t0 ))s" | tee -a $L; }
diag 1 100 'eager,whole_ro,eager,whole_ro,eager'
diag 2 140 'eager,cb:{"regions":"model","mode":"reduce-overhead","verify":false,"anatomy":false},eager,callback_no_anatomy,eager,callback,eager'
diag 3 90 'eager,@profile,eager,@pinned,eager,cb:{"anatomy":false,"verify":false},eager'
bench() { local limit=$1 workload=$2; shift 2; t0=$(date +%s); echo "== $workload: $*" >> $L
  timeout $limit python3 -m benchmarks --workload $workload --out /tmp/b/$workload "$@" > $E/$workload.txt 2>&1
  echo "$workload rc=$? $(( $(date +%s) - t0 ))s" | tee -a $L; grep "^\[benchmarks\]" $E/$workload.txt >> $L; }
bench 130 hf_gpt2 --variants callback --memory-cap-gb 15.3 --in-fit-ab 0
bench 110 hf_bert_mlm --variants callback
kill $CLOCK
mkdir -p $OUT/res; cp /tmp/b/*/*.json $OUT/res/ 2>/dev/null
tar czf $OUT/err.tgz -C /tmp err $(cd /tmp && ls b/*/*.md) 2>/dev/null
cut -c1-220 $OUT/steps.jsonl
grep -h "telemetry\|in-fit\|decisions\|^  - " /tmp/b/*/*.md | head -30
