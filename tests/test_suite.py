"""The suite's own rule: `make test-fast` (`-m "not slow"`) runs at least one test of every test module,
so a change anywhere gets an answer in about a minute (docs/contributing.md, "Tests")."""

from __future__ import annotations

import ast

from conftest import ROOT

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
