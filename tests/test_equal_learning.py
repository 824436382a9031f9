"""Equal learning: every setting has a kind, the recipe is held, concessions are opt-in and priced.

Real sweeps (`python train.py -m +sweeps=...`: Hydra, our sweeper, real tiny GRPO trials, the journal
storage) where a behaviour needs them; the price-tag rule also on real Optuna trials built by hand.
"""

from __future__ import annotations

import json
import shutil
from copy import deepcopy
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from helpers.config import compose
from helpers.runners import SPLIT_SPACE, read_csv, sweep_args, train_here
from helpers.studies import load_study
from helpers.sweeper import tiny_sweeper

from grpo_sweep.config.schema import SCHEMA_KEYS, ConfigError
from grpo_sweep.config.validate import validate
from grpo_sweep.levers import EXTRA_LEVER_NAMES, KINDS, KNOB, LEVER_NAMES, RECIPE, kind_of, recipe_of
from grpo_sweep.report.learning import compare, fingerprint


def test_every_lever_and_companion_has_a_kind():
    companions = ("lora_alpha", "max_prompt_length", "gradient_checkpointing", "expandable_segments", "learning_rate", "beta")
    for name in (*LEVER_NAMES, *EXTRA_LEVER_NAMES, *companions, "completions_per_step"):
        assert name in KINDS and KINDS[name].why, name
        assert name in SCHEMA_KEYS, f"{name}: a kind for a key the schema does not have"
    # the split of a held total, and the knobs the issue names, are knobs; what is learned is recipe
    knobs = ("per_device_train_batch_size", "gradient_accumulation_steps", "gradient_checkpointing", "gpu_memory_utilization")
    assert all(kind_of(k) == KNOB for k in (*knobs, "expandable_segments", "backend.vllm_enable_sleep_mode"))
    recipe = ("completions_per_step", "num_generations", "max_seq_length", "max_prompt_length", "lora_rank")
    assert all(kind_of(k) == RECIPE for k in (*recipe, "lora_target_modules", "load_in_4bit", "learning_rate"))
    assert kind_of("trial.steps") == KNOB and kind_of("trial.full_finetune") == RECIPE
    assert kind_of("some_new_setting") == RECIPE  # unknown: it must be declared to be changed


def test_completions_per_step_derives_the_accumulation():
    cfg = validate(compose(["completions_per_step=8", "per_device_train_batch_size=2", "num_generations=2"]))
    assert (cfg.per_device_train_batch_size, cfg.gradient_accumulation_steps) == (2, 4)
    assert recipe_of(cfg)["completions_per_step"] == 8
    plain = validate(compose(["per_device_train_batch_size=2", "gradient_accumulation_steps=3", "num_generations=2"]))
    assert recipe_of(plain)["completions_per_step"] == 6  # null: batch x accumulation, as before
    assert validate(compose([])).gradient_accumulation_steps == 1
    with pytest.raises(
        ConfigError, match=r"per_device_train_batch_size=3 does not divide completions_per_step=8 .*\[1, 2, 4, 8\]"
    ):
        validate(compose(["completions_per_step=8", "per_device_train_batch_size=3"]))


def test_a_contradictory_split_is_one_line_before_any_model_loads(tmp_path):
    result = train_here(
        [
            "completions_per_step=8",
            "per_device_train_batch_size=4",
            "gradient_accumulation_steps=3",
            f"hydra.run.dir={tmp_path}/run",
        ]
    )
    assert result.returncode != 0
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert lines == [
        "Invalid configuration: completions_per_step=8 contradicts per_device_train_batch_size=4 x gradient_accumulation_steps=3 "
        "= 12: set completions_per_step and the batch (the accumulation is derived), or gradient_accumulation_steps=null"
    ], lines
    assert not (tmp_path / "run" / "metrics.json").exists()  # no trial started


def test_the_plan_holds_the_split_and_is_frozen():
    """build_plan holds completions_per_step as a fixed override (the accumulation derived from it),
    keeps only the micro-batches that divide it, and what it returns cannot be changed afterwards."""
    import dataclasses

    with tiny_sweeper("per_device_train_batch_size=choice(1,3,4,8)", "gradient_accumulation_steps=2") as tiny:
        plan = tiny.plan
        assert plan.fixed[-2:] == ("completions_per_step=8", "gradient_accumulation_steps=null")
        assert "gradient_accumulation_steps=2" not in plan.fixed
        assert plan.distributions["per_device_train_batch_size"].choices == (1, 4, 8)  # 3 does not divide 8
        assert (plan.n_trials, plan.objective, plan.concessions) == (8, "tokens_per_s", ())
        with pytest.raises(dataclasses.FrozenInstanceError):
            plan.n_trials = 1  # type: ignore[misc]
        with pytest.raises(Exception, match="read-only"):
            plan.settings.n_trials = 1


def test_every_shipped_sweep_holds_its_recipe():
    """Each sweep file passes the recipe check, and its knobs only ever split the held total."""
    from grpo_sweep.config.compose import CONF_DIR

    for path in sorted((CONF_DIR / "sweeps").glob("*.yaml")):
        with tiny_sweeper(sweep=f"+sweeps={path.stem}") as tiny:
            plan = tiny.plan
            cps = plan.recipe["completions_per_step"]
            dist = plan.distributions.get("per_device_train_batch_size")
            assert dist is not None and all(cps % b == 0 for b in dist.choices), path.stem
            if not plan.concessions:
                assert not plan.concession_params, path.stem
            assert "gradient_accumulation_steps" not in plan.distributions


@pytest.mark.parametrize(
    ("param", "names"),
    [
        ("max_seq_length=choice(64,128)", "max_seq_length"),
        ("lora=choice(qv,all_linear)", "lora_target_modules"),  # a group: found by composing its choices
        ("gradient_accumulation_steps=choice(1,2)", "search per_device_train_batch_size"),
        ("+trial.grpo_config.temperature=choice(0.7,1.0)", "concessions=[trial.grpo_config.temperature]"),
        ("seed=choice(0,1)", "seed: the seed"),
    ],
)
def test_a_recipe_change_not_declared_stops_before_any_trial(tmp_path, param, names):
    result = train_here(sweep_args(tmp_path / "sweep", param, "hydra.sweeper.n_trials=1"))
    assert result.returncode != 0
    first = result.stderr.strip().splitlines()[0]
    assert first.startswith(f"hydra.sweeper.params.{param.split('=')[0]}:") and names in first, result.stderr[-2000:]
    assert "concessions" in first
    assert "Traceback" not in result.stderr + result.stdout
    assert not (tmp_path / "sweep" / "study.journal").exists()  # no study, no trial


def test_a_bad_concession_name_is_refused(tmp_path):
    result = train_here(sweep_args(tmp_path / "sweep", "hydra.sweeper.concessions=[gradient_checkpointing]"))
    assert result.returncode != 0
    assert result.stderr.startswith("hydra.sweeper.concessions: gradient_checkpointing is a knob"), result.stderr[-2000:]


@pytest.mark.slow
def test_a_knob_sweep_trains_one_recipe_and_records_it(tiny_sweep, tmp_path):
    """tiny_cpu (the run's `tiny_sweep`): every trial's metrics.json has completions_per_step=8 and a split that makes
    8; the study, best.yaml and a resumed sweep with another recipe (on a copy of the study) agree."""
    sweep_dir, result = tiny_sweep
    study = load_study(f"journal:{sweep_dir / 'study.journal'}")
    assert study.user_attrs["recipe"]["completions_per_step"] == 8 and study.user_attrs["concessions"] == []
    splits, trained = set(), []
    for t in study.trials:
        metrics = json.loads((Path(t.user_attrs["run_dir"]) / "metrics.json").read_text())
        assert metrics["completions_per_step"] == 8 and metrics["recipe"] == study.user_attrs["recipe"]
        eff = metrics["effective"]
        assert eff["per_device_train_batch_size"] * eff["gradient_accumulation_steps"] == 8, eff
        assert t.user_attrs["concessions_taken"] == {}
        splits.add(eff["per_device_train_batch_size"])
        if metrics["status"] == "ok":
            trained.append((t.number, metrics, 0))
    assert splits == {1, 2, 4, 8}  # four splits of the same 8 completions (8 x 1 is the OOM)
    # The learning checked from the trials' own numbers: every split trained the same first two steps.
    assert len(trained) >= 3 and all({"grad_norm@1", "grad_norm@2", "entropy@1"} <= set(fingerprint(m)) for _, m, _ in trained)
    assert compare(trained) == {}, compare(trained)
    number, record, _ = trained[-1]
    nudged = deepcopy(record)
    nudged["history"][1]["grad_norm"] *= 1.01  # one trial whose second step moved by 1 %: named, with its numbers
    flagged = compare([*trained[:-1], (number, nudged, 0)])
    assert list(flagged) == [number] and "grad_norm@2" in flagged[number].text and "+1.00%" in flagged[number].text, flagged
    best = yaml.safe_load((sweep_dir / "best.yaml").read_text())
    assert best["recipe"] == study.user_attrs["recipe"] and "concessions" not in best
    assert "Recipe held: completions_per_step=8" in result.stdout

    copy = tmp_path / "sweep"
    copy.mkdir()
    shutil.copy(sweep_dir / "study.journal", copy / "study.journal")
    other = train_here(sweep_args(copy, "hydra.sweeper.n_trials=6", "max_seq_length=96", file_space=True))  # another recipe
    assert other.returncode != 0
    first = other.stderr.strip().splitlines()[0]
    assert "is another search: recipe max_seq_length: the study has 128, this sweep 96." in first, other.stderr[-2000:]
    assert len(load_study(f"journal:{copy / 'study.journal'}").trials) == 6  # nothing added


@pytest.mark.slow
def test_a_concessions_sweep_prices_what_the_winner_gave_up(tmp_path):
    """tiny_cpu_concessions with chosen points: the full recipe (256 tokens, micro-batch 2) and one
    concession beside it (128 tokens, the same knobs). best.yaml, the printout and report.html carry
    price tags that match the trials' own metrics.json. Over 20 s: a real sweep, with the trials the price
    tags compare."""
    sweep_dir = tmp_path / "sweep"
    points = (
        "hydra.sweeper.enqueue=[{per_device_train_batch_size:2,max_seq_length:256,lora_rank:32,lora:all_linear},"
        "{per_device_train_batch_size:2,max_seq_length:128,lora_rank:32,lora:all_linear}]"
    )
    args = ["hydra.sweeper.n_trials=2", "hydra.sweeper.confirm_top=0", "hydra.sweeper.stop_below=0"]
    result = train_here([*sweep_args(sweep_dir, *args, sweep="tiny_cpu_concessions", file_space=True), points])
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {int(r["number"]): r for r in read_csv(sweep_dir / "trials.csv")}
    metrics = {n: json.loads((Path(r["run_dir"]) / "metrics.json").read_text()) for n, r in rows.items()}
    assert all(m["status"] == "ok" for m in metrics.values())
    tags = yaml.safe_load((sweep_dir / "best.yaml").read_text())["concessions"]
    full = tags["full_recipe"]
    assert full["fits"] is True and full["trial"] == 0
    assert full["objective"] == pytest.approx(metrics[0]["tokens_per_s"])
    assert full["peak_memory_bytes"] == metrics[0]["peak_memory_bytes"]
    winner = tags["winner"]["trial"]
    html = (sweep_dir / "report.html").read_text()
    assert "<h2>Concessions</h2>" in html
    if winner == 0:  # the full recipe was the fastest: nothing given up
        assert tags["taken"] == []
        assert "gave nothing up" in result.stdout
        return
    (row,) = tags["taken"]
    assert (row["setting"], row["recipe"], row["used"], row["basis"], row["vs_trial"]) == (
        "max_seq_length",
        256,
        128,
        "measured",
        0,
    )
    assert row["objective_ratio"] == pytest.approx(metrics[1]["tokens_per_s"] / metrics[0]["tokens_per_s"])
    assert (row["peak_at_recipe_bytes"], row["peak_used_bytes"]) == (
        metrics[0]["peak_memory_bytes"],
        metrics[1]["peak_memory_bytes"],
    )
    assert f"max_seq_length 256 -> 128: {row['bought']}" in result.stdout
    assert "(measured: trial 1 vs trial 0)" in result.stdout
    assert "<table id=concessions>" in html and row["bought"] in html


# --- the price-tag rule on real Optuna trials built by hand -------------------------------------------


def _trial(number, params, taken, *, status="ok", value=None, peak=None, predicted=None, state=None):
    import optuna
    from optuna.distributions import CategoricalDistribution

    dists = {k: CategoricalDistribution([v]) for k, v in params.items()}
    attrs = {"status": status, "concessions_taken": taken, "peak_memory_bytes": peak, "predicted_peak_bytes": predicted}
    attrs["budget_bytes"] = 100 * 2**20
    state = state or (optuna.trial.TrialState.COMPLETE if status in ("ok", "oom") else optuna.trial.TrialState.PRUNED)
    t = optuna.trial.create_trial(
        params=params,
        distributions=dists,
        value=value if state == optuna.trial.TrialState.COMPLETE else None,
        user_attrs=attrs,
        state=state,
    )
    t.number = number
    return t


def _price(trials, best):
    from hydra_plugins.grpo_optuna_sweeper.concessions import describe, price_tags

    recipe = {"completions_per_step": 8, "max_seq_length": 256, "lora_rank": 32}
    estimated = []

    def estimate_without(trial, setting):
        estimated.append((trial.number, setting))
        return {"peak_bytes": 150 * 2**20, "fits": False}

    tags = price_tags(
        trials,
        recipe,
        {"max_seq_length", "lora_rank"},
        is_ok=lambda t: t.state.name == "COMPLETE" and t.user_attrs["status"] == "ok",
        maximize=True,
        best=best,
        best_value=best.value if best else None,
        estimate_without=estimate_without,
        estimate_recipe=lambda: {"peak_bytes": 200 * 2**20, "budget_bytes": 100 * 2**20},
    )
    return tags, describe(tags, "tokens_per_s"), estimated


def test_price_tags_measured_from_twins_else_estimated():
    mib = 2**20
    full = _trial(0, {"b": 2, "max_seq_length": 256, "lora_rank": 32}, {}, value=100.0, peak=80 * mib)
    seq = _trial(1, {"b": 2, "max_seq_length": 128, "lora_rank": 32}, {"max_seq_length": 128}, value=150.0, peak=50 * mib)
    both = _trial(
        2, {"b": 2, "max_seq_length": 128, "lora_rank": 8}, {"max_seq_length": 128, "lora_rank": 8}, value=160.0, peak=45 * mib
    )
    tags, text, estimated = _price([full, seq, both], both)
    assert tags["full_recipe"]["trial"] == 0 and tags["full_recipe"]["fits"]
    rows = {r["setting"]: r for r in tags["taken"]}
    # lora_rank: its twin (the same knobs, max_seq_length still conceded) is trial 1 -> measured
    assert rows["lora_rank"]["basis"] == "measured" and rows["lora_rank"]["vs_trial"] == 1
    assert rows["lora_rank"]["objective_ratio"] == pytest.approx(160 / 150)
    assert rows["lora_rank"]["peak_saved_bytes"] == 5 * mib
    # max_seq_length: its twin would be (b=2, 256 tokens, rank 8): never run -> estimated and labelled so
    assert rows["max_seq_length"]["basis"] == "estimated" and estimated == [(2, "max_seq_length")]
    assert "lora_rank 32 -> 8: 1.07x objective, peak 50 -> 45 MiB (measured: trial 2 vs trial 1)" in text
    assert "max_seq_length 256 -> 128: it fits (at the recipe value the estimator predicts it would not)" in text
    assert "(estimated)" in text


def test_price_tags_when_the_full_recipe_does_not_fit():
    mib = 2**20
    oom = _trial(
        0, {"b": 2, "max_seq_length": 256, "lora_rank": 32}, {}, status="oom", value=0.0, peak=99 * mib, predicted=90 * mib
    )
    pruned = _trial(1, {"b": 4, "max_seq_length": 256, "lora_rank": 32}, {}, status="pruned", predicted=180 * mib)
    one = _trial(2, {"b": 2, "max_seq_length": 128, "lora_rank": 32}, {"max_seq_length": 128}, value=120.0, peak=60 * mib)
    two = _trial(
        3, {"b": 4, "max_seq_length": 128, "lora_rank": 8}, {"max_seq_length": 128, "lora_rank": 8}, value=200.0, peak=70 * mib
    )
    tags, text, _ = _price([oom, pruned, one, two], two)
    assert tags["full_recipe"]["fits"] is False
    assert "trial 0 (b=2 max_seq_length=256 lora_rank=32): oom, predicted 90 MiB of 100 MiB" in tags["full_recipe"]["reason"]
    assert tags["cheapest"]["trial"] == 2  # one concession beats two, even though trial 3 is faster
    assert tags["cheapest"]["concessions"] == {"max_seq_length": {"recipe": 256, "used": 128}}
    assert "cheapest concession that fits: max_seq_length 256 -> 128 (trial 2" in text
    rows = {r["setting"]: r for r in tags["taken"]}
    assert rows["max_seq_length"]["basis"] == "estimated"  # no trial at b=4, 128 tokens... with rank 8 at 256 tokens
    assert rows["lora_rank"]["basis"] == "estimated"
    # no trial ran the full recipe at all: the estimator's reason
    tags, _, _ = _price([one], one)
    assert tags["full_recipe"]["reason"].startswith("no trial ran the full recipe; the estimator predicts 200 MiB")


def test_best_yaml_writes_a_repeated_value_twice_not_as_an_alias():
    import yaml

    from hydra_plugins.grpo_optuna_sweeper.summary import _plain_dumper

    targets = ["q_proj", "v_proj"]
    text = yaml.dump({"recipe": {"lora_target_modules": targets}, "taken": [{"recipe": targets}]}, Dumper=_plain_dumper())
    assert "&id" not in text and "*id" not in text and text.count("q_proj") == 2


SHIPPED_SWEEPS = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "src/grpo_sweep/conf/sweeps").glob("*.yaml"))


@pytest.mark.parametrize("sweep", SHIPPED_SWEEPS)
def test_any_held_recipe_starts_any_shipped_sweep(sweep, caplog):
    """completions_per_step=6 held on every shipped sweep: the start points (enqueue, presets, the
    frontier) that the held recipe makes impossible are dropped with a log line, and every point
    queued is one the sweep can run: asked and prepared, none fails and nothing raises."""
    import logging
    from dataclasses import replace

    import optuna

    from hydra_plugins.grpo_optuna_sweeper.prepare import prepare
    from hydra_plugins.grpo_optuna_sweeper.start import enqueue_start

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with caplog.at_level(logging.INFO), tiny_sweeper("completions_per_step=6", sweep=f"+sweeps={sweep}") as tiny:
        plan = replace(tiny.plan, objective="tokens_per_s", n_search=tiny.plan.settings.n_trials)
        plan = replace(plan, n_trials=plan.n_search)
        study = optuna.create_study(direction="maximize")
        tiny.prescreen.learn(study)
        enqueue_start(study, plan, tiny.prescreen, tiny.compose)
        queued = sum(t.state.name == "WAITING" for t in study.trials)

        def prepared(trial):  # as the loop prepares a trial: its attributes recorded on it
            ready = prepare(trial, plan, tiny.prescreen, tiny.compose)
            ready.apply(trial)
            return ready.outcome

        for _ in range(queued):
            outcome = prepared(study.ask())
            assert outcome is None, (outcome.state, outcome.attrs)  # None: it would be launched
        # A point an earlier run of the study queued under another held recipe: bookkeeping, not a failure.
        study.enqueue_trial({"per_device_train_batch_size": 8})
        outcome = prepared(study.ask())
        if "per_device_train_batch_size" in plan.distributions:
            assert outcome.attrs["status"] == "surplus" and "start point dropped" in outcome.attrs["error"]
    if sweep == "tiny_cpu":  # its enqueued micro-batch 8 does not divide 6
        assert (
            "Start point enqueue[1]={'per_device_train_batch_size': 8} dropped: per_device_train_batch_size=8 is not in"
            in caplog.text
        )


def test_the_split_is_a_knob_under_dapo_and_recipe_under_bnpo():
    """TRL 1.16: dapo normalises over the accumulated batch (the split is a knob); bnpo over each
    micro-batch (the split changes the gradient: an undeclared concession is refused)."""
    from grpo_sweep.levers import CONDITIONS, kind_in

    assert kind_in("per_device_train_batch_size", {"loss_type": "dapo"}) == KNOB
    assert kind_in("per_device_train_batch_size", {"loss_type": "bnpo"}) == RECIPE
    assert CONDITIONS["per_device_train_batch_size"].source.startswith("TRL 1.16")
    assert recipe_of(compose(["loss_type=bnpo", "per_device_train_batch_size=2"]))["per_device_train_batch_size"] == 2
    assert "per_device_train_batch_size" not in recipe_of(compose([]))
    assert recipe_of(compose([]))["loss_type"] == "dapo"
    with tiny_sweeper() as tiny:  # dapo (the default): the split is searched
        assert "per_device_train_batch_size" in tiny.plan.distributions and not tiny.plan.concession_params
    # Exception: Hydra's plugin discovery may import the sweeper's modules again (another class object)
    with pytest.raises(Exception, match=r"per_device_train_batch_size: bnpo normalises each micro-batch"):
        with tiny_sweeper("loss_type=bnpo"):
            pass
    # declared: searched, and priced as a concession
    with tiny_sweeper("loss_type=bnpo", concessions=["per_device_train_batch_size"]) as tiny:
        assert tiny.plan.concession_params == {"per_device_train_batch_size": {"per_device_train_batch_size"}}


def test_loss_type_is_recipe_and_checked_before_any_model_loads():
    assert kind_of("loss_type") == RECIPE and "loss_type" in SCHEMA_KEYS
    with pytest.raises(ConfigError, match=r"^loss_type=bnp: must be one of dapo, grpo, dr_grpo, cispo, sapo, bnpo$"):
        validate(compose(["loss_type=bnp"]))


def test_trl_to_vllm_is_recipe_while_the_importance_sampling_correction_is_on():
    from grpo_sweep.levers import kind_in

    assert recipe_of(compose(["backend=trl"]))["vllm_importance_sampling_correction"] is True  # TRL's default
    assert kind_in("backend", recipe_of(compose([]))) == RECIPE
    assert kind_in("backend", {"vllm_importance_sampling_correction": False}) == KNOB
    # A sweep searching the engine must declare it.
    with pytest.raises(Exception, match=r"hydra.sweeper.params.backend: changes the recipe \(backend: the correction"):
        with tiny_sweeper("backend=choice(trl,trl_vllm)"):
            pass
    with tiny_sweeper("backend=choice(trl,trl_vllm)", concessions=["backend"]) as tiny:  # declared: searched
        assert tiny.plan.concession_params == {"backend": {"backend"}}


def test_loss_type_reaches_trls_grpo_config(tmp_path):
    """A real CPU trial: TRL's own GRPOConfig, read back from the built trainer into metrics.json, trains bnpo;
    the recorded recipe holds it and, under bnpo, the micro-batch. Over 20 s: one real trial (and the warm
    model's build when the cache is cold)."""
    from helpers.runners import FAST, load_metrics

    result = train_here(["loss_type=bnpo", *FAST, f"hydra.run.dir={tmp_path}"])
    assert result.returncode == 0, result.stderr[-3000:]
    m = load_metrics(tmp_path)
    assert m["status"] == "ok", m.get("error")
    assert m["trainer_settings"]["grpo_config"]["loss_type"] == "bnpo"
    assert (
        m["recipe"]["loss_type"] == "bnpo"
        and m["recipe"]["per_device_train_batch_size"] == m["trainer_settings"]["grpo_config"]["per_device_train_batch_size"]
    )


def test_the_trainer_knobs_reach_trls_grpo_config(tmp_path):
    """The trainer settings that run on CPU, in one real CPU trial, read back from TRL's GRPOConfig in
    metrics.json and parsed from the export by `trl grpo`'s own parser: steps_per_generation (at the
    accumulation: a knob), optim, attn_implementation, checkpointing every 2nd layer (still so after TRL
    turned it off and on around each generation), torch_empty_cache_steps, pad_to_multiple_of, transformers'
    continuous batching (a small paged cache: sized by default from the host's RAM, its first generation takes
    about a minute on CPU), torch_compile (the compiled wrapper built, and TorchDynamo's frames counted: none) and the fp32 LM head (recipe; random untied weights: TRL 1.16 refuses it tied
    under LoRA). Over 20 s: one real trial with gradient checkpointing."""
    from helpers.runners import FAST, load_metrics
    from trl.scripts.grpo import make_parser

    from grpo_sweep.report.export import export_trial

    knobs = [
        "per_device_train_batch_size=4",
        "gradient_accumulation_steps=2",
        "steps_per_generation=1",
        "optim=adamw_torch_fused",
        "attn_implementation=eager",
        "gradient_checkpointing=true",
        "gradient_checkpointing_every_n_layers=2",
        "torch_empty_cache_steps=1",
        "pad_to_multiple_of=8",
        "use_transformers_continuous_batching=true",
        "+trial.grpo_config={transformers_continuous_batching_config:{num_blocks:64,max_batch_tokens:256}}",
        "cast_lm_head_to_fp32=true",
        "torch_compile=true",
        "model.init=random",
        "model.arch.tie_word_embeddings=false",
    ]
    result = train_here([*knobs, *FAST, f"hydra.run.dir={tmp_path}"])
    assert result.returncode == 0, result.stderr[-3000:]
    m = load_metrics(tmp_path)
    assert m["status"] == "ok", m.get("error")
    grpo = m["trainer_settings"]["grpo_config"]
    assert (grpo["steps_per_generation"], m["effective"]["generation_batch_size"]) == (1, 4)
    assert m["trainer_settings"]["attn_implementation"] == "eager"
    assert "generation_batch_size" not in grpo  # the export's config: TRL refuses both set
    assert grpo["optim"] == "adamw_torch_fused" and grpo["torch_compile"] is True
    # torch_compile wraps the model (an OptimizedModule), and TRL 1.16's GRPO steps never call the wrapper:
    # TorchDynamo sees no frame. Recorded, so a user sees the setting did nothing; no shipped sweep searches it.
    assert m["effective"]["compiled_model"] == "OptimizedModule"
    assert m["effective"]["dynamo_frames_seen"] == m["effective"]["compiled_frames"] == 0
    assert m["recipe"]["optimiser_steps_per_generation"] == 1 and m["recipe"]["optim"] == "adamw"
    assert grpo["gradient_checkpointing_kwargs"] == {"every_n_layers": 2}
    assert m["effective"]["checkpointed_layers_after_train"] == 1  # layer 0 of the tiny model's 2
    assert (grpo["torch_empty_cache_steps"], grpo["pad_to_multiple_of"]) == (1, 8)
    assert grpo["use_transformers_continuous_batching"] is True and grpo["cast_lm_head_to_fp32"] is True
    assert m["recipe"]["cast_lm_head_to_fp32"] is True
    export_trial(tmp_path, tmp_path / "export")
    assert "stock trl grpo needs the same" in (tmp_path / "export" / "best.trl.yaml").read_text()
    _, parsed, _, _ = make_parser().parse_args_and_config(args=["--config", str(tmp_path / "export" / "best.trl.yaml")])
    assert parsed.gradient_checkpointing_kwargs == {"every_n_layers": 2} and parsed.gradient_checkpointing
    assert (parsed.torch_empty_cache_steps, parsed.pad_to_multiple_of) == (1, 8)
    assert parsed.use_transformers_continuous_batching and parsed.cast_lm_head_to_fp32


def test_trainer_knob_kinds_and_their_invalid_values():
    from grpo_sweep.levers import CONDITIONS, kind_in

    for key in ("steps_per_generation", "optim", "torch_compile", "attn_implementation"):
        assert kind_of(key) == KNOB and key in SCHEMA_KEYS, key
    assert CONDITIONS["steps_per_generation"].source.startswith("TRL 1.16")
    reuse = recipe_of(compose(["steps_per_generation=2"]))  # accumulation 1: each generation feeds 2 steps
    assert reuse["optimiser_steps_per_generation"] == 2 and kind_in("steps_per_generation", reuse) == RECIPE
    assert recipe_of(compose(["optim=adamw_torch_fused"]))["optim"] == recipe_of(compose([]))["optim"] == "adamw"
    assert kind_in("optim", {"optim": "adamw_8bit"}) == RECIPE
    for override, line in (
        ("optim=sgdx", r"^optim=sgdx: must be one of adamw_torch, adamw_torch_fused, adamw_8bit"),
        ("attn_implementation=flash", r"^attn_implementation=flash: must be one of null, eager, sdpa$"),
        ("steps_per_generation=0", r"^steps_per_generation=0: must be >= 1, or null$"),
    ):
        with pytest.raises(ConfigError, match=line):
            validate(compose([override]))
    with tiny_sweeper("optim=choice(adamw_torch,adamw_torch_fused)") as tiny:  # two AdamW implementations: knobs
        assert "optim" not in tiny.plan.concession_params
    with pytest.raises(Exception, match=r"hydra.sweeper.params.optim: changes the recipe \(optim: .*8-bit ones are recipe"):
        with tiny_sweeper("optim=choice(adamw_torch,adamw_8bit)"):
            pass


def test_the_importance_sampling_correction_is_a_recipe_override_that_reaches_grpo_config(tmp_path):
    """Off, trl <-> trl_vllm trains one loss (the engine is a knob); the value is recorded in the recipe and
    passed to TRL's real GRPOConfig, which keeps it."""
    from trl import GRPOConfig

    from grpo_sweep.levers import kind_in
    from grpo_sweep.trial.backends import trl as trl_backend

    assert kind_of("vllm_importance_sampling_correction") == RECIPE
    off = validate(compose(["vllm_importance_sampling_correction=false"]))
    assert recipe_of(off)["vllm_importance_sampling_correction"] is False
    assert kind_in("backend", recipe_of(off)) == KNOB
    assert recipe_of(off) != recipe_of(compose([]))  # a study of one never resumes as the other
    args = trl_backend.grpo_args(off, on_cuda=False, output_dir=str(tmp_path))
    assert GRPOConfig(**args).vllm_importance_sampling_correction is False
    assert "vllm_importance_sampling_correction" in trl_backend.EXPORTED_ARGS


def test_the_new_trainer_settings_kinds_ranges_and_an_unchanged_recipe():
    """Knobs but cast_lm_head_to_fp32 (recipe), each kind with its upstream source; bad values are one line;
    an existing config's recipe is what it was before these settings existed (no new key)."""
    knobs = (
        "gradient_checkpointing_every_n_layers",
        "gradient_checkpointing_offload",
        "torch_empty_cache_steps",
        "pad_to_multiple_of",
        "use_transformers_continuous_batching",
    )
    for key in (*knobs, "cast_lm_head_to_fp32"):
        assert key in SCHEMA_KEYS and ("TRL 1.16" in KINDS[key].why or "transformers 5.17" in KINDS[key].why), key
    assert all(kind_of(k) == KNOB for k in knobs) and kind_of("cast_lm_head_to_fp32") == RECIPE
    plain = recipe_of(compose([]))
    assert "cast_lm_head_to_fp32" not in plain  # off (TRL's default): a resumed study keeps its identity
    assert recipe_of(compose([f"{k}={v}" for k, v in zip(knobs, (2, "false", 4, 8, "true"), strict=True)])) == plain
    assert recipe_of(compose(["cast_lm_head_to_fp32=true"]))["cast_lm_head_to_fp32"] is True
    for override, line in (
        ("gradient_checkpointing_every_n_layers=0", r"^gradient_checkpointing_every_n_layers=0: must be >= 1$"),
        ("torch_empty_cache_steps=0", r"^torch_empty_cache_steps=0: must be >= 1, or null$"),
        ("pad_to_multiple_of=0", r"^pad_to_multiple_of=0: must be >= 1, or null$"),
        (  # read only with checkpointing on: with it off, the setting would do nothing
            "gradient_checkpointing_every_n_layers=5",
            r"^gradient_checkpointing_every_n_layers=5: only with gradient_checkpointing=true \(transformers reads it "
            r"only then\); use 1, or gradient_checkpointing=true$",
        ),
    ):
        with pytest.raises(ConfigError, match=line):
            validate(compose([override]))
    validate(compose(["gradient_checkpointing=true", "gradient_checkpointing_every_n_layers=5"]))


def test_checkpointing_settings_reach_gradient_checkpointing_kwargs_only_when_checkpointing():
    """transformers reads gradient_checkpointing_kwargs only with checkpointing on; the defaults pass nothing, so
    GRPOConfig is what it was before; Unsloth gets its own offloaded or plain checkpointing."""
    from trl import GRPOConfig

    from grpo_sweep.trial.backends import trl as trl_backend
    from grpo_sweep.trial.backends import unsloth

    def args(*overrides):
        return trl_backend.grpo_args(compose(list(overrides)), on_cuda=False, output_dir="/o")

    assert "gradient_checkpointing_kwargs" not in args("gradient_checkpointing=true")
    assert "gradient_checkpointing_kwargs" not in args("gradient_checkpointing=false", "gradient_checkpointing_every_n_layers=2")
    on = args("gradient_checkpointing=true", "gradient_checkpointing_every_n_layers=3", "gradient_checkpointing_offload=true")
    assert on["gradient_checkpointing_kwargs"] == {"every_n_layers": 3, "offload": True}
    assert GRPOConfig(**on).gradient_checkpointing_kwargs == {"every_n_layers": 3, "offload": True}
    assert not {"torch_empty_cache_steps", "pad_to_multiple_of"} & set(args())  # null: TRL's own defaults
    assert GRPOConfig(**args()).pad_to_multiple_of is None  # TRL's "auto" off Neuron
    peft = {
        v: unsloth.peft_kwargs(compose(["backend=unsloth", "gradient_checkpointing=true", f"gradient_checkpointing_offload={v}"]))
        for v in ("null", "true", "false")
    }
    assert [peft[v]["use_gradient_checkpointing"] for v in ("null", "true", "false")] == ["unsloth", "unsloth", True]
    with pytest.raises(ConfigError, match=r"^gradient_checkpointing_every_n_layers=2: not with backend=unsloth"):
        validate(compose(["backend=unsloth", "gradient_checkpointing_every_n_layers=2"]))


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (
            ["gradient_checkpointing=true", "gradient_checkpointing_offload=true"],
            "Invalid configuration: gradient_checkpointing_offload=true (checkpoints offloaded to pinned host memory): "
            "no CUDA device is available here. Use load_in_4bit=false and backend=trl (or auto) on CPU, "
            "gradient_checkpointing_offload=null.",
        ),
        (
            ["backend=unsloth", "gradient_checkpointing=true", "gradient_checkpointing_offload=false"],
            "Invalid configuration: backend=unsloth (it runs on CUDA only): no CUDA device is available here",
        ),
        (
            ["cast_lm_head_to_fp32=true"],
            "Invalid configuration: cast_lm_head_to_fp32=true: not with tied embeddings and a LoRA adapter (model=tiny "
            "has tie_word_embeddings=true; TRL 1.16 supports it with untied ones); use false, a model with "
            "tie_word_embeddings=false, or trial.full_finetune=true",
        ),
        (
            ["backend=trl_vllm", "use_transformers_continuous_batching=true"],
            "Invalid configuration: use_transformers_continuous_batching=true: HF generation only, and backend=trl_vllm "
            "generates with vLLM (TRL uses vLLM first); use backend=trl",
        ),
        (
            ["backend=trl_vllm", "gpu=cpu_sim", "backend.vllm_kv_cache_memory_bytes=1"],
            "Invalid configuration: backend.vllm_kv_cache_memory_bytes=1: too small for one sequence of max_model_len",
        ),
    ],
    ids=["offload-on-cpu", "unsloth-on-cpu", "fp32-head-tied", "continuous-batching-with-vllm", "kv-bytes-too-small"],
)
def test_a_trainer_setting_this_machine_cannot_run_is_one_line_before_any_model_loads(tmp_path, overrides, line):
    result = train_here([*overrides, f"hydra.run.dir={tmp_path}/run"])
    assert result.returncode != 0
    lines = [x for x in (result.stdout + result.stderr).splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith(line), lines
    assert not (tmp_path / "run" / "metrics.json").exists()  # no trial started


@pytest.mark.parametrize("tied", [True, False])
def test_a_hub_models_tied_embeddings_refuse_the_fp32_head_from_its_config_json(tmp_path, tied):
    from grpo_sweep.config.model_arch import check_hub_lora_targets

    numbers = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128, vocab_size=1000)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "tie_word_embeddings": tied, **numbers}))
    cfg = compose(["model=hub", f"model.hub_id={tmp_path}", "cast_lm_head_to_fp32=true"])
    if tied:
        with pytest.raises(ConfigError, match=r"^cast_lm_head_to_fp32=true: not with tied embeddings and a LoRA adapter"):
            check_hub_lora_targets(cfg)
    else:
        check_hub_lora_targets(cfg)


def test_the_learning_check_compares_trials_of_one_recipe_and_seed():
    """report/learning.py: the median of each fingerprint key is the reference within a recipe and a seed;
    another recipe or seed is another group, and bf16 trials get the wider tolerance."""

    def rec(g1, g2, recipe="r", device="cpu"):
        return {"recipe": {"x": recipe}, "device": device, "history": [{"grad_norm": g1, "entropy": 1.0}, {"grad_norm": g2}]}

    same = [(0, rec(0.5, 0.7), 0), (1, rec(0.5, 0.7 * (1 + 1e-6)), 0), (2, rec(0.5, 0.7), 0)]
    assert compare(same) == {}
    assert list(compare([*same, (3, rec(0.5, 0.71), 0)])) == [3]
    assert compare([*same, (3, rec(0.5, 0.71, recipe="other"), 0), (4, rec(0.6, 0.7), 1)]) == {}  # alone in its group
    two = compare([(0, rec(0.5, 0.7), 0), (1, rec(0.5, 0.8), 0)])
    assert sorted(two) == [0, 1]  # two that disagree: neither is the reference
    card = [(n, rec(0.5, 0.7 * (1 + d), device="cuda"), 0) for n, d in enumerate((0, 0.005, -0.004))]
    assert compare(card) == {} and list(compare(card, tolerance=1e-4)) == [1, 2]
    assert fingerprint({"history": [{"grad_norm": float("nan"), "reward": 0.5}]}) == {"reward@1": 0.5}


# Settings of parallelism, offload and the generation engine's code (levers.KINDS): knobs, each with its source.
PARALLEL_AND_ENGINE_KNOBS = {
    "backend.vllm_model_impl": "vLLM 0.31",
    "backend.vllm_mode": "TRL 1.16",
    "backend.vllm_tensor_parallel_size": "vLLM 0.31",
    "backend.unsloth_grpo_mini_batch": "unsloth_zoo/rl_replacements.py",
    "backend.unsloth_logit_chunk_multiplier": "unsloth_zoo/rl_replacements.py",
    "trial.num_processes": "config.split.split_of",
    "trial.strategy": "transformers 5.17",
    "trial.offload": "DeepSpeed",
    "ds3_gather_for_generation": "TRL 1.16",
}


def test_parallel_offload_and_engine_code_settings_are_knobs_with_their_sources():
    for key, source in PARALLEL_AND_ENGINE_KNOBS.items():
        assert key in SCHEMA_KEYS and kind_of(key) == KNOB and source in KINDS[key].why, key
    plain = recipe_of(compose([]))
    changed = compose(["ds3_gather_for_generation=false", "trial.offload=true", "backend.vllm_model_impl=auto"])
    assert recipe_of(changed) == plain  # none of them is part of what is learned


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (
            ["trial.offload=true"],
            r"^trial\.offload=true: needs trial\.strategy=fsdp, zero2 or zero3 .*strategy=ddp, num_processes=1",
        ),
        (
            ["trial.num_processes=2", "trial.strategy=zero2", "ds3_gather_for_generation=false"],
            r"^ds3_gather_for_generation=false: applies only under trial\.strategy=zero3 .*strategy=zero2",
        ),
        (
            ["backend=trl_vllm", "trial.num_processes=2", "trial.strategy=zero3", "ds3_gather_for_generation=false"],
            r"^ds3_gather_for_generation=false: not with vLLM generation",
        ),
        (
            ["backend=trl_vllm", "backend.vllm_model_impl=transformers"],
            r"^backend\.vllm_model_impl=transformers: not in colocate mode",
        ),
        (
            ["backend=trl_vllm", "backend.vllm_model_impl=jax"],
            r"^backend\.vllm_model_impl=jax: must be one of null, auto, vllm, transformers$",
        ),
        (["backend=trl", "backend.vllm_model_impl=vllm"], r"^backend\.vllm_model_impl=vllm: needs backend=trl_vllm"),
        (["backend=trl", "backend.unsloth_grpo_mini_batch=4"], r"^backend\.unsloth_grpo_mini_batch=4: needs backend=unsloth"),
        (
            ["backend=unsloth", "backend.unsloth_logit_chunk_multiplier=0"],
            r"^backend\.unsloth_logit_chunk_multiplier=0: must be an integer >= 1",
        ),
    ],
)
def test_parallel_offload_and_engine_code_settings_refused_in_one_line(overrides, line):
    with pytest.raises(ConfigError, match=line):
        validate(compose(overrides), cuda=True, installed=lambda _: True)


def test_offload_gather_and_engine_code_reach_trl_deepspeed_fsdp_and_vllm():
    """trial.offload -> DeepSpeed's offload_optimizer (+ offload_param under ZeRO-3) or FSDP2's cpu_offload;
    ds3_gather_for_generation=false -> GRPOConfig; backend.vllm_model_impl -> TRL's colocate argument or
    `trl vllm-serve --vllm_model_impl`; the Unsloth chunk settings -> Unsloth's GRPOConfig. Defaults pass nothing."""
    from grpo_sweep.report.export import engine_notes
    from grpo_sweep.trial.backends import trl as trl_backend
    from grpo_sweep.trial.backends import trl_vllm, unsloth
    from grpo_sweep.trial.vllm_server import command

    def args(*overrides):
        cfg = validate(compose(list(overrides)), cuda=True, installed=lambda _: True)
        return trl_backend.grpo_args(cfg, on_cuda=True, output_dir="/o")

    ranks = ["trial.num_processes=2"]
    zero3 = args(*ranks, "trial.strategy=zero3", "trial.offload=true", "ds3_gather_for_generation=false")
    zero = zero3["deepspeed"]["zero_optimization"]
    assert zero["offload_optimizer"] == {"device": "cpu", "pin_memory": True} and zero["offload_param"]["device"] == "cpu"
    assert zero3["ds3_gather_for_generation"] is False
    zero2 = args(*ranks, "trial.strategy=zero2", "trial.offload=true")["deepspeed"]["zero_optimization"]
    assert "offload_optimizer" in zero2 and "offload_param" not in zero2
    assert args(*ranks, "trial.strategy=fsdp", "trial.offload=true")["fsdp_config"]["cpu_offload"] is True
    plain = args(*ranks, "trial.strategy=zero3")
    assert "offload_optimizer" not in plain["deepspeed"]["zero_optimization"] and "ds3_gather_for_generation" not in plain

    colocate = compose(["backend=trl_vllm", "backend.vllm_model_impl=auto"])
    assert trl_vllm.vllm_args(colocate, device_util=0.5)["vllm_model_impl"] == "auto"
    assert "vllm_model_impl" not in trl_vllm.vllm_args(compose(["backend=trl_vllm"]), device_util=0.5)
    server = compose(["backend=trl_vllm", "backend.vllm_mode=server", "backend.vllm_model_impl=transformers"])
    assert "--model-impl transformers" in " ".join(command(server, "/m", 1, on_cuda=False))
    (line,) = engine_notes({"backend": {"vllm_mode": "server", "vllm_model_impl": "transformers"}}, {})
    assert "--vllm_model_impl transformers" in line
    assert engine_notes({"backend": {"vllm_model_impl": "auto"}}, {}) == []  # colocate: GRPOConfig.vllm_model_impl

    chunks = compose(["backend=unsloth", "backend.unsloth_grpo_mini_batch=2", "backend.unsloth_logit_chunk_multiplier=8"])
    out = unsloth.grpo_unsloth_args(chunks, on_cuda=True, output_dir="/o")
    assert (out["unsloth_grpo_mini_batch"], out["unsloth_logit_chunk_multiplier"]) == (2, 8)
    assert not set(unsloth.UNSLOTH_LOSS_SETTINGS) & set(
        unsloth.grpo_unsloth_args(compose(["backend=unsloth"]), on_cuda=True, output_dir="/o")
    )


def test_offload_and_generation_without_the_gather_have_their_memory_terms():
    """rank_terms: offload takes the sharded optimiser state and parameters off the card; ZeRO-3 without
    ds3_gather_for_generation no longer holds the whole model during HF generation."""
    from grpo_sweep.memory.estimator import estimate

    base = ["gpu=l4_24g", "model=qwen2_5_0_5b", "backend=trl", "trial.num_processes=2", "trial.strategy=zero3"]

    def est(*extra):
        return estimate(validate(compose([*base, *extra]), cuda=True, installed=lambda _: True))

    plain, offload, sharded = est(), est("trial.offload=true"), est("ds3_gather_for_generation=false")
    assert plain.components["optimizer_state"] > 0 and plain.components["weights"] > 0
    assert offload.components["optimizer_state"] == 0 and offload.components["weights"] == 0
    assert offload.total_bytes < plain.total_bytes
    full = plain.components["gathered_params"]  # generation holds every weight with the gather
    assert sharded.components["gathered_params"] < full and sharded.total_bytes < plain.total_bytes


# --- the flag wherever results are shown, and the winner rule -------------------------------------------


def _checked_trial(number, tokens_per_s, grad_norm_1, recipe=1):
    from grpo_sweep.report.trials import Trial

    record = {
        "status": "ok",
        "tokens_per_s": tokens_per_s,
        "peak_memory_bytes": 2**20,
        "recipe": {"completions_per_step": recipe},
        "device": "cpu",
        "history": [
            {"step": 1, "grad_norm": grad_norm_1, "entropy": 1.0, "reward": 0.5},
            {"step": 2, "grad_norm": 0.5, "reward": 0.6},
        ],
    }
    return Trial(name=f"trial {number}", record=record, config={"seed": 0}, number=number)


def test_a_trial_that_changed_the_learning_never_wins_silently(tmp_path):
    """report/learning.py's winner rule on report trials: the fastest trial departs, so the winner is the
    fastest that did not, and report.html says which and why; two that disagree with no third: the best
    wins, flagged; the sweep's tolerance (hydra.sweeper.learning_tolerance, on each trial) is the one used."""
    from grpo_sweep.report.html import write_report
    from grpo_sweep.report.learning import key_of, verdict_lines
    from grpo_sweep.report.trials import learning_check

    trials = [_checked_trial(0, 100.0, 0.7), _checked_trial(1, 120.0, 0.7), _checked_trial(2, 150.0, 0.75)]
    verdict, flagged = learning_check(trials)
    assert list(flagged) == [2] and flagged[2].keys[0]["key"] == "grad_norm@1"
    assert verdict.ranked[0].item.number == 1 and [f.item.number for f in verdict.passed_over] == [2]
    assert not verdict.winner_flagged
    (line,) = verdict_lines(verdict, flagged, key_of, lambda k: f"trial {k}")
    assert line.startswith("best trial 2 changed the learning: grad_norm@1 0.75 vs 0.7 (+7.14%)"), line
    assert line.endswith("; the best that did not: trial 1 (the winner)"), line
    page = write_report(trials, tmp_path, title="flagged").read_text()
    assert "<p id=changed-learning>Best trial 2 changed the learning: grad_norm@1 0.75 vs 0.7 (+7.14%)" in page
    assert "Best feasible trial: <b>trial 1</b>" in page
    assert "<table id=changed-learning-trials>" in page and '<tr class="feasible changed"' in page
    assert "Except where the learning check found otherwise: trial 2 changed the learning" in page

    repeats = [_checked_trial(n, 150.0, 0.75) for n in (3, 4)]  # trial 2's config confirmed: one vote, not three
    for t in repeats:
        t.record["confirms"] = 2
    verdict, flagged = learning_check([*trials, *repeats])
    assert sorted(flagged) == [2, 3, 4] and verdict.ranked[0].item.number == 1
    assert "(the median of 3 configs of this recipe and seed" in flagged[2].text

    alone = learning_check(trials[1:])  # 0.7 and 0.75: neither is the reference
    assert sorted(alone[1]) == [1, 2] and alone[0].winner_flagged and alone[0].ranked[0].item.number == 2
    winner, other = verdict_lines(*alone, key_of, lambda k: f"trial {k}")  # the winner's line, then the rest
    assert winner.startswith("the winner trial 2 changed the learning") and "every config that competed is flagged" in winner
    assert other.startswith("trial 1 changed the learning: grad_norm@1 0.7 vs 0.725 (-3.45%)"), other

    other_recipe = [*trials[:2], _checked_trial(2, 150.0, 0.75, recipe=2)]  # alone in its group: nothing to compare
    assert learning_check(other_recipe)[1] == {} and learning_check(other_recipe)[0].ranked[0].item.number == 2
    for t in trials:
        t.learning_tolerance = 0.1  # 7 % is within it
    assert learning_check(trials)[1] == {} and learning_check(trials)[0].ranked[0].item.number == 2


def test_the_debug_perturbation_is_hidden_and_checked():
    """+trial.debug_perturb: a test switch, not a setting: only with `+`, in no kind table or lever doc,
    and a bad value is one line."""
    from hydra.errors import HydraException

    from grpo_sweep.config.validate import DEBUG_KEYS

    assert validate(compose(["+trial.debug_perturb=1e-3"])).trial.get("debug_perturb") == 1e-3
    with pytest.raises(ConfigError, match=r"^trial.debug_perturb=2: must be a number in \(0, 1\)"):
        validate(compose(["+trial.debug_perturb=2"]))
    with pytest.raises(HydraException, match="debug_perturb"):
        compose(["trial.debug_perturb=1e-3"])
    levers_doc = (Path(__file__).resolve().parents[1] / "docs" / "levers.md").read_text()
    for key in DEBUG_KEYS:
        assert key not in SCHEMA_KEYS and key not in KINDS and key.split(".")[-1] not in levers_doc


@pytest.mark.slow
def test_a_non_neutral_knob_is_flagged_in_the_table_best_yaml_and_report(tmp_path):
    """A real tiny_cpu study: micro-batches 2 and 4 (the split under dapo: the same learning), then the
    same study resumed with a third trial, micro-batch 1, carrying +trial.debug_perturb (its LoRA weights
    nudged before the first step). The objective is the peak (minimised), so the perturbed trial, the
    smallest micro-batch, is certainly the best by value: it is flagged in the printed table, best.yaml,
    report.html and `grpo-sweep report`, with its numbers, and never wins: the winner is trial 0. Over 20 s:
    two real sweeps, three real trials."""
    from helpers.runners import cli

    sweep_dir = tmp_path / "sweep"
    same = [
        "hydra.sweeper.confirm_top=0",
        "hydra.sweeper.stop_below=0",
        "hydra.sweeper.prescreen=false",
        "hydra.sweeper.objective=peak_memory_bytes",
        "hydra.sweeper.direction=minimize",
    ]
    first = train_here(
        sweep_args(
            sweep_dir,
            "hydra.sweeper.n_trials=2",
            *same,
            *SPLIT_SPACE,
            "hydra.sweeper.enqueue=[{per_device_train_batch_size:2,gradient_checkpointing:false},"
            "{per_device_train_batch_size:4,gradient_checkpointing:false}]",
        )
    )
    assert first.returncode == 0, first.stderr[-3000:]
    assert "Learning checked: none of the 2 ok trials changed the learning" in first.stdout
    assert "changed_the_learning" not in yaml.safe_load((sweep_dir / "best.yaml").read_text())
    result = train_here(
        sweep_args(
            sweep_dir,
            "hydra.sweeper.n_trials=3",
            *same,
            *SPLIT_SPACE,
            "hydra.sweeper.enqueue=[{per_device_train_batch_size:1,gradient_checkpointing:false}]",
            "+trial.debug_perturb=1e-3",
        )
    )
    assert result.returncode == 0, result.stderr[-3000:]
    study = load_study(f"journal:{sweep_dir / 'study.journal'}")
    assert [t.params["per_device_train_batch_size"] for t in study.trials] == [2, 4, 1]
    peaks = [t.value for t in study.trials]
    assert peaks[2] < min(peaks[:2])  # the perturbed trial is the best by value

    best = yaml.safe_load((sweep_dir / "best.yaml").read_text())
    assert best["best_trial"] != 2
    changed = best["changed_the_learning"]
    assert [t["trial"] for t in changed["trials"]] == [2] and changed["passed_over"] == [2]
    assert changed["winner_flagged"] is False and changed["tolerance"] is None
    assert changed["trials"][0]["tolerance"] == 1e-4  # float32 on CPU
    differed = {d["key"]: d for d in changed["trials"][0]["differed"]}
    assert "grad_norm@1" in differed and abs(differed["grad_norm@1"]["relative"]) > 1e-3, differed

    out = result.stdout
    header = next(line for line in out.splitlines() if line.startswith("rank"))
    assert "learning" in header.split()
    rows = {line.split()[1]: line.split() for line in out.splitlines() if line[:1].isdigit() and len(line.split()) > 8}
    assert "CHANGED" in rows["2"] and "same" in rows["0"] and "same" in rows["1"], rows
    table = {int(r["number"]): r["learning"] for r in read_csv(sweep_dir / "trials.csv")}
    assert table == {0: "same", 1: "same", 2: "changed"}, table
    said = f"{changed['trials'][0]['text']}; the best that did not: trial {best['best_trial']} (the winner)"
    assert f"Best trial 2 {said}" in out

    html = (sweep_dir / "report.html").read_text()
    assert "<h2>Equal learning</h2>" in html and f"<p id=changed-learning>Best trial 2 {said}" in html
    assert f"Best feasible trial: <b>trial {best['best_trial']}</b>" in html
    assert html.count('class="feasible changed"') == 1 and html.count('class="feasible best"') == 1

    report = cli("report", str(sweep_dir), "--out", str(tmp_path / "again"))
    assert report.returncode == 0, report.stderr
    assert f"best: trial {best['best_trial']} " in report.stdout and f"best trial 2 {said}" in report.stdout


@pytest.mark.parametrize(
    ("param", "setting"),
    [
        ("+trial.grpo_config.temperature=choice(0.7,1.0)", "trial.grpo_config"),
        ("+trial.grpo_config.num_iterations=choice(1,4)", "trial.grpo_config"),
        ("seed=choice(0,1)", "seed"),
        ("task.num_prompts=choice(64,128)", "task"),
        ("task.max_operand=choice(9,99)", "task"),
        ("backend.vllm_max_num_seqs=choice(2,4)", "backend.vllm_max_num_seqs"),
    ],
)
def test_every_setting_not_listed_as_a_knob_is_recipe(param, setting):
    """GRPOConfig's own arguments, the seed, the task's settings and vLLM's sequence cap change what is learned:
    searching one is refused in one line naming it, before any trial, unless hydra.sweeper.concessions lists it."""
    key = param.split("=")[0].lstrip("+")
    with pytest.raises(ValueError) as err, tiny_sweeper(param):
        pass
    text = str(err.value)
    assert type(err.value).__name__ == "SweeperSettingError" and "\n" not in text
    assert text.startswith(f"hydra.sweeper.params.{param.split('=')[0]}: changes the recipe ({setting}: "), text
    assert f"hydra.sweeper.concessions=[{key}]" in text, text
    with tiny_sweeper(param, concessions=[key]) as tiny:  # listed: searched, a concession
        assert tiny.plan.concession_params[param.split("=")[0]] == {setting}
        assert setting in tiny.plan.may_change
    assert kind_of(key) == RECIPE


def test_a_grpo_config_argument_is_part_of_the_recipe_recorded():
    """trial.grpo_config enters the recipe only when it sets something: a study recorded without it keeps its identity."""
    assert "trial.grpo_config" not in recipe_of(compose([]))
    assert recipe_of(compose(["+trial.grpo_config.num_iterations=4"]))["trial.grpo_config"] == {"num_iterations": 4}
    engine = "+trial.grpo_config.transformers_continuous_batching_config={num_blocks:64}"  # listed as a knob
    assert kind_of(engine.split("=")[0]) == KNOB and "trial.grpo_config" not in recipe_of(compose([engine]))


def test_a_trial_with_no_peer_is_unchecked_not_same():
    """A trial alone in its recipe and seed (seed=1 beside seed=0 trials) had nothing compared with it: `unchecked`."""
    from grpo_sweep.report.learning import check_trials, compare, verdict_of

    def rec(g2):
        return {"recipe": {"x": 1}, "device": "cpu", "history": [{"grad_norm": 0.5, "entropy": 1.0}, {"grad_norm": g2}]}

    checked = compare([(0, rec(0.7), 0), (1, rec(0.7), 0), (2, rec(0.9), 1)])
    assert dict(checked) == {} and checked.unchecked == {2}
    assert [verdict_of(n, checked) for n in (0, 1, 2)] == ["same", "same", "unchecked"]
    # the report's trials: the same rule, by the config's seed
    report = [_checked_trial(0, 10.0, 1.0), _checked_trial(1, 11.0, 1.0), _checked_trial(2, 12.0, 1.0)]
    report[2].config["seed"] = 1
    assert check_trials(report).unchecked == {2}


def test_the_learning_check_says_which_trials_agree():
    """vllm_max_num_seqs at 4, 1, 4, 1: trials 0 and 2 agree exactly, as do 1 and 3; no pair outnumbers the other,
    so all four are flagged and each line says which agree. A pair beside two lone configs is the reference."""
    from grpo_sweep.report.learning import compare, verdict_lines

    def rec(g2):
        return {"recipe": {"x": 1}, "device": "cpu", "history": [{"grad_norm": 0.5, "entropy": 1.0}, {"grad_norm": g2}]}

    pairs = compare([(0, rec(0.7), 0), (1, rec(0.8), 0), (2, rec(0.7), 0), (3, rec(0.8), 0)])
    assert sorted(pairs) == [0, 1, 2, 3]
    said = "trials 0 and 2 agree; trials 1 and 3 agree; the groups differ and none outnumbers the others"
    assert all(said in d.text for d in pairs.values()), pairs[0].text
    winner = SimpleNamespace(item=SimpleNamespace(number=0), members=[SimpleNamespace(number=0)])
    every_one_flagged = SimpleNamespace(ranked=[winner], passed_over=[], winner_flagged=True)  # study.best.decide's
    (line, *_) = verdict_lines(every_one_flagged, pairs, lambda t: t.number, lambda n: f"trial {n}")
    assert "no trial of its recipe and seed agrees" not in line and said in line.split("flagged: ")[1], line
    lone = compare([(0, rec(0.7), 0), (1, rec(0.8), 0), (2, rec(0.7), 0), (3, rec(0.9), 0)])
    assert sorted(lone) == [1, 3] and not lone[1].agreement and lone[1].keys[0]["reference"] == 0.7


def test_every_output_of_the_learning_check_says_unchecked(tmp_path):
    """A trial alone in its seed: report.html's section and table, the printed table and lines, and best.yaml's
    `learning_unchecked` name it unchecked, never `same`; the winner alone in its seed is said to be unchecked."""
    from grpo_sweep.report.html import write_report
    from grpo_sweep.report.trials import learning_check
    from hydra_plugins.grpo_optuna_sweeper.summary import learning_lines, learning_summary
    from hydra_plugins.grpo_optuna_sweeper.tables import table

    trials = [_checked_trial(0, 100.0, 0.7), _checked_trial(1, 120.0, 0.7), _checked_trial(2, 150.0, 0.7)]
    trials[2].config["seed"] = 1
    verdict, flagged = learning_check(trials)
    assert dict(flagged) == {} and flagged.unchecked == {2} and verdict.ranked[0].item.number == 2
    page = write_report(trials, tmp_path, title="alone").read_text()
    assert "the 2 ok trials took the same first steps" in page
    assert "<p id=unchecked-learning>Unchecked: trial 2 (no other config of its recipe and seed ran" in page
    assert ">unchecked: no other config of its recipe and seed ran<" in page
    lines = learning_lines(verdict, flagged, 3)
    assert "none of the 2 ok trials changed the learning" in lines and "unchecked: trial 2 (" in lines, lines
    summary = learning_summary(verdict, flagged, None)
    assert "changed_the_learning" not in summary
    assert summary["learning_unchecked"]["trials"] == [2] and summary["learning_unchecked"]["winner_unchecked"] is True
    ok = [SimpleNamespace(number=n, value=v, params={}, user_attrs={}) for n, v in ((2, 150.0), (1, 120.0), (0, 100.0))]
    rows = {line.split()[1]: line.split()[-1] for line in table(ok, "tokens_per_s", 3, set(), {2}).splitlines()[1:]}
    assert rows == {"2": "unchecked", "1": "same", "0": "same"}, rows


def test_a_task_concession_is_another_group_for_the_learning_check():
    """task.num_prompts searched as a concession: the recipe names the task only, so the check groups by the
    task's settings too; a trial with other prompts is unchecked, not flagged against the others."""
    from grpo_sweep.report.learning import check_trials

    trials = [_checked_trial(0, 100.0, 0.7), _checked_trial(1, 120.0, 0.7), _checked_trial(2, 150.0, 0.9)]
    for n, t in enumerate(trials):
        t.config["task"] = {"name": "arithmetic", "num_prompts": 128 if n == 2 else 64}
    checked = check_trials(trials)
    assert dict(checked) == {} and checked.unchecked == {2}
