#!/usr/bin/env bash
# The device check, in one command (see scripts/gpu_check.py for what it runs and why).
#
# Here, once:   scripts/gpu_wheels.sh [--with-bnb]     # wheels the device machine lacks -> .whl/
# On the GPU:   scripts/gpu_check.sh                  # (device tool: carry [".whl"], timeout_s 480)
# Here, first:  PY=.venv/bin/python scripts/gpu_check.sh --cpu-dry-run   # same flow on CPU
#
# Writes $OUT/gpu_check.json (+ gpu_check.log), or outputs/gpu_check/ without $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
if [[ " $* " != *" --cpu-dry-run "* ]] && ls .whl/*.whl >/dev/null 2>&1; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "gpu_check: installing .whl/ failed" >&2; exit 3; }
  export PYTHONPATH=/tmp/site:$PWD/src
else
  export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
fi
# No internet there: never wait on the hub; no W&B.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=disabled
export TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
export GRPO_SWEEP_CACHE=${GRPO_SWEEP_CACHE:-/tmp/grpo_sweep_cache}
[[ -n "${OUT:-}" ]] && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/nvidia_smi.csv" 2>/dev/null
exec "$PY" scripts/gpu_check.py "$@"
