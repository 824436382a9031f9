"""What a recorded landscape says: how many points fit, how far the best is from the median, which knobs matter.

Reads bench/data/landscape_<sweep>.json (bench/record_grid.py --sweep <sweep>: every point of a shipped
sweep's space run for real) and writes bench/results/landscape_<sweep>.json and .md:

- points: how many ran (ok), ran out of memory in training (oom) or were refused by vLLM at start-up
  (its KV-cache check: the share under its weights); each ok point's value is the median of its runs;
- best / median: the fastest point's tokens/s over the median ok point's (how much a search can win
  over a point picked at random among those that fit), and the best over the slowest;
- each knob's effect, paired: for every two ok points that differ in that knob only, the ratio of
  their tokens/s (the better value over the worse); the median and the largest of those ratios. A
  pairing holds every other knob fixed, so the effect is the knob's own, not a mix of the space's;
- noise: the median spread (max/min - 1) of a point's own runs, the scale below which an effect is
  not told apart from the machine.

    python bench/landscape_summary.py [--sweep tiny_cpu_vllm]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, write_result

REFUSED = "vLLM could not start"  # the trial's error when vLLM's KV-cache check refuses its share


def kind(point: dict) -> str:
    if point["status"] == "ok":
        return "ok"
    return "refused" if REFUSED in (point.get("error") or "") else point["status"]


def value(point: dict) -> float | None:
    runs = [v for v in point.get("tokens_per_s_runs") or [] if v is not None]
    return statistics.median(runs) if runs else None


def knob_effects(points: list[dict]) -> list[dict]:
    """Per knob: the ratios of ok points that differ in that knob only (better over worse), and which
    value was the better one how often."""
    ok = [p for p in points if kind(p) == "ok" and value(p)]
    knobs = list(points[0]["levers"])
    rows = []
    for knob in knobs:
        groups: dict[tuple, list[dict]] = {}
        for p in ok:
            rest = tuple((k, v) for k, v in p["levers"].items() if k != knob)
            groups.setdefault(rest, []).append(p)
        ratios, wins = [], {}
        for members in groups.values():
            for i, a in enumerate(members):
                for b in members[i + 1 :]:
                    hi, lo = (a, b) if value(a) >= value(b) else (b, a)
                    ratios.append(value(hi) / value(lo))
                    wins[str(hi["levers"][knob])] = wins.get(str(hi["levers"][knob]), 0) + 1
        rows.append(
            {
                "knob": knob,
                "pairs": len(ratios),
                "median_ratio": statistics.median(ratios) if ratios else None,
                "max_ratio": max(ratios) if ratios else None,
                "faster_value_wins": wins,
            }
        )
    return sorted(rows, key=lambda r: -(r["median_ratio"] or 0))


def summarize(sweep: str) -> dict:
    data = json.loads((ROOT / "bench" / "data" / f"landscape_{sweep}.json").read_text())
    points = data["points"]
    counts: dict[str, int] = {}
    for p in points:
        counts[kind(p)] = counts.get(kind(p), 0) + 1
    values = sorted(v for p in points if kind(p) == "ok" and (v := value(p)))
    best = max((p for p in points if kind(p) == "ok" and value(p)), key=value)
    spreads = [max(runs) / min(runs) - 1 for p in points if len(runs := [v for v in p.get("tokens_per_s_runs") or [] if v]) >= 2]
    runs_per_ok = [len([v for v in p["tokens_per_s_runs"] if v]) for p in points if kind(p) == "ok"]
    return {
        "sweep": sweep,
        "how": data["how"],
        "sessions": data["sessions"],
        "points": len(points),
        "counts": counts,
        "runs_per_ok_point_min": min(runs_per_ok),
        "best_tokens_per_s": max(values),
        "median_tokens_per_s": statistics.median(values),
        "slowest_tokens_per_s": min(values),
        "best_over_median": max(values) / statistics.median(values),
        "best_over_slowest": max(values) / min(values),
        "best_point": best["levers"],
        "within_5pct_of_best": sum(v >= 0.95 * max(values) for v in values),
        "median_run_spread": statistics.median(spreads) if spreads else None,
        "knob_effects": knob_effects(points),
    }


def main(sweep: str) -> dict:
    result = summarize(sweep)
    table = [
        {
            "knob": r["knob"],
            "pairs": r["pairs"],
            "median ratio": r["median_ratio"],
            "max ratio": r["max_ratio"],
            "faster value (pairs won)": ", ".join(f"{k}: {n}" for k, n in sorted(r["faster_value_wins"].items())),
        }
        for r in result["knob_effects"]
    ]
    title = (
        f"Landscape {sweep}: {result['counts'].get('ok', 0)} of {result['points']} points fit "
        f"({result['counts'].get('oom', 0)} train OOM, {result['counts'].get('refused', 0)} refused by vLLM); "
        f"best {result['best_tokens_per_s']:.0f} tok/s = {result['best_over_median']:.2f}x the median fitting point, "
        f"{result['best_over_slowest']:.2f}x the slowest; {result['within_5pct_of_best']} within 5 % of the best; "
        f"a point's runs spread {100 * (result['median_run_spread'] or 0):.0f} % (median)"
    )
    write_result(f"landscape_{sweep}", result, table, title)
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", default="tiny_cpu_vllm")
    main(parser.parse_args().sweep)
