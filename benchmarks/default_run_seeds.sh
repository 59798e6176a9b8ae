#!/usr/bin/env bash
# Issue 30's acceptance run: the default `rlexp train` (nothing else on the command line but the seed) for seeds
# 0, 1, 2, one after the other on this machine, each under /usr/bin/time -v (wall time, peak RSS); then the table
# of held-out accuracy at step 0 and at the end (benchmarks/default_run_table.py) and the curves (rlexp compare).
#   bash benchmarks/default_run_seeds.sh [out_dir=results/learning/default_task]
set -u
out=${1:-results/learning/default_task}
work=${WORK:-/tmp/default_run_seeds}
mkdir -p "$work" "$out/runs"
for s in 0 1 2; do
  start=$(date +%s)
  /usr/bin/time -v rlexp train trainer.seed=$s hydra.run.dir=$work/seed$s trainer.progress=false > "$work/seed$s.log" 2>&1
  echo "seed $s rc=$? wall=$(( $(date +%s) - start ))s load: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$work/done.txt"
done
for s in 0 1 2; do
  mkdir -p "$out/runs/seed$s"
  cp "$work/seed$s"/{metrics.jsonl,config.yaml,overrides.yaml,summary.md,provenance.json} "$out/runs/seed$s/"
  cp "$work/seed$s.log" "$out/runs/seed$s/time.log"
done
python benchmarks/default_run_table.py "$out/runs" > "$out/README.md"
rlexp compare --runs "$out/runs" --group-by algorithm --last 5 --name default_run --out "$out" \
  --metrics eval/accuracy,accuracy,reward/format/mean,length/mean,length/truncated_frac,entropy/mean,time/step_s
