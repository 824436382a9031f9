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
