#!/usr/bin/env bash
# The device check, in one command per device call (see scripts/gpu_check.py for what it runs).
#
# Here, once:    scripts/gpu_wheels.sh               # wheels the device lacks -> .whl/{base,bnb,unsloth}
# Here, first:   PY=.venv/bin/python scripts/gpu_check.sh --cpu-dry-run   # same flow on CPU (~1-2 min)
# On the GPU (device tool), calls of < 64 MiB carry each, back to back (docs/contributing.md "The device check"
# says which parts the next session runs and how its budget is split):
#   carry [".whl/base", ".whl/bnb"]      command: scripts/gpu_check.sh --part a    timeout_s 590
#   carry [".whl/base", ".whl/unsloth"]  command: scripts/gpu_check.sh --part b    timeout_s 430
# The CUDA-only speed knobs:
#   carry [".whl/base"]                  command: scripts/gpu_check.sh --part d --budget-s B    timeout_s B + 40
# The landscape for the speed model, right after part a (docs/contributing.md: B = min(budget left - 60, 520)):
#   carry [".whl/base"]                  command: scripts/gpu_check.sh --part landscape --budget-s B    timeout_s B + 45
# then here:     .venv/bin/python scripts/gpu_check.py --merge <part a json> <part b json>
#
# Writes $OUT/gpu_check_<card>_<date>.json (+ gpu_check.log, nvidia_smi.csv), or outputs/gpu_check/.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
if [[ " $* " != *" --cpu-dry-run "* ]]; then
  # Base wheels (+ bitsandbytes) into one site; Unsloth's (with TRL 1.15, which it pins) into its
  # own, put first on the path for the Unsloth case only (scripts/gpu_check.py unsloth_env).
  # The landscape's trials fork from one forkserver: its site holds no bitsandbytes (peft imports it,
  # and it initialises CUDA on import, which no forked trial survives).
  site=/tmp/site
  base=$(ls .whl/base/*.whl .whl/bnb/*.whl 2>/dev/null)
  if [[ " $* " == *" --part landscape "* ]]; then
    site=/tmp/site_landscape
    base=$(ls .whl/base/*.whl 2>/dev/null)
  fi
  if [[ -n "$base" ]]; then
    # shellcheck disable=SC2086
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $site $base \
      || { echo "gpu_check: installing .whl/base (+bnb) failed" >&2; exit 3; }
    export PYTHONPATH=$site:$PYTHONPATH
  fi
  if ls .whl/unsloth/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site_unsloth .whl/unsloth/*.whl \
      || { echo "gpu_check: installing .whl/unsloth failed" >&2; exit 3; }
    export GPU_CHECK_UNSLOTH_SITE=/tmp/site_unsloth
  fi
fi
# No internet there: never wait on the hub; no W&B; no Unsloth statistics ping.
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=disabled UNSLOTH_DISABLE_STATISTICS=1
export TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
export GRPO_SWEEP_CACHE=${GRPO_SWEEP_CACHE:-/tmp/grpo_sweep_cache}
[[ -n "${OUT:-}" ]] && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/nvidia_smi.csv" 2>/dev/null
exec "$PY" scripts/gpu_check.py "$@"
