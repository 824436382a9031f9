"""The layering rules of ARCHITECTURE.md, enforced.

Statically (every import in every module, the ones inside functions included) and in fresh
interpreters (what really lands in sys.modules):
- dependencies point one way: bottom < config < memory, study < trial, report, sweeper plugin < cli;
- the memory model and the config schema import neither torch, transformers, trl nor peft;
- the sweeper plugin never imports the trial side or torch; the report never imports the trial side;
- the app never imports the plugin; no import cycles between modules;
- no function in src/ over 80 lines, no file over 600 (the exemptions named, each with its reason).
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


MAX_FUNCTION_LINES = 80  # from `def` to its last line, docstring included, decorators not
MAX_FILE_LINES = 600
# Functions allowed over MAX_FUNCTION_LINES for now, each with its reason. An entry that is no longer
# long fails the test too, so the list only shrinks.
LONG_FUNCTIONS: dict[str, str] = {}


def _functions(tree: ast.AST, prefix: str):
    """(qualified name, lines) of every function in tree, methods and nested functions included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{prefix}.{node.name}"
            yield name, node.end_lineno - node.lineno + 1
            yield from _functions(node, name)
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}.{node.name}")
        else:
            yield from _functions(node, prefix)


def test_no_function_over_80_lines_and_no_file_over_600():
    """Every function in src/ fits in 80 lines and every file in 600 (LONG_FUNCTIONS: the exemptions,
    each with its reason): a long function is split along its own parts, a long file along its concepts."""
    long_files, long_functions = {}, {}
    for path in sorted(SRC.rglob("*.py")):
        text = path.read_text()
        if len(text.splitlines()) > MAX_FILE_LINES:
            long_files[str(path.relative_to(SRC))] = len(text.splitlines())
        for name, lines in _functions(ast.parse(text), module_name(path)):
            if lines > MAX_FUNCTION_LINES:
                long_functions[name] = lines
    assert not long_files, f"files over {MAX_FILE_LINES} lines: {long_files}"
    unexempt = {name: lines for name, lines in long_functions.items() if name not in LONG_FUNCTIONS}
    assert not unexempt, f"functions over {MAX_FUNCTION_LINES} lines: {unexempt}"
    stale = sorted(set(LONG_FUNCTIONS) - set(long_functions))
    assert not stale, f"no longer over {MAX_FUNCTION_LINES} lines, remove from LONG_FUNCTIONS: {stale}"


def test_the_length_scan_finds_methods_and_nested_functions():
    tree = ast.parse(
        textwrap.dedent(
            """
        class A:
            def m(self):
                def inner():
                    pass
                return inner
        def f():
            pass
        """
        )
    )
    assert dict(_functions(tree, "mod")) == {"mod.A.m": 4, "mod.A.m.inner": 2, "mod.f": 2}


# Binary sizes spelled as literals: 2**10 .. 2**40, n << 20, n >> 20 (10 .. 40), 1024**2, 1024 * 1024.
_SIZE_EXPONENTS = {10, 20, 30, 40}
# Modules whose literals other work converts; this list only shrinks.
_SIZE_LITERALS_TO_DO: set[str] = set()


def _size_literal(node: ast.AST) -> str | None:
    """The source text of `node` when it spells a binary size unit as a literal, else None."""
    if not isinstance(node, ast.BinOp) or not isinstance(node.right, ast.Constant):
        return None
    left, right = node.left.value if isinstance(node.left, ast.Constant) else None, node.right.value
    if isinstance(node.op, ast.Pow) and (left, right) in {(2, e) for e in _SIZE_EXPONENTS} | {(1024, 2), (1024, 3)}:
        return ast.unparse(node)
    if isinstance(node.op, (ast.LShift, ast.RShift)) and right in _SIZE_EXPONENTS:  # 16 << 20, n >> 20
        return ast.unparse(node)
    if isinstance(node.op, ast.Mult) and (left, right) == (1024, 1024):
        return ast.unparse(node)
    return None


def test_size_units_are_spelled_once_in_units_py():
    """KiB/MiB/GiB/TiB live in grpo_sweep/units.py only; every other module imports them from there."""
    home = SRC / "grpo_sweep" / "units.py"
    bad = [
        f"{path.relative_to(SRC)}:{node.lineno}: {text} (use grpo_sweep.units)"
        for path in sources()
        if path != home and str(path.relative_to(SRC)) not in _SIZE_LITERALS_TO_DO
        for node in ast.walk(ast.parse(path.read_text()))
        if (text := _size_literal(node))
    ]
    assert not bad, "\n".join(bad)


def test_the_size_literal_check_sees_each_spelling():
    spelled = ["x / 2**20", "1 << 30", "16 << 20", "n >> 20", "n * 1024**3", "1024 * 1024", "2 ** 40"]
    assert all(any(_size_literal(n) for n in ast.walk(ast.parse(s))) for s in spelled)
    assert not any(_size_literal(n) for s in ["2**8", "10**9", "x / MIB", "1 << 4"] for n in ast.walk(ast.parse(s)))
