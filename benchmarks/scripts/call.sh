#!/bin/bash
# The GPU calls' script: run on the device machine from the repository root, with the omegaconf wheel in .whl
# (carry [".whl"]). Each benchmark run writes to /tmp/b/<n>-<workload>; every result JSON and report comes back
# in one archive, $OUT/res.tgz, rewritten as each run ends; log.txt, machine.txt (GPU, CPU/NUMA layout, bytecode
# state), clock.jsonl (the host clock every 0.5 s) and gpu.csv (SM clock, power, clock-event reasons every 0.5 s,
# epoch seconds first) beside it. Edited in place from session 46 on: a results folder's NOTES entry names the
# commit its calls ran at (earlier sessions kept a copy each in benchmarks/results/session*/scripts/, from session 8).
# Directives: "0:@set NAME=VALUE" / "0:@unset NAME" for the runs after it ("@set PIN=0-3" runs each benchmark under
# taskset); "0:@cd DIR" runs the later ones from DIR (an older commit's tree unpacked beside this one, for an A/B of
# two versions of the product on one machine); @tests, @peak, @hooks, @arm, @child, @probe and @after run the CUDA
# tests and benchmarks.diagnostics. Environment: SKIPDIAG=1 skips the standby import timings, FRESHPYC=1 removes
# the children's bytecode folder first, IMPORTTIME=1 adds the standby's -X importtime sort. `timeout -k 10`: a
# Trainer catches SIGTERM.
# Usage: call.sh "<limit>:<workload> <args...>" | "<limit>:@tests" | "<limit>:@after <aftereffect args...>" | "<limit>:@peak <peakstack args...>" ...
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:. PYTHONUNBUFFERED=1
L=$OUT/log.txt; rm -rf /tmp/b; mkdir -p /tmp/err
[ -n "$FRESHPYC" ] && { ls -d /tmp/compile-callback-bytecode-* 2>/dev/null; rm -rf /tmp/compile-callback-bytecode-*; } > $OUT/freshpyc.txt 2>&1
{ nvidia-smi -L; lscpu; cat /sys/devices/system/node/online; cat /proc/self/status | grep -i cpus_allowed_list; nproc; uptime; echo cpu.max: $(cat /sys/fs/cgroup/cpu.max 2>&1); } > $OUT/machine.txt 2>&1
[ -z "$SKIPDIAG" ] && for i in 1; do /usr/bin/time -f "standby imports alone: %e s wall %U user %S sys" python3 -m compile_callback.background --standby $$ benchmarks.workloads recipes.gpt < /dev/null >> $OUT/machine.txt 2>&1; done
{ env | grep -E '^PYTHON'; python3 -c "import sys, os, glob, torch; d = os.path.dirname(torch.__file__); print('dont_write_bytecode', sys.flags.dont_write_bytecode, 'pycache_prefix', sys.pycache_prefix, 'torch dir writable', os.access(d, os.W_OK), 'dynamo .py', len(glob.glob(d + '/_dynamo/*.py')), '.pyc', len(glob.glob(d + '/_dynamo/__pycache__/*.pyc')))"
  [ -z "$SKIPDIAG" ] && for i in 1 2; do env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=/tmp/pyc-diag /usr/bin/time -f "standby imports, bytecode written to and read from PYTHONPYCACHEPREFIX=/tmp/pyc-diag (as the product's children, a folder of their own): %e s wall %U user %S sys" python3 -m compile_callback.background --standby $$ benchmarks.workloads recipes.gpt < /dev/null; done; } >> $OUT/machine.txt 2>&1
[ -n "$IMPORTTIME" ] && python3 -X importtime -m compile_callback.background --standby $$ benchmarks.workloads recipes.gpt < /dev/null 2> /tmp/err/importtime.txt && sort -t'|' -k2 -n -r /tmp/err/importtime.txt | head -60 > $OUT/importtime.txt
python3 -m benchmarks.diagnostics.hostclock run --out $OUT/clock.jsonl --interval 0.5 & CLOCK=$!
nvidia-smi --help-query-gpu | grep -i -E "reasons|clocks\.(sm|max)|power" > $OUT/smi-fields.txt 2>&1
Q=timestamp,clocks.sm,clocks.max.sm,power.draw,enforced.power.limit,temperature.gpu,utilization.gpu,clocks_event_reasons.active
nvidia-smi --query-gpu=$Q --format=csv,noheader,nounits > /dev/null 2>&1 || Q=timestamp,clocks.sm,clocks.max.sm,power.draw,temperature.gpu,utilization.gpu
echo "epoch,$Q" > $OUT/gpu.csv
( while :; do echo "$(date +%s.%N),$(nvidia-smi --query-gpu=$Q --format=csv,noheader,nounits 2>&1)"; sleep 0.5; done >> $OUT/gpu.csv ) & GPUMON=$!
n=0
for spec in "$@"; do
  n=$((n + 1))
  limit=${spec%%:*}; rest=${spec#*:}; workload=${rest%% *}; args=${rest#* }; [ "$args" = "$rest" ] && args=
  echo "== $workload ($limit s): $args" >> $L; t0=$(date +%s)
  case $workload in
    @set) export $args ;;
    @unset) unset $args ;;
    @cd) cd $args ;;
    @tests) timeout -k 10 $limit python3 -m pytest -p no:logging -p no:cacheprovider --tb=short -q -m cuda -o faulthandler_timeout=60 --durations=0 \
              ${args:-tests/test_cuda.py tests/test_host_syncs.py} > $OUT/tests.txt 2>&1; tail -5 $OUT/tests.txt >> $L ;;
    @peak) timeout -k 10 $limit python3 -m benchmarks.diagnostics.peakstack $args >> $OUT/peak.jsonl 2>/tmp/err/peak.txt
           tail -c 3000 /tmp/err/peak.txt > $OUT/peak-stderr-tail.txt ;;
    @hooks) timeout -k 10 $limit python3 -m benchmarks.diagnostics.hookcost $args >> $OUT/hooks.jsonl 2>/tmp/err/hooks.txt
            tail -c 3000 /tmp/err/hooks.txt > $OUT/hooks-stderr-tail.txt ;;
    @arm) timeout -k 10 $limit python3 -m benchmarks.diagnostics.eagerarm $args >> $OUT/arm.jsonl 2>/tmp/err/arm.txt
          tail -c 3000 /tmp/err/arm.txt > $OUT/arm-stderr-tail.txt ;;
    @child) timeout -k 10 $limit python3 -m benchmarks.diagnostics.child $args >> $OUT/child.jsonl 2>/tmp/err/child.txt
            tail -c 3000 /tmp/err/child.txt > $OUT/child-stderr-tail.txt ;;
    @probe) timeout -k 10 $limit python3 -m benchmarks.diagnostics.issueprobe $args >> $OUT/issue.jsonl 2>/tmp/err/probe.txt
            tail -c 3000 /tmp/err/probe.txt > $OUT/probe-stderr-tail.txt ;;
    @after) eval "timeout -k 10 $limit python3 -m benchmarks.diagnostics.aftereffect $args" >> $OUT/steps.jsonl 2>/tmp/err/after.txt
            tail -c 3000 /tmp/err/after.txt > $OUT/after-stderr-tail.txt ;;
    *) timeout -k 10 $limit ${PIN:+taskset -c $PIN} python3 -m benchmarks --workload $workload --out /tmp/b/$n-$workload $args 2>&1 | tr '\r' '\n' \
         | grep -E "^\[benchmarks\]|Error|error|Traceback|OOM|memory" | grep -v "it/s" >> $L ;;
  esac
  echo "$workload rc=${PIPESTATUS[0]} $(( $(date +%s) - t0 ))s" | tee -a $L
  [ -d /tmp/b ] && tar czf $OUT/res.tgz --exclude="*.ckpt" --exclude="*tfevents*" --exclude=caches -C /tmp/b . 2>/dev/null  # every run's results so far, kept as each ends
done
kill $CLOCK $GPUMON
[ -d /tmp/b ] && tar czf $OUT/res.tgz --exclude="*.ckpt" --exclude="*tfevents*" --exclude=caches -C /tmp/b . 2>/dev/null
python3 -m benchmarks.diagnostics.hostclock read $OUT/clock.jsonl /tmp/b/*/*.json 2>/dev/null | tee -a $L
grep -h "median\|telemetry\|in-fit\|re-pric\|repric\|peak" /tmp/b/*/*.md 2>/dev/null | grep -v "^|" | head -40
tail -40 $L; cat $OUT/machine.txt | tail -4; for f in peak hooks steps arm child issue; do [ -f $OUT/$f.jsonl ] && cut -c1-600 $OUT/$f.jsonl; done; true
