"""The throughput model against the measured tiny_cpu_vllm landscape: does the plan rank as trials measure?

    PYTHONPATH=src python bench/throughput_model.py [--fresh] [--calibrate]

Every point of sweeps/tiny_cpu_vllm.yaml's space that fits (bench/data/landscape_tiny_cpu_vllm.json, each
point's median of 3 real runs) beside the sweeper's own forecast of it (`grpo-sweep plan --json`, cached
in bench/data/plan_tiny_cpu_vllm.json; --fresh remakes it after a model change). Reported:
- plan_vs_landscape_spearman: Spearman's rho of predicted against measured tokens/s over those points;
- plan_first_pick_ratio: the measured tokens/s of the model start's first pick (start.choose, the sweep's
  default seed 0 breaking ties as the sweep breaks them) over the best point's;
- the model's median predicted / measured tokens/s, and the measured range of its top four.
--calibrate: self-calibration replayed (calibrated_after: the 5 picks and RECHECK untried points twice,
21 real trials here, 5-20 minutes with the box's load).
Beside them, the public GPU runs at the expected length, as bench/published_runs.py judges them: each
run's logged mean completion length as task.expected_completion_tokens.
The cpu_sim card's overheads were fitted to this same landscape (conf/gpu/cpu_sim.yaml says so): these
figures are in-sample. Writes bench/results/throughput_model.json and .md.
"""

from __future__ import annotations

import statistics
import sys

import landscapes
from common import write_result

SEED = 0  # hydra.sweeper.seed's default: the tie-break the sweep itself uses


def main(fresh: bool = False, calibrate: bool = False) -> dict:
    from grpo_sweep.report.trials import average_ranks, spearman
    from hydra_plugins.grpo_optuna_sweeper.start import choose

    if fresh:
        landscapes.plan_of("tiny_cpu_vllm", ("+sweeps=tiny_cpu_vllm",), fresh=True)
    land = landscapes.tiny_cpu_vllm()
    fits = [p for p in land["points"] if p["status"] == "ok" and p["forecast"].tokens_per_s]
    predicted = [p["forecast"].tokens_per_s for p in fits]
    measured = [p["tokens_per_s"] for p in fits]
    rho = spearman(average_ranks(predicted), average_ranks(measured))
    _, picks, _ = choose("model", [p["forecast"] for p in land["points"]], 1, SEED)
    first = land["by_key"][landscapes.key(picks[0])]
    ranked = sorted(fits, key=lambda p: -p["forecast"].tokens_per_s)
    top4 = [p["tokens_per_s"] / land["optimum"] for p in ranked[:4]]
    payload = {
        "points": len(fits),
        "plan_vs_landscape_spearman": rho,
        "plan_first_pick_ratio": first["tokens_per_s"] / land["optimum"],
        "first_pick": picks[0],
        "optimum_tokens_per_s": land["optimum"],
        "median_predicted_over_measured": statistics.median(a / b for a, b in zip(predicted, measured)),
        "top4_measured_of_optimum": top4,
        "in_sample": "the cpu_sim card's overheads were fitted to this landscape",
    }
    table = [
        {"figure": "Spearman rho, plan vs measured", "value": rho, "goal": ">= 0.9"},
        {"figure": "first pick's measured tok/s / best", "value": payload["plan_first_pick_ratio"], "goal": ">= 0.9"},
        {"figure": "median predicted / measured tok/s", "value": payload["median_predicted_over_measured"], "goal": "1"},
        {"figure": "model's top four, measured / best", "value": f"{min(top4):.2f}-{max(top4):.2f}", "goal": ""},
    ]
    payload["published_expected"] = published_at_expected_length()
    kept = None if calibrate else _stored_calibration()
    if calibrate or kept is not None:
        payload["calibration"] = calibration = calibrated_after(land) if calibrate else kept
        if calibration.get("picks"):
            calibration.update(reach_after(land, calibration["picks"]))
        for key in ("calibrated_pick_ratio_after_5", "calibrated_median_error"):
            payload[key] = calibration.get(key)
        payload["calibrated_pick_ceiling_after_5"] = calibration.get("untried_ceiling")
        payload["calibrated_pick_best_untried_after_5"] = calibration.get("untried_best")
        table.append(
            {
                "figure": "after 5 trials of calibration: best untried point's measured tok/s / best",
                "value": payload["calibrated_pick_ratio_after_5"],
                "goal": ">= 0.95",
            }
        )
        table.append(
            {
                "figure": "after 5 trials: median error of calibrated tok/s (untried points re-measured in the same session)",
                "value": payload["calibrated_median_error"],
                "goal": "<= 0.15",
            }
        )
        for figure, key in (
            (
                "... the most any model can reach there: the best untried point that no pick ties, measured / best",
                "untried_ceiling",
            ),
            ("... the best untried point, ties of the picks included, measured / best", "untried_best"),
            ("... of the model before calibration", "uncalibrated_median_error"),
            ("... calibrated with a pure scale per phase", "scale_only_median_error"),
            ("... the re-measured points' own run-to-run noise (median of abs(run / other run - 1))", "noise_floor"),
            ("... against the landscape (other sessions, one core)", "vs_landscape"),
            ("... against the landscape x this session's speed-up on the picks", "vs_landscape_rescaled"),
        ):
            table.append({"figure": figure, "value": calibration.get(key), "goal": ""})
    for split, figures in payload["published_expected"]["splits"].items():
        table.append(
            {
                "figure": f"public GPU runs ({split}), factor off at the expected length: median / worst",
                "value": f"{figures['median_factor']:.2f} / {figures['worst_factor']:.2f}",
                "goal": "<= 1.25 / <= 2 (heldout)",
            }
        )
    write_result("throughput_model", payload, table, "Throughput model vs the measured tiny_cpu_vllm landscape")
    return payload


def _stored_calibration() -> dict | None:
    """The calibration a run with --calibrate recorded (its real trials, with the time it was measured),
    kept when this run does not replay it: a run without --calibrate never drops measured figures."""
    import json

    from common import RESULTS

    path = RESULTS / "throughput_model.json"
    if not path.exists():
        return None
    stored = json.loads(path.read_text())
    calibration = stored.get("calibration")
    if not calibration:
        return None
    return {"measured_at": stored.get("measured_at"), **calibration}


def reach_after(land: dict, picks: list[dict]) -> dict:
    """What the landscape lets `calibrated_pick_ratio_after_5` reach after `picks` ran.

    untried_ceiling: the best measured tokens/s, over the best's, of an untried point whose forecast
    ties no pick's (forecast.ties). Such a point is the most the calibrated model can name: the sweep's
    next point (lead.untried) leaves out a tie of a measured config, and a tie's prediction equals its
    twin's, so no calibration tells them apart. twins_prefix_caching: every pair of points that differ
    in backend.vllm_enable_prefix_caching alone, the spread of their measured ratio (on / off): the
    landscape's own resolution between two points the model predicts alike. untried_best: the best
    untried point, ties included: the most any ranking of the untried points reaches."""
    import math

    from hydra_plugins.grpo_optuna_sweeper.forecast import ties

    tried = {landscapes.key(levers) for levers in picks}
    measured = [land["by_key"][k]["forecast"].tokens_per_s for k in tried if k in land["by_key"]]
    untried = [p for p in land["points"] if p["status"] == "ok" and landscapes.key(p["levers"]) not in tried]
    apart = [p for p in untried if not any(ties(p["forecast"].tokens_per_s, m) for m in measured if m)]
    pairs: dict[tuple, dict] = {}
    for p in land["points"]:
        if p["status"] == "ok":
            rest = {k: v for k, v in p["levers"].items() if k != "backend.vllm_enable_prefix_caching"}
            pairs.setdefault(landscapes.key(rest), {})[p["levers"].get("backend.vllm_enable_prefix_caching")] = p
    logs = [math.log(two[True]["tokens_per_s"] / two[False]["tokens_per_s"]) for two in pairs.values() if len(two) == 2]
    return {
        "untried_best": max((p["tokens_per_s"] for p in untried), default=0.0) / land["optimum"],
        "untried_ceiling": max((p["tokens_per_s"] for p in apart), default=0.0) / land["optimum"],
        "twins_prefix_caching": {
            "pairs": len(logs),
            "median_ratio_on_off": math.exp(statistics.median(logs)) if logs else None,
            "sd_log_ratio": statistics.stdev(logs) if len(logs) > 1 else None,
        },
    }


RECHECK = 8  # untried points re-measured in the calibration's own session (random.Random(SEED).sample)


def calibrated_after(land: dict, count: int = 5) -> dict:
    """Self-calibration replayed: the model start's first `count` picks (start.choose) run as real trials here
    (tiny_cpu_vllm, trial.steps as the sweep sets it), the model's phases fitted to their measured phase
    times (speed_fit.calibrate_untried: per phase a scale and a per-step overhead), then every other point
    that fits re-predicted with them.

    calibrated_pick_ratio_after_5: the landscape's measured tokens/s of the calibrated model's best untried
    point over the best's. calibrated_median_error: median |calibrated / measured - 1| of tokens/s over
    RECHECK untried points measured twice in the picks' session (_session; noise_floor: the median
    |run / other run - 1| of those pairs, what no model can beat against one run). The landscape was
    recorded in other sessions, on one core under other load: this machine's speed since is not the
    model's error, so the landscape's own figures (`vs_landscape`, and `vs_landscape_rescaled`: the
    landscape times the picks' median ratio of this session's tokens/s over the landscape's) are beside it,
    not the goal's figure."""
    import random
    import tempfile
    from pathlib import Path

    from grpo_sweep.memory.speed_fit import calibrate_untried, calibrated, phase_fit
    from hydra_plugins.grpo_optuna_sweeper.start import choose

    _, picks, _ = choose("model", [p["forecast"] for p in land["points"]], count, SEED)
    tried = {landscapes.key(levers) for levers in picks}
    untried = [p for p in land["points"] if p["status"] == "ok" and landscapes.key(p["levers"]) not in tried]
    recheck = random.Random(SEED).sample(untried, min(RECHECK, len(untried)))
    with tempfile.TemporaryDirectory(prefix="throughput-calibration-") as tmp:
        runs, checks = _session(picks, [p["levers"] for p in recheck], Path(tmp))
    ok = [r for r in runs if r.get("status") == "ok" and r.get("generation_s") is not None]
    fit, predictions = calibrate_untried(ok, [_prediction(p["levers"]) for p in untried])
    if fit is None:
        return {"why": "no pick measured its phases", "picks": picks}
    by_key = {landscapes.key(p["levers"]): c["tokens_per_s"] for c, p in zip(predictions, untried)}
    best = max(untried, key=lambda p: by_key[landscapes.key(p["levers"])])
    checked = [(by_key[landscapes.key(r["levers"])], r) for r in checks if r["tokens_per_s"]]
    speed = statistics.median(r["tokens_per_s"] / land["by_key"][landscapes.key(r["levers"])]["tokens_per_s"] for r in ok)
    scales = phase_fit(ok, affine=False)  # the pure scale per phase, the affine fit's comparator
    return {
        "picks": picks,
        "fit": fit,
        "trials": [_brief(r) for r in runs],
        "rechecks": [{**_brief(r), "calibrated_tokens_per_s": c} for c, r in checked],
        "calibrated_pick": best["levers"],
        "calibrated_pick_ratio_after_5": best["tokens_per_s"] / land["optimum"],
        "calibrated_median_error": _median_error((c, r["tokens_per_s"]) for c, r in checked),
        "uncalibrated_median_error": _median_error((r["predicted_tokens_per_s"], r["tokens_per_s"]) for _, r in checked),
        "scale_only_median_error": _median_error((calibrated(r, scales)["tokens_per_s"], r["tokens_per_s"]) for _, r in checked),
        "noise_floor": _median_error(tuple(r["tokens_per_s_runs"]) for r in checks if len(r["tokens_per_s_runs"]) == 2),
        "session_speed_over_landscape": speed,
        "vs_landscape": _median_error((by_key[landscapes.key(p["levers"])], p["tokens_per_s"]) for p in untried),
        "vs_landscape_rescaled": _median_error((by_key[landscapes.key(p["levers"])], speed * p["tokens_per_s"]) for p in untried),
    }


def _session(picks: list[dict], recheck: list[dict], tmp) -> tuple[list[dict], list[dict]]:
    """The picks' trials (one run each: the calibration's input) and the rechecked points' (two runs each:
    the same-session truth, their geometric mean), interleaved (a recheck, a pick, ..., then each recheck
    again in reverse) so that a change in the machine's load over the session lands on both alike."""
    runs: list[dict] = []
    first: list[dict] = []
    for i in range(max(len(picks), len(recheck))):
        if i < len(recheck):
            first.append(_measured(recheck[i], tmp / f"check{i}a", f"recheck {i + 1}/{len(recheck)}"))
        if i < len(picks):
            runs.append(_measured(picks[i], tmp / f"pick{i}", f"pick {i + 1}/{len(picks)}"))
    second = {}
    for i in reversed(range(len(recheck))):
        second[i] = _measured(recheck[i], tmp / f"check{i}b", f"recheck {i + 1}/{len(recheck)} again")
    checks = []
    for i, a in enumerate(first):
        both = [r["tokens_per_s"] for r in (a, second[i]) if r.get("status") == "ok" and r.get("tokens_per_s")]
        mean = statistics.geometric_mean(both) if both else None
        checks.append({**a, "tokens_per_s": mean, "tokens_per_s_runs": both})
    return runs, checks


def _config(levers: dict):
    from grpo_sweep.config.compose import compose_train_config

    return compose_train_config(["+sweeps=tiny_cpu_vllm", *(f"{k}={str(v).lower()}" for k, v in levers.items())])


def _prediction(levers: dict) -> dict:
    """The throughput model's phases at a point, as a trial's record carries them."""
    from grpo_sweep.memory.throughput import relative_step_time

    model = relative_step_time(_config(levers))
    return {
        "predicted_tokens_per_s": model["tokens_per_s"],
        "predicted_generation_s": model["generation_s"],
        "predicted_training_s": model["training_s"],
    }


def _measured(levers: dict, run_dir, label: str) -> dict:
    """One real trial of a point, its record with the model's prediction and the levers."""
    from grpo_sweep.trial.parent import run_trial

    record = {**run_trial(_config(levers), run_dir), **_prediction(levers), "levers": levers}
    print(f"[calibration] {label}: {record.get('status')} {record.get('tokens_per_s')}", flush=True)
    return record


def _brief(r: dict) -> dict:
    keys = ("levers", "status", "tokens_per_s", "tokens_per_s_runs", "generation_s", "training_s", "predicted_generation_s")
    keys += ("predicted_training_s",)
    return {k: r.get(k) for k in keys}


def _median_error(pairs) -> float | None:
    errors = [abs(predicted / measured - 1) for predicted, measured in pairs if predicted and measured]
    return statistics.median(errors) if errors else None


def published_at_expected_length() -> dict:
    """The public GPU runs at the expected case (each run's logged mean completion length as
    task.expected_completion_tokens), as bench/published_runs.py judges them: its rows and per-split figures."""
    import published_runs

    result = published_runs.evaluate(published_runs.load())
    rows = [{k: r[k] for k in ("id", "split", "measured_s", "predicted_s", "factor")} for r in result["rows"]]
    return {"rows": rows, "splits": result["splits"]}


if __name__ == "__main__":
    out = main(fresh="--fresh" in sys.argv[1:], calibrate="--calibrate" in sys.argv[1:])
    print({k: v for k, v in out.items() if k != "first_pick"})
