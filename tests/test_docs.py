"""The documentation's own rules: the README stays a landing page whose links resolve, the Performance
page's numbers come from bench/results/summary.json. (`make docs`, run by `make test`, builds the site with
--strict: a nav entry or link to a missing page fails it.)"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_is_a_landing_page_whose_links_resolve():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    assert "make sweep" in text and "make test" in text
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if "://" not in link]
    assert any(link.startswith("docs/") for link in local)
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"


def test_performance_numbers_are_rendered_from_summary_json(tmp_path):
    tables = _load(ROOT / "bench" / "docs_tables.py")
    summary = tables.load()
    page = "overhead {{ bench:overhead_ratio:.2f }}\n\n<!-- bench:goals -->\n\n<!-- bench:figures -->"
    out = tables.expand(page, summary)
    assert f"overhead {summary['overhead_ratio']:.2f}" in out
    assert "<!--" not in out and "{{" not in out
    # Another summary gives other numbers and verdicts: nothing on the page is fixed text.
    worse = {**summary, "overhead_ratio": 1.5, "warm_start_s": 3.25}
    out2 = tables.expand(page, worse)
    assert "overhead 1.50" in out2
    row = next(line for line in out2.splitlines() if line.startswith("| framework overhead"))
    assert row.endswith("| **no** |")
    assert "3.25 s" in next(line for line in out2.splitlines() if line.startswith("| trial start"))
    assert "| overhead_ratio | 1.5 |" in out2
    with pytest.raises(tables.MissingFigure, match="no_such_figure"):
        tables.expand("{{ bench:no_such_figure }}", summary)
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(worse))
    assert tables.load(path)["warm_start_s"] == 3.25


def _defined_names(tree) -> set[str]:
    """Every name a module defines anywhere in it: functions, classes, methods, assigned names and
    attributes, and what it imports."""
    import ast

    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name):
                    names.add(target.id)
                elif isinstance(target, ast.Attribute):
                    names.add(target.attr)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return names


def test_every_project_name_a_docstring_names_in_backticks_exists():
    """A docstring that names one of our modules' functions, `module.name` or `path/module.py` `name`,
    names one that module defines: a rename or a move that leaves a docstring behind fails here.
    (Names of packages are left out: `trial.steps` is a setting as often as a module.)"""
    import ast

    sources = sorted((ROOT / "src").rglob("*.py"))
    trees = {path: ast.parse(path.read_text()) for path in sources}
    defined: dict[str, set[str]] = {}
    for path, tree in trees.items():
        if path.name != "__init__.py":
            defined.setdefault(path.stem, set()).update(_defined_names(tree))
    for path, tree in trees.items():  # a package named as a module is (config/backends.py, trial/backends/)
        if path.name == "__init__.py" and path.parent.name in defined:
            defined[path.parent.name].update(_defined_names(tree))
    defined.pop("train", None)  # `train.py` is the repository's script as often as cli/train.py
    ours = {str(p.relative_to(ROOT / "src")) for p in sources} | {str(p.relative_to(ROOT)) for p in sources}
    stale = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            doc = ast.get_docstring(node, clean=False) or ""
            for head, name in re.findall(r"`([A-Za-z_]\w*)\.([A-Za-z_]\w*)(?:\(\))?`", doc):
                if head in defined and name not in defined[head]:
                    stale.append(f"{path.relative_to(ROOT)}: `{head}.{name}`")
            for file, name in re.findall(r"([\w/]+\.py)`? `([A-Za-z_]\w*)`", doc):
                head = Path(file).stem
                mine = file in ours or any(o.endswith("/" + file) for o in ours)
                if mine and head in defined and name not in defined[head]:
                    stale.append(f"{path.relative_to(ROOT)}: {file} `{name}`")
    assert not stale, "docstrings name what does not exist:\n" + "\n".join(stale)


def _table_rows(text: str) -> list[list[str]]:
    """The cells of a Markdown table's body rows (the header and the separator left out)."""
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    cells = [[cell.strip() for cell in re.split(r"(?<!\\)\|", row)[1:-1]] for row in rows]
    return [row for row in cells[1:] if not set("".join(row)) <= set("-")]


def test_the_plugins_phase_table_is_one_table_in_its_docstring_and_architecture_md():
    """The plugin's `__init__` docstring and ARCHITECTURE.md's plugin section name the same module
    for the same phase, in the same order of phases, and every module of the package is in both,
    once: a module added, moved or renamed without the table fails here."""
    import hydra_plugins.grpo_optuna_sweeper as plugin

    package = Path(plugin.__file__).parent
    modules = sorted(p.stem for p in package.glob("*.py") if p.stem != "__init__")
    docstring: list[tuple[str, str]] = []
    for phase, names in _table_rows(plugin.__doc__):
        docstring += [(phase, name.strip()) for name in names.split(",")]
    architecture = (ROOT / "ARCHITECTURE.md").read_text()
    section = architecture[architecture.index("`src/hydra_plugins/grpo_optuna_sweeper/`") : architecture.index("## Layers")]
    table = [(phase, re.fullmatch(r"`(\w+)\.py`", module)[1]) for phase, module, _what in _table_rows(section)]
    assert docstring == table
    assert sorted(name for _, name in table) == modules
    phases = [phase for phase, _ in table]
    assert phases == sorted(phases, key=phases.index)  # each phase's modules sit together
    assert {"plan", "open", "start", "search loop", "prepare", "prescreen", "run", "tell", "confirmation", "soak"} <= set(phases)
