#!/usr/bin/env bash
# GPU smoke test of the verl backend: two LightningRL steps on one GPU with a small local model.
#
#   scripts/gpu_smoke.sh MODEL_PATH [--dry-run] [extra args of agentlightning_trainer.verl.smoke]
#
# MODEL_PATH is a local Hugging Face model folder (Qwen2.5-0.5B-Instruct class). The script installs verl 0.9.1
# with the versions it pins (vllm 0.24.0, torch 2.11.0, transformers 5.9.0) into .venv-gpu-smoke, unless
# SMOKE_PYTHON names a Python that already has them (a prepared image, or a machine with no network).
# It prints each step's reward and transitions, the actor's parameter checksum before and after, and exits 1
# unless the weights changed. Sized for < 8 minutes with the wheels cached (setup ~2-4 min, ~2 min of training).
# --dry-run checks arguments, the model folder and verl's composed config without a GPU (verl must import).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -lt 1 ] || [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
model_path="$1"; shift
if [ ! -f "$model_path/config.json" ]; then
  echo "gpu_smoke: $model_path is not a Hugging Face model folder (no config.json)" >&2
  exit 2
fi

dry_run=0
for arg in "$@"; do [ "$arg" = "--dry-run" ] && dry_run=1; done

started=$(date +%s)
if [ -n "${SMOKE_PYTHON:-}" ]; then
  python="$SMOKE_PYTHON"
else
  venv=.venv-gpu-smoke
  [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
  python="$venv/bin/python"
  if [ "$dry_run" = 1 ]; then
    # the CPU set that imports verl (see requirements-verl.txt): enough to compose and validate its config
    "$python" -m pip install -q -r requirements-verl.txt -e core -e trainer
  else
    "$python" -m pip install -q "vllm==0.24.0" "torch==2.11.0" "transformers==5.9.0" "verl==0.9.1" cachetools \
      -e core -e trainer
  fi
fi
echo "gpu_smoke: setup took $(( $(date +%s) - started ))s; python: $python"

if [ "$dry_run" = 0 ]; then
  if ! "$python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_smoke: no CUDA GPU visible to torch; run with --dry-run on a machine without one" >&2
    exit 2
  fi
  nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
  # no flash-attn wheel is installed here: VerlSettings(attn_implementation="auto") then picks sdpa
fi

export TOKENIZERS_PARALLELISM=false VLLM_LOGGING_LEVEL="${VLLM_LOGGING_LEVEL:-WARNING}"
"$python" -m agentlightning_trainer.verl.smoke "$model_path" "$@"
echo "gpu_smoke: finished in $(( $(date +%s) - started ))s"
