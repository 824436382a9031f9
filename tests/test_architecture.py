"""The layering rules of ARCHITECTURE.md, enforced.

Statically (every import in every module, the ones inside functions included) and in fresh
interpreters (what really lands in sys.modules):
- dependencies point one way: bottom < config < memory, study < trial, report, sweeper plugin < cli;
- the memory model and the config schema import neither torch, transformers, trl nor peft;
- the sweeper plugin never imports the trial side or torch; the report never imports the trial side;
- the app never imports the plugin; no import cycles between modules.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers.runners import ROOT

SRC = ROOT / "src"
HEAVY = ("torch", "transformers", "trl", "peft", "vllm", "unsloth", "bitsandbytes")

# Layer of each top-level area (lower numbers are lower layers; an area may import its own layer's
# modules only where PEERS allows it, and any lower layer).
LAYERS = {
    "grpo_sweep.files": 0,
    "grpo_sweep": 1,  # the package's __init__
    "grpo_sweep.levers": 1,
    "grpo_sweep.metrics": 1,
    "grpo_sweep.units": 1,
    "grpo_sweep.credentials": 1,
    "grpo_sweep.conf": 1,
    "grpo_sweep.config": 2,
    "grpo_sweep.memory": 3,
    "grpo_sweep.study": 3,
    "grpo_sweep.study.attrs": 0,  # the study's schema: stdlib only, so metrics.py takes its statuses from it
    "grpo_sweep.trial": 4,
    "grpo_sweep.report": 4,
    "hydra_plugins.grpo_optuna_sweeper": 5,
    "grpo_sweep.cli": 5,
    "grpo_sweep.__main__": 6,
    "grpo_sweep.api": 6,  # the notebook API: drives the app as a subprocess, reads the report
}
# Heavy third-party packages an area may import (anything not listed: none of HEAVY).
MAY_IMPORT_HEAVY = {"grpo_sweep.trial", "grpo_sweep.cli", "grpo_sweep.api"}
# The one import against the layers: the package's __init__ hands out grpo_sweep.estimate/plan/sweep/Best
# from its module __getattr__ (PEP 562), so the API is imported on first use only
# (test_import_grpo_sweep_stays_light checks that a plain import loads none of it).
LAZY_EXPORTS = {("grpo_sweep", "grpo_sweep.api")}


def area(module: str) -> str | None:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in LAYERS:
            return prefix
    return None


def module_name(path: Path) -> str:
    rel = path.relative_to(SRC).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Absolute names of every module `path` imports (relative imports resolved), anywhere in it."""
    tree = ast.parse(path.read_text())
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                stem = ".".join([*base, node.module] if node.module else base)
            else:
                stem = node.module or ""
            out.add(stem)
            for alias in node.names:  # `from . import estimator` imports a module
                candidate = f"{stem}.{alias.name}"
                if _is_module(candidate):
                    out.add(candidate)
    return out


def _is_module(name: str) -> bool:
    path = SRC.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def sources() -> list[Path]:
    return sorted(p for p in (SRC / "grpo_sweep").rglob("*.py")) + sorted(
        (SRC / "hydra_plugins" / "grpo_optuna_sweeper").rglob("*.py")
    )


def graph() -> dict[str, set[str]]:
    ours = {module_name(p): p for p in sources()}
    return {m: {i for i in imports_of(p) if i in ours and i != m} for m, p in ours.items()}


def test_layers_point_one_way():
    bad = []
    for path in sources():
        me = module_name(path)
        mine = area(me)
        assert mine is not None, f"{me}: not in any layer of ARCHITECTURE.md (add it to LAYERS here)"
        for name in imports_of(path):
            top = name.split(".")[0]
            if top in HEAVY and mine not in MAY_IMPORT_HEAVY:
                bad.append(f"{me} imports {name} (only the trial side and the CLI may)")
            theirs = area(name)
            if theirs is None or theirs == mine or name == me or (me, name) in LAZY_EXPORTS:
                continue
            if theirs.startswith("hydra_plugins") and not mine.startswith("hydra_plugins"):
                bad.append(f"{me} imports the sweeper plugin ({name}): the app never does")
            elif LAYERS[theirs] > LAYERS[mine]:
                bad.append(f"{me} (layer {LAYERS[mine]}) imports {name} (layer {LAYERS[theirs]}): upward")
            elif LAYERS[theirs] == LAYERS[mine]:
                bad.append(f"{me} imports {name}: peers of one layer stay apart")
    assert not bad, "\n".join(bad)


def test_no_import_cycles():
    g = graph()
    seen: dict[str, int] = {}  # 1: on the stack, 2: done
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        seen[node] = 1
        for nxt in sorted(g[node]):
            if seen.get(nxt) == 1:
                cycles.append(" -> ".join([*stack[stack.index(nxt) :], nxt]))
            elif nxt not in seen:
                visit(nxt, [*stack, nxt])
        seen[node] = 2

    for node in sorted(g):
        if node not in seen:
            visit(node, [node])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_rule_checker_sees_imports_inside_functions(tmp_path):
    """The static check must catch a lazy import (54 of 82 were inside functions once)."""
    path = SRC / "grpo_sweep" / "memory" / "estimator.py"
    assert "torch" not in imports_of(path)
    assert "grpo_sweep.config.backends" in imports_of(path)
    doctor = imports_of(SRC / "grpo_sweep" / "cli" / "doctor.py")
    assert "grpo_sweep.trial.parent" in doctor  # imported inside verify()


def _fresh(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


HEAVY_LOADED = "print(sorted({m.split('.')[0] for m in sys.modules} & set(%r)))" % (HEAVY,)


def test_light_layers_import_no_torch_in_a_fresh_interpreter():
    out = _fresh(f"""
        import sys
        import grpo_sweep.memory.estimator, grpo_sweep.memory.doctor, grpo_sweep.memory.throughput
        import grpo_sweep.memory.oom_message, grpo_sweep.config.schema, grpo_sweep.config.local
        import grpo_sweep.config.compose, grpo_sweep.study.storage, grpo_sweep.study.best
        import grpo_sweep.report.trials, grpo_sweep.report.html, grpo_sweep.cli.report
        import hydra_plugins.grpo_optuna_sweeper.sweeper, hydra_plugins.grpo_optuna_sweeper.summary
        {HEAVY_LOADED}
        print(sorted(m for m in sys.modules if m.startswith("grpo_sweep.trial")))
    """)
    heavy, trial_side = out.strip().splitlines()
    assert heavy == "[]", f"heavy packages imported: {heavy}"
    assert trial_side == "[]", f"the trial side was imported: {trial_side}"


def test_import_grpo_sweep_stays_light():
    """`import grpo_sweep` loads neither the API nor anything heavy; grpo_sweep.sweep is the API's."""
    out = _fresh(f"""
        import sys
        import grpo_sweep
        {HEAVY_LOADED}
        print("grpo_sweep.api" in sys.modules)
        print(grpo_sweep.sweep.__module__)
    """)
    heavy, api_loaded, owner = out.strip().splitlines()
    assert (heavy, api_loaded, owner) == ("[]", "False", "grpo_sweep.api")


@pytest.mark.parametrize(
    "argv",
    [
        ["estimate", "model=gemma3_1b", "gpu=l4_24g", "preset=seed_baseline"],
        ["estimate", "model=tiny", "gpu=cpu_sim", "--json"],
        ["doctor", "--message", "MESSAGE", "model=gemma3_1b", "gpu=l4_24g", "preset=seed_baseline"],
    ],
)
def test_estimate_and_doctor_never_import_torch(argv, tmp_path):
    message = tmp_path / "oom.txt"
    message.write_text(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 12.00 GiB. GPU 0 has a "
        "total capacity of 22.06 GiB of which 3.10 GiB is free."
    )
    argv = [str(message) if a == "MESSAGE" else a for a in argv]
    out = _fresh(f"""
        import sys, io, contextlib
        from grpo_sweep.cli import main
        with contextlib.redirect_stdout(io.StringIO()):
            rc = main({argv!r})
        print(rc)
        {HEAVY_LOADED}
    """)
    rc, heavy = out.strip().splitlines()[-2:]
    assert rc == "0" and heavy == "[]", out


@pytest.mark.slow
def test_sweep_parent_never_imports_torch(tmp_path):
    """The sweeper's process (Hydra, Optuna, the basic launcher running the task function) never
    imports torch, so it can never initialise CUDA: trials run in child processes."""
    out = _fresh(f"""
        import atexit, sys, runpy
        atexit.register(lambda: print("HEAVY", sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))))
        sys.argv = ["train.py", "-m", "+sweeps=tiny_cpu", "hydra.sweeper.n_trials=1", "hydra.sweeper.enqueue=[]",
                    "trial.steps=1", "hydra.sweep.dir={tmp_path}"]
        runpy.run_path("train.py", run_name="__main__")
    """)
    assert "HEAVY []" in out, out[-2000:]
    assert (tmp_path / "best.yaml").exists() or (tmp_path / "trials.csv").exists()
