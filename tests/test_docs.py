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


_UPSTREAM_BASES = {"TrainerCallback"}  # its `on_*` hooks take the arguments transformers documents


def _parameters(fn) -> list[str]:
    a = fn.args
    names = [p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs]]
    if names and names[0] in ("self", "cls"):
        names = names[1:]
    names += [f"*{a.vararg.arg}"] if a.vararg else []
    names += [f"**{a.kwarg.arg}"] if a.kwarg else []
    return [n for n in names if n.lstrip("*") != "_"]  # `**_`: arguments taken and dropped


def _gives(fn) -> str | None:
    """The block `fn`'s value needs: "Yields" for a generator, "Returns" when it returns a value, else None."""
    import ast

    gives, stack = None, list(fn.body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        if isinstance(node, (ast.Yield, ast.YieldFrom)):
            return "Yields"
        if isinstance(node, ast.Return) and not (
            node.value is None or (isinstance(node.value, ast.Constant) and node.value.value is None)
        ):
            gives = "Returns"
        stack.extend(ast.iter_child_nodes(node))
    return gives


def _documented(fn, doc: str) -> list[str]:
    """What `fn`'s docstring lacks: its Args: block, a parameter in it, or its Returns:/Yields: block."""
    params = _parameters(fn)
    if "Args:" not in doc:
        return ["Args:"]
    args = doc.split("Args:", 1)[1]
    missing = [p for p in params if not re.search(rf"^\s+{re.escape(p)}( \([^)]*\))?:", args, re.MULTILINE)]
    gives = _gives(fn) if fn.name != "__init__" else None
    return missing + ([f"{gives}:"] if gives and f"{gives}:" not in doc else [])


def _functions_needing_args():
    """(module, qualified name, function, docstring) of every function or method in src/ with three or
    more parameters (self and cls not counted). Functions nested in functions are left out (no caller
    outside sees them), as are dunder methods but __init__, a TrainerCallback's `on_*` hooks and
    `@overload` stubs."""
    import ast

    for path in sorted((ROOT / "src").rglob("*.py")):
        rel = str(path.relative_to(ROOT / "src"))
        stack: list = [(ast.parse(path.read_text()), "", None)]
        while stack:
            node, prefix, cls = stack.pop()
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.ClassDef):
                    stack.append((child, f"{prefix}{child.name}.", child))
                elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and len(_parameters(child)) >= 3:
                    name = child.name
                    if name.startswith("__") and name != "__init__":
                        continue
                    if any(getattr(d, "id", getattr(d, "attr", None)) == "overload" for d in child.decorator_list):
                        continue  # a typing stub: the implementation below it carries the block
                    bases = {getattr(b, "id", getattr(b, "attr", None)) for b in cls.bases} if cls else set()
                    if name.startswith("on_") and bases & _UPSTREAM_BASES:
                        continue
                    doc = ast.get_docstring(child) or ""
                    if name == "__init__" and "Args:" not in doc:
                        doc = ast.get_docstring(cls) or ""
                    yield rel, f"{prefix}{name}", child, doc
                elif not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    stack.append((child, prefix, cls))


def test_every_function_of_three_or_more_parameters_has_an_args_block():
    """Google style, as Optuna writes it: each parameter named under `Args:`, and `Returns:` (or
    `Yields:`) when the function gives a value. An `__init__` may keep its block in the class docstring."""
    lacking = [
        f"{rel}: {name} lacks {', '.join(gaps)}"
        for rel, name, fn, doc in _functions_needing_args()
        if (gaps := _documented(fn, doc))
    ]
    assert not lacking, f"{len(lacking)} functions lack their Args:/Returns: blocks:\n" + "\n".join(lacking)


def test_the_args_block_check_reads_each_part():
    import ast

    fn = ast.parse("def f(a, b, *rest, c=1, **_):\n    return a\n").body[0]
    assert _parameters(fn) == ["a", "b", "c", "*rest"]
    good = "Sum.\n\nArgs:\n    a: One.\n    b (int): Two.\n    c: Three.\n    *rest: More.\n\nReturns:\n    The sum."
    assert _documented(fn, good) == []
    assert _documented(fn, good.replace("    b (int): Two.\n", "")) == ["b"]
    assert _documented(fn, good.split("\n\nReturns:")[0]) == ["Returns:"]
    assert _documented(fn, "Sum.") == ["Args:"]
