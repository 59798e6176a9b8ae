#!/usr/bin/env bash
# GPU benchmark session: check the decode loop (check_decode.py), then `rlexp bench` at the GPU setting
# with the loop engine if the check passed (else transformers generate), alone on the GPU.
# usage: SETTING=gpu STEPS=5 LIMIT=300 [DECODE_GRAPH=capture] bash benchmarks/device/session_bench.sh
set -u
source benchmarks/device/env.sh >/dev/null 2>&1
mkdir -p $OUT
ENGINE=${ENGINE:-}
if [ -z "$ENGINE" ]; then
  timeout ${CHECK_LIMIT:-200} python3 benchmarks/device/check_decode.py > $OUT/check_decode.log 2>&1
  grep -v Loading $OUT/check_decode.log | tail -15
  if grep -q DECODE_OK $OUT/check_decode.log; then ENGINE=loop; else ENGINE=generate; DECODE_GRAPH=compile; fi
fi
echo "bench with rollout.engine=$ENGINE rollout.decode_graph=${DECODE_GRAPH:-compile}"
timeout ${LIMIT:-300} python3 -m rlexp bench bench_setting=${SETTING:-gpu} rollout=hf_static rollout.engine=$ENGINE \
  rollout.decode_graph=${DECODE_GRAPH:-compile} bench.profile=${PROFILE:-true} \
  bench.steps=${STEPS:-5} model.gguf_path=$HOME/smol.gguf bench.out_dir=$OUT hydra.run.dir=/tmp/bench ${EXTRA_ARGS:-} \
  > $OUT/bench_${SETTING:-gpu}.log 2>&1; echo "bench rc=$?"
tail -30 $OUT/bench_${SETTING:-gpu}.log
