#!/usr/bin/env bash
# One GPU session: the side-by-side comparisons (bounded by LIMIT seconds), then the TRL benchmark
# alone on the GPU; everything packed into $OUT/results.tar.gz (the device returns at most 8 files).
set -u
source benchmarks/device/env.sh >/dev/null 2>&1
python3 benchmarks/device/check_share.py 2>&1 | grep -E "autocast|SHARE|Error" | tee /tmp/share.txt
if grep -q SHARE_OK /tmp/share.txt; then export EXTRA="trainer.share_prompt_forward=true"; else export EXTRA="trainer.share_prompt_forward=false"; fi
echo "runs with $EXTRA"
LIMIT=${LIMIT:-330} bash benchmarks/device/comparisons.sh 2>&1 | grep -E "rc=|failed|Error" | tail -20
mkdir -p $OUT/bench $OUT/runs
if [ "${BENCH_LIMIT:-230}" != 0 ]; then
timeout ${BENCH_LIMIT:-230} python3 -m rlexp bench bench_setting=gpu rollout=hf_static +$EXTRA bench.steps=${BENCH_STEPS:-5} model.gguf_path=$HOME/smol.gguf \
  bench.out_dir=$OUT/bench hydra.run.dir=/tmp/bench > $OUT/bench/bench.log 2>&1; echo "bench rc=$?"
tail -25 $OUT/bench/bench.log
fi
cd $OUT && tar czf results.tar.gz runs bench && rm -rf runs bench
