#!/usr/bin/env bash
# Download the wheels scripts/gpu_check.sh needs on the device machine (Python 3.12, x86-64, no
# internet) into .whl/ (gitignored), in three folders, each carried as one path of the device tool:
#
#   .whl/base     ~7 MiB   trl 1.16, hydra, omegaconf, optuna (+ sqlalchemy, alembic, mako,
#                          colorlog), datasets (+ dill, multiprocess, fsspec): every TRL case
#   .whl/bnb      ~40 MiB  bitsandbytes: the 4-bit case (preset=seed_optimized)
#   .whl/unsloth  ~31 MiB  unsloth + unsloth_zoo 2026.10.9, trl 1.15.0 (Unsloth pins trl<=1.15),
#                          cut_cross_entropy (Unsloth's fused loss on CUDA)
#
# base + bnb (part a) and base + unsloth (part b) each fit one 64 MiB carry; all three do not.
# The machine already has torch 2.11, transformers 5.17, peft, accelerate, triton, pandas, pyarrow,
# pyyaml, jinja2, psutil, tqdm, torchvision, sentencepiece, protobuf, einops, rich, typer.
# Unsloth's other listed requirements are NOT carried, each checked in unsloth/unsloth_zoo 2026.10.9's
# source and by importing it with them absent: xformers (optional, PyTorch SDPA otherwise; a cu130
# build is far over the limit), bitsandbytes (only for 4-bit: "16bit and full finetuning works"),
# torchao (only fp8/QAT, guarded by find_spec), vllm (fast_inference; the backend turns it off),
# tyro/diffusers/hf_transfer/json5/structlog/pydantic (CLI, Studio, downloads; not imported by
# training), msgspec (imported only by unsloth_zoo.vllm_lora_request, i.e. with vLLM).
#
#   scripts/gpu_wheels.sh                 # all three folders
#   scripts/gpu_wheels.sh base bnb        # only these
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
PLAT=(--python-version 3.12 --implementation cp --abi cp312 --only-binary=:all: --no-deps
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
BASE=(
  trl==1.16.0
  hydra-core==1.3.8 omegaconf==2.3.1
  optuna==5.0.0 sqlalchemy==2.1.9 alembic==1.20.1 mako==1.4.3 colorlog==6.12.0
  datasets==4.8.5 dill==0.4.1 multiprocess==0.70.19 fsspec==2026.2.0
)
BNB=(bitsandbytes==0.50.2)
UNSLOTH=(unsloth==2026.10.9 unsloth_zoo==2026.10.9 trl==1.15.0 cut_cross_entropy==25.1.1)
# The machine-wide constraint file here caps torch; it must not filter what we download.
export PIP_CONSTRAINT=
sets=("$@")
[[ ${#sets[@]} -gt 0 ]] || sets=(base bnb unsloth)
for set in "${sets[@]}"; do
  dest=.whl/$set
  mkdir -p "$dest"
  case $set in
    base) pkgs=("${BASE[@]}") ;;
    bnb) pkgs=("${BNB[@]}") ;;
    unsloth) pkgs=("${UNSLOTH[@]}") ;;
    *) echo "gpu_wheels: unknown set '$set' (base, bnb, unsloth)" >&2; exit 2 ;;
  esac
  "$PY" -m pip download -q "${PLAT[@]}" -d "$dest" "${pkgs[@]}"
  # antlr4-python3-runtime (hydra's parser) is published as an sdist only: build its pure-Python wheel.
  if [[ $set == base ]] && ! ls "$dest"/antlr4_python3_runtime-4.9.3-*.whl >/dev/null 2>&1; then
    "$PY" -m pip wheel -q --no-deps -w "$dest" antlr4-python3-runtime==4.9.3
  fi
  # One version of each package per install: two make it fail on the device.
  dupes=$(ls "$dest"/*.whl | xargs -n1 basename | cut -d- -f1 | tr 'A-Z' 'a-z' | sort | uniq -d)
  [[ -z "$dupes" ]] || { echo "duplicate wheels in $dest: $dupes" >&2; exit 1; }
  echo "$dest: $(du -ch "$dest"/*.whl | tail -1 | cut -f1)"
done
# What each device call carries (the working tree travels too: keep the sum under 64 MiB).
for pair in "base bnb" "base unsloth"; do
  # shellcheck disable=SC2086
  set -- $pair
  [[ -d .whl/$1 && -d .whl/$2 ]] && echo "carry .whl/$1 + .whl/$2: $(du -cm .whl/$1/*.whl .whl/$2/*.whl | tail -1 | cut -f1) MiB"
done
exit 0
