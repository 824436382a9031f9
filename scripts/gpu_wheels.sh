#!/usr/bin/env bash
# Download the wheels scripts/gpu_check.sh needs on the device machine (Python 3.12, x86-64, no
# internet) into .whl/ (gitignored). That machine has torch, transformers, peft, accelerate, pandas,
# pyarrow, pyyaml, jinja2, psutil, tqdm; it lacks trl, hydra, omegaconf, optuna (+ sqlalchemy,
# alembic, mako, colorlog), datasets (+ dill, multiprocess) and bitsandbytes.
#
#   scripts/gpu_wheels.sh              # ~7 MiB: everything for bf16 trials, the OOM and the sweep
#   scripts/gpu_wheels.sh --with-bnb   # + bitsandbytes (~43 MiB) for the 4-bit trial
#
# Versions are the ones the CPU test suite runs with. vLLM and Unsloth are hundreds of MiB (and
# pull CUDA builds), far over the 64 MiB a device call carries: they are not checked on the device.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
DEST=.whl
mkdir -p "$DEST"
PLAT=(--python-version 3.12 --implementation cp --abi cp312 --only-binary=:all: --no-deps
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
PKGS=(
  trl==1.16.0
  hydra-core==1.3.8 omegaconf==2.3.1
  optuna==5.0.0 sqlalchemy==2.1.9 alembic==1.20.1 mako==1.4.3 colorlog==6.12.0
  datasets==4.8.5 dill==0.4.1 multiprocess==0.70.19 fsspec==2026.2.0
)
[[ " $* " == *" --with-bnb "* ]] && PKGS+=(bitsandbytes==0.50.2)
# The machine-wide constraint file here caps torch; it must not filter what we download.
export PIP_CONSTRAINT=
"$PY" -m pip download -q "${PLAT[@]}" -d "$DEST" "${PKGS[@]}"
# antlr4-python3-runtime (hydra's parser) is published as an sdist only: build its pure-Python wheel.
if ! ls "$DEST"/antlr4_python3_runtime-4.9.3-*.whl >/dev/null 2>&1; then
  "$PY" -m pip wheel -q --no-deps -w "$DEST" antlr4-python3-runtime==4.9.3
fi
# One version of each package: two make the install on the device fail.
dupes=$(ls "$DEST"/*.whl | xargs -n1 basename | cut -d- -f1 | tr 'A-Z' 'a-z' | sort | uniq -d)
[[ -z "$dupes" ]] || { echo "duplicate wheels in $DEST: $dupes" >&2; exit 1; }
du -ch "$DEST"/*.whl | tail -1
ls -1 "$DEST"
