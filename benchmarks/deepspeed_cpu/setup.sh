#!/usr/bin/env bash
# A separate venv with DeepSpeed for the CPU probe (probe.py): DeepSpeed is not an rlexp dependency yet (its engine
# path is not built: conf/distributed/deepspeed_zero*.yaml). Its sdist builds without a compiler with DS_BUILD_OPS=0
# (ops are JIT-compiled only when used; the probe uses none). 12 s for deepspeed on the 2-core machine (torch from the
# local wheel directory).
#   bash benchmarks/deepspeed_cpu/setup.sh [venv_dir]
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=${1:-.venv-deepspeed}
TRANSFORMERS=$(.venv/bin/pip show transformers | awk '/^Version/{print $2}')
python3.11 -m venv "$VENV"
"$VENV/bin/pip" install -q torch==2.13.0 "transformers==$TRANSFORMERS" accelerate==1.15.0 setuptools wheel
DS_BUILD_OPS=0 "$VENV/bin/pip" install -q --no-build-isolation deepspeed==0.19.8
