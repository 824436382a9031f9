"""The Performance page's numbers, rendered from bench/results/summary.json when the site is built.

mkdocs.yml names this file as a hook, so `make docs` (`mkdocs build --strict`) calls `on_page_markdown`
for every page; it replaces, from the summary.json of the checkout being built:

    <!-- bench:goals -->            each goal, its value(s) from summary.json, and whether it is met
    <!-- bench:figures -->          every figure summary.json holds (the table `make bench` writes to summary.md)
    {{ bench:KEY }}                 one value, formatted as summary.md formats it (3 significant digits)
    {{ bench:KEY:SPEC }}            one value with a Python format spec, e.g. {{ bench:overhead_ratio:.2f }}

A KEY summary.json does not hold fails the build, naming the key. The per-benchmark tables
(bench/results/<name>.md, written by each benchmark) are included as they are with pymdownx.snippets.

`python bench/docs_tables.py [PAGE.md]` prints PAGE expanded (default: the goals and figures tables).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, markdown_table  # noqa: E402

SUMMARY = RESULTS / "summary.json"
VALUE = re.compile(r"\{\{\s*bench:([A-Za-z0-9_.]+)(?::([^}\s]+))?\s*\}\}")
MARKERS = ("<!-- bench:goals -->", "<!-- bench:figures -->")


class MissingFigure(KeyError):
    """A page names a figure that summary.json does not hold."""

    def __str__(self) -> str:
        return f"bench/results/summary.json has no figure {self.args[0]!r} (a page asks for it); run `make bench` or fix the page"


def load(path: Path = SUMMARY) -> dict:
    return json.loads(Path(path).read_text())


def _get(summary: dict, key: str):
    if key not in summary or summary[key] is None:
        raise MissingFigure(key)
    return summary[key]


def fmt(value, spec: str | None = None) -> str:
    if spec:
        return format(value, spec)
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _secs(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


def _seconds_vs_random(s: dict, suffix: str) -> tuple[str, bool]:
    ours, rnd = _get(s, f"search_median_seconds{suffix}"), _get(s, f"random_median_seconds{suffix}")
    return f"{_secs(ours)} s vs random {_secs(rnd)} s ({ours / rnd:.2g}x)", ours <= rnd / 3


def _pick(s: dict, suffix: str) -> tuple[str, bool]:
    with_, without = _get(s, f"pick_within_5pct_rate{suffix}"), _get(s, f"pick_within_5pct_rate_no_confirm{suffix}")
    return f"{with_:.2f} (without confirmation {without:.2f})", with_ >= 0.9 and with_ > without


# The search spaces a goal was measured on, as the Performance page names them. The shipped sweeps
# hold the recipe (conf/sweeps/*.yaml); the "old" spaces let the recipe vary too, so a larger
# effective batch counted as speed there (docs/equal-learning-bench.md).
RECIPE_HELD = (
    ("_recipe_held_tiny_knobs", "tiny_cpu, recipe held, knobs only (the split: `make sweep` before attention joined its space)"),
    ("_recipe_held_tiny", "tiny_cpu, recipe held, with concessions"),
    ("_recipe_held_gemma_knobs", "Gemma 3 1B / L4 model, recipe held, knobs only"),
    ("_recipe_held_gemma_concessions", "Gemma 3 1B / L4 model, recipe held, with concessions"),
)
OLD_SPACES = (
    ("", "old tiny grid (180 points; the recipe varied)"),
    ("_gemma_l4", "old Gemma 3 1B / L4 model (6144 points; the recipe varied)"),
)


# The shipped sweeps' own spaces (bench/search_real_space.py), first on the page: (case, how the page names it).
REAL_SPACES = (
    ("tiny_cpu_vllm", "sweeps/tiny_cpu_vllm.yaml's 144 knob points, each run for real (vLLM colocate, CPU)"),
    ("gemma_knobs", "sweeps/gemma3_1b_l4.yaml's 384 knob points, recipe held: a MODEL (estimator + throughput model)"),
)


def _real_space_rows(s: dict, row) -> None:
    """The search's goals on the shipped spaces, for the default start (model); the memory-first start
    and no start beside it, unjudged."""
    for case, space in REAL_SPACES:
        sfx = f"_real_space_{case}"
        if f"search_median_seconds{sfx}_start_model" not in s:
            continue
        ours = _get(s, f"search_median_seconds{sfx}_start_model")
        rnd, tpe = _get(s, f"random_median_seconds{sfx}"), _get(s, f"tpe_unconstrained_median_seconds{sfx}")
        row(
            "search machine seconds to a good point, confirmation included",
            space,
            "<= 1/3 of random, below TPE",
            f"{_secs(ours)} s vs random {_secs(rnd)} s ({ours / rnd:.2g}x), TPE {_secs(tpe)} s",
            ours <= rnd / 3 and ours < tpe,
        )
        pick, oracle = _get(s, f"pick_within_5pct_rate{sfx}_start_model"), _get(s, f"pick_within_5pct_rate_oracle{sfx}")
        row(
            "pick within 5 %, at the measured noise",
            space,
            ">= the oracle's - 0.05",
            f"{pick:.2f} (oracle {oracle:.2f}"
            + (
                f"; forecast-only oracle {fo:.2f}"
                if (fo := s.get(f"pick_within_5pct_rate_model_oracle{sfx}")) is not None
                else ""
            )
            + ")",
            pick >= oracle - 0.05,
        )
        quiet = s.get(f"pick_within_5pct_rate{sfx}_quiet_start_model")
        if quiet is not None:
            row("pick within 5 %, at sigma 0.03", space, ">= 0.9", f"{quiet:.2f}", quiet >= 0.9)
        share = _get(s, f"confirm_share_max{sfx}_start_model")
        row("confirmation's share of the sweep's seconds (worst seed)", space, "<= 25 %", f"{share:.0%}", share <= 0.25)
        starts = ", ".join(
            f"{start} {_secs(_get(s, f'search_median_seconds{sfx}_start_{start}'))} s / "
            f"{_get(s, f'pick_within_5pct_rate{sfx}_start_{start}'):.2f}"
            for start in ("model", "memory", "none")
        )
        row("hydra.sweeper.start: seconds / pick", space, "reported", starts, None)


def goals(s: dict) -> list[dict]:
    """One row per goal of the bench (docs/performance.md): what it was measured on, the value and
    whether it is met; the shipped recipe-held spaces first."""
    rows = []

    def row(what: str, space: str, goal: str, value: str, met: bool | None) -> None:
        rows.append(
            {
                "figure": what,
                "measured on": space,
                "goal": goal,
                "measured": value,
                "met": {True: "yes", False: "**no**", None: "-"}[met],
            }
        )

    _real_space_rows(s, row)
    for suffix, space in RECIPE_HELD:
        if f"search_median_seconds{suffix}" in s:
            text, met = _seconds_vs_random(s, suffix)
            row("search machine seconds to a good point", space, "<= 1/3 of random", text, met)
            text, met = _pick(s, suffix)
            row("pick within 5 % of the optimum", space, ">= 0.9 and above no confirmation", text, met)
    for suffix, space in OLD_SPACES:
        text, met = _seconds_vs_random(s, suffix)
        row("search machine seconds to a good point", space, "<= 1/3 of random", text, met)
        text, met = _pick(s, suffix)
        row("pick within 5 % of the optimum", space, ">= 0.9 and above no confirmation", text, met)
    t, r, g = _get(s, "search_median_trials"), _get(s, "random_median_trials"), _get(s, "grid_size")
    grid = OLD_SPACES[0][1]
    row(
        "search: median trials to within 5 %",
        grid,
        "<= 1/10 of the grid, fewer than random",
        f"{t:g} (random {r:g})",
        t <= g / 10 and t < r,
    )
    bad = _get(s, "infeasible_final_picks")
    row("infeasible final picks", grid, "0", str(bad), bad == 0)
    o = _get(s, "overhead_ratio")
    row(
        "framework overhead (trial step / bare TRL step)",
        "one tiny trl trial, interleaved runs",
        "<= 1.05",
        f"{o:.2f}",
        o <= 1.05,
    )
    w, c = _get(s, "warm_start_s"), _get(s, "cold_start_s")
    row("trial start, warm (forkserver)", "one tiny trl trial", "<= 2 s", f"{w:.2f} s (cold {c:.2f} s)", w <= 2)
    m, x = _get(s, "estimator_median_abs_err"), _get(s, "estimator_max_abs_err")
    row(
        "estimator error (absolute): median, worst",
        "28 measured configurations (bench/estimator_accuracy.py)",
        "<= 10 %, <= 25 %",
        f"{m:.1%}, {x:.1%}",
        m <= 0.10 and x <= 0.25,
    )
    return rows


def expand(markdown: str, summary: dict) -> str:
    """`markdown` with every bench marker and {{ bench:KEY }} replaced from `summary`."""
    if MARKERS[0] in markdown:
        markdown = markdown.replace(MARKERS[0], markdown_table(goals(summary)))
    if MARKERS[1] in markdown:
        rows = [{"figure": k, "value": v} for k, v in summary.items()]
        markdown = markdown.replace(MARKERS[1], markdown_table(rows))
    return VALUE.sub(lambda m: fmt(_get(summary, m.group(1)), m.group(2)), markdown)


def on_page_markdown(markdown: str, page, config, files) -> str:  # mkdocs hook
    if VALUE.search(markdown) or any(marker in markdown for marker in MARKERS):
        return expand(markdown, load())
    return markdown


if __name__ == "__main__":
    text = Path(sys.argv[1]).read_text() if len(sys.argv) > 1 else "\n\n".join(MARKERS)
    print(expand(text, load()))
