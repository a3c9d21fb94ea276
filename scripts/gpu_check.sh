#!/usr/bin/env bash
# GPU check of the torch backend (issue: real models): LoRA GRPO through the policy server on one GPU.
#
#   scripts/gpu_check.sh [--steps N] [--size 0.5b|tiny] [--device cuda|cpu]
#
# A randomly initialised Llama-shaped model of ~0.44 B parameters is built from a config (no download: the GPU
# machine has no network), then 5 LoRA GRPO steps run through runners -> LLM proxy -> policy server -> store ->
# learner. It asserts that weights and activations are on the GPU in the trainer and in the policy server, and
# prints generation tokens/s, update seconds and peak GPU memory as JSON. Sized for < 8 minutes.
#
# The GPU image has torch, transformers and peft but not this project's other dependencies (fastapi, pydantic,
# openai, ...). With no network, bring them as wheels: on a machine with PyPI, for the GPU image's Python,
#   pip download -d .gpu-wheels --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
#       -r <(python -c "print('fastapi uvicorn pydantic httpx openai orjson rich jsonschema opentelemetry-sdk')")
# and carry .gpu-wheels; this script installs core and trainer from it without touching torch.
# Not yet run on a GPU: see the README.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
python="${GPU_CHECK_PYTHON:-python3}"
if ! "$python" -c "import agentlightning, agentlightning_trainer" 2>/dev/null; then
  if [ -d .gpu-wheels ]; then
    "$python" -m pip install -q --no-index --find-links .gpu-wheels -e "./core[server]" -e ./trainer
  else
    "$python" -m pip install -q -e "./core[server]" -e ./trainer
  fi
fi
"$python" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')"
PYTHONUNBUFFERED=1 "$python" -m agentlightning_trainer.gpu_check "$@"
echo "gpu_check: $(( $(date +%s) - started )) s in all"
