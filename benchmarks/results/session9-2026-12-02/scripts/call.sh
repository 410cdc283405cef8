#!/bin/bash
# Session 9 GPU calls: benchmark runs with the host clock beside them; long runs so that re-pricing (issue 20) has rounds.
# Usage: call.sh "<workload> <variants...> [-- extra args]" ... ; each spec runs with a time limit of its own.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
L=$OUT/log.txt
python3 -m benchmarks.diagnostics.hostclock run --out $OUT/clock.jsonl --interval 0.5 & CLOCK=$!
for spec in "$@"; do
  limit=${spec%%:*}; rest=${spec#*:}; workload=${rest%% *}; args=${rest#* }
  echo "== $workload ($limit s): $args" >> $L; t0=$(date +%s)
  timeout $limit python3 -m benchmarks --workload $workload --out /tmp/b/$workload $args 2>&1 | tr '\r' '\n' \
    | grep -E "^\[benchmarks\]|Error|error|Traceback|OOM|memory" | grep -v "it/s" >> $L
  echo "$workload rc=${PIPESTATUS[0]} $(( $(date +%s) - t0 ))s" | tee -a $L
done
kill $CLOCK
mkdir -p $OUT/res; cp /tmp/b/*/*.json $OUT/res/ 2>/dev/null
tar czf $OUT/md.tgz -C /tmp/b $(cd /tmp/b && ls */*.md) 2>/dev/null
python3 -m benchmarks.diagnostics.hostclock read $OUT/clock.jsonl /tmp/b/*/*.json | tee -a $L
grep -h "median\|telemetry\|in-fit\|re-pric\|repric" /tmp/b/*/*.md | grep -v "^|" | head -40
