# shellcheck shell=bash
# Shared by the SmolLM2 comparison scripts (entropy_runs.sh, length_runs.sh, replay_runs.sh): `arm NAME OVERRIDES...`
# trains one arm into $DEST/NAME with the script's $COMMON overrides, logs to $DEST/NAME.log and appends its exit code
# and the machine's load to $DEST/done.txt. Each SmolLM2 arm holds up to ~10 GB at 128 new tokens: two at a time on
# a 24 GB machine (a third process got the second arm killed by the OOM killer).
arm() {
  local name=$1
  shift
  .venv/bin/rlexp train "$@" "${COMMON[@]}" run_name="$name" hydra.run.dir="$DEST/$name" > "$DEST/$name.log" 2>&1
  echo "$name rc=$? load: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$DEST/done.txt"
}
