"""The suite's own rules: `make test-fast` (`-m "not slow"`) runs at least one test of every test module,
so a change anywhere gets an answer in about a minute (docs/contributing.md, "Tests"); and a test
module takes what it shares from tests/helpers, never from another test module or conftest.py."""

from __future__ import annotations

import ast

from helpers.runners import ROOT

TESTS = ROOT / "tests"


def _is_slow(decorator: ast.expr) -> bool:
    return ast.unparse(decorator) in ("pytest.mark.slow", "slow")


def fast_tests(source: str) -> tuple[list[str], list[str]]:
    """(fast, slow) test function names of a test module's source: slow when the function, or the
    whole module (`pytestmark`), carries the `slow` marker."""
    tree = ast.parse(source)
    module_slow = any(
        isinstance(node, ast.Assign)
        and any(getattr(target, "id", None) == "pytestmark" for target in node.targets)
        and "slow" in ast.unparse(node.value)
        for node in tree.body
    )
    fast, slow = [], []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            (slow if module_slow or any(_is_slow(d) for d in node.decorator_list) else fast).append(node.name)
    return fast, slow


def test_the_rule_reader_sees_function_and_module_markers():
    fast, slow = fast_tests("import pytest\n@pytest.mark.slow\ndef test_a(): ...\ndef test_b(): ...\ndef helper(): ...\n")
    assert (fast, slow) == (["test_b"], ["test_a"])
    assert fast_tests("import pytest\npytestmark = pytest.mark.slow\ndef test_a(): ...\n") == ([], ["test_a"])


def test_every_test_module_has_a_fast_test():
    modules = sorted(TESTS.glob("test_*.py"))
    without = [p.name for p in modules if (found := fast_tests(p.read_text())) and found[1] and not found[0]]
    assert len(modules) > 30 and without == [], f"test modules whose every test is slow (add a fast one): {without}"


def imports_of_tests(source: str) -> list[str]:
    """The modules a source imports that are test modules (`test_*`) or conftest.py, anywhere in it
    (a function-level import too)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [name for name in names if name.split(".")[0] == "conftest" or name.split(".")[-1].startswith("test_")]
    return found


def test_the_import_reader_sees_test_modules_and_conftest():
    source = "from test_wandb import read_run\ndef f():\n    from conftest import cli\nimport tests.test_x\nfrom helpers.runners import cli\n"
    assert sorted(imports_of_tests(source)) == ["conftest", "test_wandb", "tests.test_x"]


def test_no_test_module_imports_another_or_conftest():
    """Shared helpers live in tests/helpers (runners, studies, the sweeper's parts): a test module that
    imports another's helper runs that module's imports and couples two files that change apart, and
    conftest.py holds only fixtures and hooks, which pytest hands out by name."""
    modules = sorted(TESTS.glob("test_*.py")) + sorted((TESTS / "helpers").glob("*.py"))
    found = {p.relative_to(TESTS).as_posix(): imports_of_tests(p.read_text()) for p in modules}
    assert len(modules) > 30 and {k: v for k, v in found.items() if v} == {}, "import these from tests/helpers instead"
