# Every target uses .venv; nothing needs activating.
PY := .venv/bin/python
PIP := .venv/bin/pip
SWEEP ?= tiny_cpu
ARGS ?=

.PHONY: install test test-fast train sweep lint format clean bench

install: .venv/.installed

.venv/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PIP) install -q --upgrade pip
	# No NVIDIA driver: take the CPU build of torch first, so nothing pulls a multi-GB CUDA build.
	if ! command -v nvidia-smi >/dev/null 2>&1; then $(PIP) install -q torch==2.13.0; fi
	$(PIP) install -q -e '.[dev]'
	touch $@

test: install
	$(PY) -m pytest -q -rs tests

test-fast: install
	$(PY) -m pytest -q -rs -m "not slow" tests

train: install
	$(PY) train.py $(ARGS)

sweep: install
	$(PY) train.py -m +sweeps=$(SWEEP) $(ARGS)

lint: install
	$(PY) -m ruff format --check src tests bench scripts train.py
	$(PY) -m ruff check src tests bench scripts train.py

format: install
	$(PY) -m ruff format src tests bench scripts train.py
	$(PY) -m ruff check --fix src tests bench scripts train.py

clean:
	rm -rf outputs/runs outputs/multirun outputs/sweeps .pytest_cache .ruff_cache build src/*.egg-info

bench: install
	$(PY) bench/run_all.py
