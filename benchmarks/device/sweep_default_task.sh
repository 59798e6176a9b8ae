#!/usr/bin/env bash
# Issue 30's sweep (conf/sweep/default_task.yaml) on the GPU machine: the 18-trial grid, N_JOBS trials at a time
# (joblib launcher, one CPU thread each, fp32 weights with bf16 autocast as on the 2-core CPU), then the sweep's
# summary, trials table and every trial's metrics.jsonl to $OUT. A second call on the warm machine resumes the
# study (multirun/ is kept between calls). Call 3 of README.md's set-up: carry .carry/g2.
#   N_JOBS=6 LIMIT=480 bash benchmarks/device/sweep_default_task.sh
set -u
source benchmarks/device/env.sh >/dev/null
N_JOBS=${N_JOBS:-6}; LIMIT=${LIMIT:-480}
dir=multirun/sweeps/default_task
timeout "$LIMIT" python3 -m rlexp train -m +sweep=default_task hydra/launcher=joblib hydra.sweeper.n_jobs=$N_JOBS hydra.launcher.n_jobs=$N_JOBS \
  trainer.device=cuda trainer.num_threads=1 tracker=none trainer.progress=false model.gguf_path=$HOME/smol.gguf \
  > /tmp/sweep.log 2>&1
echo "sweep rc=$?"
grep -E "trial [0-9]+ (COMPLETE|FAIL)|Best trial|sweep default_task" /tmp/sweep.log | tail -30
cp "$dir"/summary.md "$dir"/trials.csv "$dir"/optimization_results.yaml "$OUT"/ 2>/dev/null
tar czf "$OUT/trials.tar.gz" "$dir"/*/metrics.jsonl "$dir"/*/config.yaml "$dir"/*/overrides.yaml 2>/dev/null
cp /tmp/sweep.log "$OUT"/
