"""The models' forecast before any trial: the model-first start (hydra.sweeper.start), `grpo-sweep
plan` (its verdicts are the pre-screen's, it imports no torch), and how far the model's ranking held
(Spearman's rho in the report)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap

import pytest
from helpers.runners import ROOT
from helpers.sweeper import tiny_sweeper

from grpo_sweep.config.validate import validate
from grpo_sweep.memory.estimator import estimate
from grpo_sweep.memory.throughput import relative_step_time
from grpo_sweep.units import budget_bytes
from hydra_plugins.grpo_optuna_sweeper import forecast, space
from hydra_plugins.grpo_optuna_sweeper.prescreen import Prescreen
from hydra_plugins.grpo_optuna_sweeper.start import MODEL_RANKING_ATTR, enqueue_frontier, pick

VLLM_SWEEP = "+sweeps=tiny_cpu_vllm"
PREFIX_FIXED = "backend.vllm_enable_prefix_caching=false"  # a lever the model does not price: 72 of the 144 points
# The Gemma 3 1B / L4 sweep cut down to 72 points (the rest fixed on the command line, as a user
# would): checked for the L4 (CUDA rules), estimated on this CPU-only machine.
GPU_SWEEP = "+sweeps=gemma3_1b_l4"
GPU_FIXED = [
    "lora_rank=32",
    "num_generations=4",
    "load_in_4bit=false",
    "lora=qv",
    "attn_implementation=sdpa",
    "optim=adamw_torch",
    "expandable_segments=false",
    "gradient_checkpointing_every_n_layers=1",
]


def _enqueued(study) -> list[dict]:
    return [t.system_attrs["fixed_params"] for t in study.get_trials(deepcopy=False)]


def test_model_start_enqueues_the_predicted_fastest_fits_first():
    """start=model queues the fastest predicted fits, fastest first, one per distinct prediction; each
    pick, composed afresh, fits by the estimator (vLLM starts) and has the throughput model's speed;
    start=memory queues the old fullest fits instead, start=none nothing."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with tiny_sweeper(PREFIX_FIXED, sweep=VLLM_SWEEP) as tiny:
        configs = tiny.compose.cache()
        study = optuna.create_study(direction="maximize")
        enqueue_frontier(study, tiny.plan, tiny.prescreen, configs, 4)
        picks = _enqueued(study)
        assert len(picks) == 4
        assert all(t.user_attrs["start"] == "model" for t in study.get_trials(deepcopy=False))

        forecasts = forecast.forecast(tiny.plan, tiny.prescreen, configs, lambda cfg: None)
        fitting = sorted((f for f in forecasts if f.fits), key=lambda f: -f.tokens_per_s)
        speeds = []
        for params in picks:  # each pick afresh: a full Hydra composition, the estimator, the throughput model
            cfg = tiny.compose([*tiny.plan.fixed, *(space.to_override(k, v) for k, v in params.items())])
            validate(cfg, cuda=False)
            assert estimate(cfg).fits, params
            speeds.append(relative_step_time(cfg)["tokens_per_s"])
        assert speeds == sorted(speeds, reverse=True)
        assert speeds[0] == pytest.approx(fitting[0].tokens_per_s)  # the fastest predicted fit runs first
        for a, b in zip(speeds, speeds[1:]):
            assert b < a * 0.999  # one pick per distinct prediction
            # no predicted fit with a distinct speed between two consecutive picks was skipped
            assert not [f for f in fitting if b * 1.001 < f.tokens_per_s < a * 0.999]
        assert all(p["gpu_memory_utilization"] != 0.004 for p in picks)  # vLLM cannot start there: never a fit

        ranking = study.user_attrs[MODEL_RANKING_ATTR]
        assert ranking["candidates"] == 72 and ranking["fit"] == len(fitting)
        assert [r["params"] for r in ranking["top"][:4]] == picks

        memory = optuna.create_study(direction="maximize")
        settings = {**tiny.plan.settings, "start": "memory"}
        from dataclasses import replace

        from omegaconf import OmegaConf

        plan = replace(tiny.plan, settings=OmegaConf.create(settings))
        enqueue_frontier(memory, plan, tiny.prescreen, configs, 4)
        fullness = [(f.params, f.share / f.waves if f.share <= 1 else f.share) for f in forecasts if f.share is not None]
        assert _enqueued(memory) == pick(fullness, 4, plan.settings.seed) != picks

        none = optuna.create_study(direction="maximize")
        plan = replace(tiny.plan, settings=OmegaConf.create({**settings, "start": "none"}))
        enqueue_frontier(none, plan, tiny.prescreen, configs, 4)
        assert none.get_trials() == []


HEAVY = ("torch", "transformers", "trl", "peft", "vllm", "unsloth", "bitsandbytes")


def _plan_in_a_fresh_interpreter(args: list[str], tmp_path) -> tuple[dict, str]:
    """(grpo-sweep plan --json's data, stdout) of the app's plan-only run (cli.plan.command), run in a
    fresh interpreter that says at exit which heavy packages it imported."""
    from grpo_sweep.cli.plan import command

    path = tmp_path / "plan.json"
    argv = command(args, path)
    assert argv[1:3] == ["-m", "grpo_sweep"]
    code = textwrap.dedent(f"""
        import atexit, runpy, sys
        atexit.register(lambda: print("HEAVY", sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))))
        sys.argv = ["grpo_sweep", *{argv[3:]!r}]
        runpy.run_module("grpo_sweep", run_name="__main__")
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads(path.read_text()), done.stdout


@pytest.mark.parametrize(
    "sweep,fixed,cuda",
    [(VLLM_SWEEP, [], False), (GPU_SWEEP, GPU_FIXED, True)],
    ids=["tiny_cpu_vllm", "gemma3_1b_l4"],
)
def test_plan_agrees_with_the_prescreen_and_imports_no_torch(sweep, fixed, cuda, tmp_path):
    """`grpo-sweep plan --json`: every point of the space judged, and the pre-screen's own verdict on
    a point (a full Hydra composition, checked for the target card, Prescreen.verdict as a trial gets
    it) is the plan's, for a seeded sample of its points and every pruned one; nothing heavy imported."""
    data, stdout = _plan_in_a_fresh_interpreter([sweep, *fixed], tmp_path)
    assert "HEAVY []" in stdout, stdout[-2000:]
    assert f"Plan for sweep {data['sweep']}: {data['space']['size']} points" in stdout
    points = data["points"]
    assert len(points) == data["space"]["size"] == data["judged"] and not data["sampled"]
    judged = [p for p in points if "error" not in p]
    assert data["prescreen"]["runs"] == sum(p["prescreen"] == "run" for p in judged)
    assert data["prescreen"]["pruned"] == sum(p["prescreen"] == "pruned" for p in judged)
    assert data["fit"] == sum(p["fits"] for p in judged)
    pruned = [p for p in judged if p["prescreen"] == "pruned"]
    sample = pruned[:6] + random.Random(0).sample([p for p in judged if p["prescreen"] == "run"], 6)
    with tiny_sweeper(*fixed, sweep=sweep) as tiny:
        prescreen = Prescreen(tiny.plan.settings)
        for p in sample:
            cfg = tiny.compose([*tiny.plan.fixed, *(space.to_override(k, v) for k, v in p["params"].items())])
            validate(cfg, cuda=cuda)
            verdict = prescreen.verdict(cfg, budget_bytes(cfg))
            assert ("run" if verdict.runs else "pruned") == p["prescreen"], p
            assert estimate(cfg).total_bytes == pytest.approx(p["predicted_peak_bytes"])
    fastest = data["fastest"]
    assert fastest and [r["rank"] for r in fastest] == list(range(1, len(fastest) + 1))
    speeds = [r["predicted_tokens_per_s"] for r in fastest]
    assert speeds == sorted(speeds, reverse=True)
    assert all(r["headroom_bytes"] == pytest.approx(r["limit_bytes"] - r["predicted_peak_bytes"]) for r in fastest)
    assert data["cheapest_concession"] == {"recipe_fits": True}


def test_plan_names_the_cheapest_fix_when_nothing_fits(tmp_path):
    """A card too small for every point: the plan says so and hands over the doctor's smallest fix;
    a bad start setting is one line, before anything is judged."""
    from grpo_sweep.cli import main

    data, stdout = _plan_in_a_fresh_interpreter(["+sweeps=tiny_cpu", "gpu.memory_gib=0.01"], tmp_path)
    assert data["fit"] == 0 and data["prescreen"]["runs"] == 0
    cheapest = data["cheapest_concession"]
    assert cheapest["recipe_fits"] is False and cheapest["source"] == "doctor"
    assert "no point of the space is predicted to fit" in stdout
    for arg, line in [
        ("hydra.sweeper.start=fastest", "hydra.sweeper.start='fastest': must be one of model, memory, none"),
    ]:
        bad = subprocess.run(
            [sys.executable, "-m", "grpo_sweep.cli", "plan", "+sweeps=tiny_cpu", arg, "--json"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert bad.returncode != 0 and bad.stdout == ""
        assert line in bad.stderr and "Traceback" not in bad.stderr
    assert main(["plan", "--help"]) == 0


def test_spearman_matches_scipy_and_handles_ties():
    from scipy.stats import spearmanr

    from grpo_sweep.report.trials import average_ranks, spearman

    rng = random.Random(3)
    for _ in range(20):
        a = [rng.choice([1.0, 2.0, 3.0, 4.0, 5.0]) for _ in range(7)]
        b = [rng.random() for _ in range(7)]
        ours = spearman(average_ranks(a), average_ranks(b))
        theirs = spearmanr(a, b).statistic
        assert ours == pytest.approx(theirs) if ours is not None else theirs != theirs  # all ties: NaN there
    assert average_ranks([3.0, 1.0, 2.0, 2.0]) == [1.0, 4.0, 2.5, 2.5]
    assert average_ranks([3.0, 1.0], best_first=False) == [2.0, 1.0]
    assert spearman([1.0], [1.0]) is None


def test_report_shows_predicted_against_measured_rank(tmp_path):
    """A real Optuna study: feasible configs with the model's tokens/s (a confirmation run pooled with
    its config), an OOM left out; report.html and the summary's line give rho and each config's ranks."""
    import optuna

    from grpo_sweep.report.build import build_for_study
    from grpo_sweep.report.trials import model_trust_line, model_vs_measured, trials_from_study

    dist = {"per_device_train_batch_size": optuna.distributions.CategoricalDistribution([1, 2, 4, 8])}
    study = optuna.create_study(direction="maximize", storage=f"sqlite:///{tmp_path / 's.db'}")
    rows = [(1, 100.0, 90.0), (2, 200.0, 150.0), (4, 300.0, 140.0)]  # batch, predicted, measured: 2 and 4 swap
    for batch, predicted, measured in rows:
        attrs = {"status": "ok", "tokens_per_s": measured, "predicted_tokens_per_s": predicted}
        study.add_trial(
            optuna.trial.create_trial(
                params={"per_device_train_batch_size": batch}, distributions=dist, value=measured, user_attrs=attrs
            )
        )
    confirm = {"status": "ok", "tokens_per_s": 150.0, "predicted_tokens_per_s": 300.0, "confirms": 2}  # config 4's second run
    study.add_trial(
        optuna.trial.create_trial(params={"per_device_train_batch_size": 4}, distributions=dist, value=150.0, user_attrs=confirm)
    )
    oom = {"status": "oom", "predicted_tokens_per_s": 400.0}
    study.add_trial(
        optuna.trial.create_trial(params={"per_device_train_batch_size": 8}, distributions=dist, value=0.0, user_attrs=oom)
    )
    result = model_vs_measured(trials_from_study(study))
    assert result["configs"] == 3  # the OOM is not ranked; trial 3 pooled with trial 2
    by_trial = {r["trial"]: (r["predicted_rank"], r["measured_rank"]) for r in result["rows"]}
    assert by_trial == {0: (3.0, 3.0), 1: (2.0, 1.0), 2: (1.0, 2.0)}  # config 4: median(140, 150) = 145 < 150
    assert result["rho"] == pytest.approx(0.5)
    line = model_trust_line(result)
    assert "Spearman rho 0.50" in line and "3 feasible configs" in line and "too few to tell" in line
    path, _ = build_for_study(study, tmp_path)
    html = path.read_text()
    assert "Model vs measured rank" in html and "Spearman rho 0.50" in html and "id=model-ranks" in html


def test_the_plan_counts_what_the_start_queues_and_says_one_point():
    """The plan's start line names as many points as the start queues: start_points=5, but the
    search phase's 4 trials leave room for 2 after tiny_cpu's 2 enqueue points. A space of one
    point is "1 point"."""
    from hydra_plugins.grpo_optuna_sweeper import preview

    with tiny_sweeper(n_trials=4, confirm_top=0, start_points=5) as tiny:
        data = preview.build(tiny.plan, tiny.compose)
    assert data["start"]["count"] == 2 and len(data["start"]["points"]) == 2
    assert "the first 2 search trials after the presets and enqueue points" in preview.format_text(data)
    with tiny_sweeper(params=None, enqueue=[], start_points=5) as tiny:
        text = preview.format_text(preview.build(tiny.plan, tiny.compose))
    assert "Plan for sweep tiny_cpu: 1 point in the space (no parameters)" in text


def test_plan_json_into_a_missing_folder_or_onto_a_full_disk_is_one_line(tmp_path, monkeypatch, capsys):
    """hydra.sweeper.plan_json in a folder that does not exist is refused before the plan is built;
    a write that fails (/dev/full: a full disk) is one line; `grpo-sweep plan --json` without a
    usable temporary folder is one line too. None is a traceback."""
    import tempfile
    from pathlib import Path

    from helpers.runners import cli

    from hydra_plugins.grpo_optuna_sweeper import preview

    missing = tmp_path / "no" / "plan.json"
    with tiny_sweeper(plan_json=str(missing)) as tiny:
        with pytest.raises(Exception) as err:  # Hydra may import the plugin's modules again: another class object
            preview.run(tiny.plan, tiny.compose)
    assert type(err.value).__name__ == "SweeperSettingError"
    assert (
        str(err.value)
        == f"hydra.sweeper.plan_json={missing}: its folder {missing.parent} does not exist; create it, or name a file in an existing folder"
    )
    assert capsys.readouterr().out == ""  # refused before the plan was built and printed
    if Path("/dev/full").exists():
        with tiny_sweeper(plan_json="/dev/full") as tiny:
            with pytest.raises(Exception) as err:
                preview.run(tiny.plan, tiny.compose)
        assert type(err.value).__name__ == "SweepError"
        assert str(err.value) == "hydra.sweeper.plan_json=/dev/full: cannot write it (No space left on device)"
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "gone"))
    out = cli("plan", "+sweeps=tiny_cpu", "--json")
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.strip() == (
        f"grpo-sweep plan --json: cannot use a temporary folder in {tmp_path / 'gone'} (No such file or directory); "
        "set TMPDIR to a writable folder with free space"
    )


def test_the_trust_line_says_when_rho_is_within_chance():
    """A rank correlation over few configs is said to be chance unless it clears 1.96 of its sd
    under no relation (1 / sqrt(n - 1)); past that, its sign and size are put in words."""
    from grpo_sweep.report.trials import model_trust_line

    def said(rho, n):
        return model_trust_line({"rho": rho, "configs": n}).split("; ")[-1]

    assert said(0.32, 7) == "over 7 configs a rho within +-0.80 is what chance gives: too few to tell)"
    assert said(0.85, 7) == "here the measured order follows it)"
    # Below 5 configs the bound exceeds 1: no rho can clear it, and no bound above 1 is printed.
    assert said(0.5, 3) == "over 3 configs any rho, even 1, is what chance can give: too few to tell)"
    assert said(-1.0, 4) == "over 4 configs any rho, even 1, is what chance can give: too few to tell)"
    assert said(1.0, 5) == "here the measured order follows it)"  # 1.96 / 2 = 0.98
    assert said(0.5, 26) == "here the measured order roughly follows it)"  # 1.96 / 5 = 0.39
    assert said(-0.6, 26) == "here the measured order runs against it)"


def _plan_data(tiny, cap: int) -> dict:
    """preview.build's data for a tiny_sweeper plan, judging at most `cap` points (the cap is set
    after tiny_sweeper: Hydra's plugin scan reloads the plugin's modules)."""
    from hydra_plugins.grpo_optuna_sweeper import preview

    kept = preview.PLAN_CANDIDATES
    preview.PLAN_CANDIDATES = cap
    try:
        return preview.build(tiny.plan, tiny.compose)
    finally:
        preview.PLAN_CANDIDATES = kept


def test_plan_judges_the_recipes_own_point_when_it_samples():
    """A sampled space whose drawn points all take a concession (lora_rank over 1..4096, the recipe's
    16 never drawn): the plan still judges the recipe's own point, the base config, by the same
    numbers as a trial's pre-screen, and says the full recipe fits instead of proposing a rank."""
    with tiny_sweeper("lora_rank=range(1,4097)", concessions=["lora_rank"]) as tiny:
        data = _plan_data(tiny, 32)
        assert data["sampled"] and data["judged"] == 32 and data["space"]["size"] == 4096 * 16
        assert all(p["params"]["lora_rank"] != 16 for p in data["points"])  # no drawn point holds the recipe
        assert data["cheapest_concession"] == {"recipe_fits": True}
        own = data["recipe_point"]
        cfg = tiny.compose(list(tiny.plan.fixed))
        validate(cfg, cuda=False)
        assert own["params"] == {} and own["fits"]
        assert own["predicted_peak_bytes"] == pytest.approx(estimate(cfg).total_bytes)
        from hydra_plugins.grpo_optuna_sweeper.preview import format_text

        text = format_text(data)
        assert "Recipe's own point (the base config): peak" in text and "Recipe: the full recipe fits" in text


def test_plan_judges_the_recipe_at_other_knobs_when_the_space_leaves_it_out():
    """A 61 MiB card, where the recipe's own micro-batch 4 does not fit, and a rank concession whose
    choices (8, 32) leave out the recipe's 16: no point of the space runs the full recipe, yet at
    micro-batch 1 or 2 it fits. The plan judges the recipe over the knobs too and says it fits,
    instead of proposing a rank."""
    with tiny_sweeper("gpu.memory_gib=0.06", "lora_rank=choice(8,32)", concessions=["lora_rank"]) as tiny:
        data = _plan_data(tiny, 512)
        assert not data["sampled"] and all(p["params"]["lora_rank"] != 16 for p in data["points"])
        assert data["cheapest_concession"] == {"recipe_fits": True}
        assert data["recipe_point"]["fits"] is False and data["recipe_knob_points"] == 16


def _start_and_prepare(tiny) -> list[dict]:
    """The start's queued points (enqueue_start on a fresh in-memory study), each then asked and
    prepared as the loop does: none may be refused (status invalid: a counted trial)."""
    import optuna

    from hydra_plugins.grpo_optuna_sweeper.prepare import prepare
    from hydra_plugins.grpo_optuna_sweeper.start import enqueue_start

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize")
    enqueue_start(study, tiny.plan, tiny.prescreen, tiny.compose)
    queued = [t.system_attrs["fixed_params"] for t in study.get_trials(deepcopy=False)]
    for _ in queued:
        prepared = prepare(study.ask(), tiny.plan, tiny.prescreen, tiny.compose)
        assert prepared.outcome is None or prepared.outcome.attrs.get("status") != "invalid", prepared.outcome.attrs
    return queued


REFUSED = "changes the recipe's optimiser_steps_per_generation, not in hydra.sweeper.concessions"


def test_a_micro_batch_that_changes_the_recipe_is_never_proposed(caplog):
    """steps_per_generation=4 fixed on tiny_cpu (8 completions per step, the base micro-batch 4: one
    generation feeds 2 optimiser steps): every other micro-batch changes the recipe's
    optimiser_steps_per_generation, so the space keeps micro-batch 4 alone (said in one log line, as
    a micro-batch that does not divide the held total is dropped); the start queues neither of
    tiny_cpu's enqueued micro-batches 1 and 8. With no micro-batch left, the sweep is refused in one line."""
    import logging

    with caplog.at_level(logging.INFO), tiny_sweeper("steps_per_generation=4") as tiny:
        assert list(tiny.plan.distributions["per_device_train_batch_size"].choices) == [4]
        data = _plan_data(tiny, 512)
        assert data["not_judged"]["count"] == 0 and data["recipe_point"]["fits"] and data["start"]["points"]
        queued = _start_and_prepare(tiny)
        assert queued and all(p["per_device_train_batch_size"] == 4 for p in queued)
    assert "per_device_train_batch_size [1, 2, 8] dropped (they change the recipe's optimiser_steps_per_generation" in caplog.text
    from hydra_plugins.grpo_optuna_sweeper.config import SweeperSettingError

    with (
        pytest.raises(SweeperSettingError) as err,
        tiny_sweeper("steps_per_generation=4", "per_device_train_batch_size=choice(1,2)"),
    ):
        pass
    assert str(err.value).startswith(
        "hydra.sweeper.params.per_device_train_batch_size=[1, 2]: every value changes the recipe's optimiser_steps_per_generation"
    )


def test_plan_and_start_never_propose_a_point_the_sweeper_refuses():
    """steps_per_generation searched over (2, 4) beside the micro-batch (the base: one generation per
    optimiser step): a point whose steps_per_generation exceeds its accumulation changes the
    recipe, 12 of the 32. The plan calls each refused, with the sweeper's reason, and proposes none;
    the start queues none (a refused `enqueue` point is dropped, a frontier pick is never one), and
    every point it queues passes prepare, the sweeper's own check: no refusal takes a counted trial."""
    enqueue = [
        {"per_device_train_batch_size": 8, "steps_per_generation": 4},
        {"per_device_train_batch_size": 2, "steps_per_generation": 2},
    ]
    with tiny_sweeper("steps_per_generation=choice(2,4)", enqueue=enqueue) as tiny:
        data = _plan_data(tiny, 512)

        def refused(p):
            return p["steps_per_generation"] > 8 // p["per_device_train_batch_size"]

        for p in data["points"]:
            assert ("error" in p) == refused(p["params"]), p
            assert "error" not in p or p["error"] == REFUSED
        assert data["not_judged"]["count"] == 12 and data["recipe_point"]["fits"]
        assert data["start"]["points"] and not any(refused(p) for p in data["start"]["points"])
        queued = _start_and_prepare(tiny)
        assert len(queued) > 1 and not any(refused(p) for p in queued) and enqueue[1] in queued


SHIPPED_SWEEPS = sorted(p.stem for p in (ROOT / "conf" / "sweeps").glob("*.yaml"))


@pytest.mark.parametrize("sweep", SHIPPED_SWEEPS)
def test_every_shipped_sweep_plans(sweep):
    """`grpo-sweep plan +sweeps=<each shipped sweep>` builds (16 points judged: the cap is not the
    subject): the recipe's own point is judged, and a continuous interval (llama3_2_1b_a100's
    gpu_memory_utilization) is drawn within its ends as a large space is sampled."""
    from optuna.distributions import FloatDistribution

    with tiny_sweeper(sweep=f"+sweeps={sweep}") as tiny:
        data = _plan_data(tiny, 16)
        assert data["judged"] == min(16, data["space"]["size"] or 16)
        for key, dist in tiny.plan.distributions.items():
            if isinstance(dist, FloatDistribution) and dist.step is None:
                assert data["space"]["size"] is None and data["sampled"]
                drawn = {p["params"][key] for p in data["points"]}
                assert len(drawn) > 8 and all(dist.low <= v <= dist.high for v in drawn), drawn
        assert "error" not in data["recipe_point"], data["recipe_point"]


def test_a_fixed_group_choice_beside_the_searched_micro_batch():
    """`python train.py -m +sweeps=tiny_cpu gpu=cpu_sim model=tiny`: a group chosen on the command line
    whose key is also a schema field (gpu, model) is composed as a group when the plan checks each
    micro-batch against the held recipe, not merged as a value (which Hydra refuses: "Error merging
    override gpu=cpu_sim"). The device check's sweep case passes such overrides."""
    with tiny_sweeper("gpu=cpu_sim", "model=tiny") as tiny:
        assert list(tiny.plan.distributions["per_device_train_batch_size"].choices) == [1, 2, 4, 8]
        assert "gpu=cpu_sim" in tiny.plan.fixed and "model=tiny" in tiny.plan.fixed
