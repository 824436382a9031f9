"""Per-module counts of the last `make mutation` run, as a markdown table (docs/mutation.md's).

Reads mutmut's own records (mutants/**/*.meta) for the mutants the given patterns name (the
Makefile's MUTANTS), so the table counts exactly what the run was asked to test:

    .venv/bin/python scripts/mutation_summary.py 'hydra_plugins.grpo_optuna_sweeper.outcome.*' ...

Score = (killed + timeout) / (killed + timeout + survived + no tests): the share of mutants the
fast tests catch. A mutant no fast test reaches counts as not caught. "not checked" (a run stopped
before it got there) is left out of the score and reported on its own.
"""

from __future__ import annotations

import fnmatch
import json
import re
import sys
from collections import Counter
from pathlib import Path

from mutmut.stats import status_by_exit_code  # mutmut's own reading of its exit codes

COLUMNS = ["killed", "timeout", "survived", "no tests", "not checked"]


def statuses(patterns: list[str], root: Path = Path("mutants")) -> dict[str, str]:
    """{mutant name: status} for every mutant a pattern names."""
    out = {}
    for meta in sorted(root.rglob("*.meta")):
        for name, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            if any(fnmatch.fnmatch(name, p) for p in patterns):
                out[name] = status_by_exit_code[code]  # None: "not checked"
    return out


def counts(by_name: dict[str, str]) -> dict[str, Counter]:
    per_module: dict[str, Counter] = {}
    for name, status in by_name.items():
        module = re.sub(r"__mutmut_\d+$", "", name).rsplit(".", 1)[0]
        per_module.setdefault(module, Counter())[status] += 1
    return per_module


def score(c: Counter) -> float | None:
    caught = c["killed"] + c["timeout"]
    judged = caught + c["survived"] + c["no tests"]
    return caught / judged if judged else None


def table(per_module: dict[str, Counter]) -> str:
    rows = ["| module | " + " | ".join(COLUMNS) + " | score |", "|---" * (len(COLUMNS) + 2) + "|"]
    total: Counter = Counter()
    for module, c in sorted(per_module.items()):
        total.update(c)
        s = score(c)
        rows.append(f"| {module} | " + " | ".join(str(c[k]) for k in COLUMNS) + f" | {'-' if s is None else f'{s:.1%}'} |")
    s = score(total)
    rows.append("| **all** | " + " | ".join(str(total[k]) for k in COLUMNS) + f" | **{'-' if s is None else f'{s:.1%}'}** |")
    others = {k: v for k, v in total.items() if k not in COLUMNS}
    if others:
        rows.append(f"\nOther outcomes: {dict(others)}")
    return "\n".join(rows)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: mutation_summary.py PATTERN... (the Makefile's MUTANTS)")
    by_name = statuses(sys.argv[1:])
    print(table(counts(by_name)))
    for status in ("survived", "timeout", "no tests"):
        names = [n for n, s in by_name.items() if s == status]
        if names:
            print(f"\n{status} ({len(names)}), `mutmut show NAME` shows one:")
            print("\n".join(f"  {n}" for n in names))
