"""A real GRPO trial on the tiny model, run in its own process, and its containment of failures."""

from __future__ import annotations

import math

import pytest
from helpers.config import compose
from helpers.runners import FAST, IN_PROCESS_TRIALS, load_metrics

from grpo_sweep.levers import LEVER_NAMES
from grpo_sweep.metrics import KEYS, REQUIRED_KEYS
from grpo_sweep.trial.parent import run_trial


@IN_PROCESS_TRIALS
def test_real_trial_records_every_metric(tmp_path):
    record = run_trial(compose(["trial.steps=3"]), tmp_path)
    assert record["status"] == "ok", record["error"]
    on_disk = load_metrics(tmp_path)
    assert set(REQUIRED_KEYS) <= set(on_disk)
    assert set(on_disk) <= KEYS, f"undeclared metrics.json keys (declare them in metrics.TrialMetrics): {set(on_disk) - KEYS}"
    assert (tmp_path / "config.yaml").exists()
    assert on_disk["steps"] == 3 and len(on_disk["history"]) == 3
    for key in ("tokens_per_s", "samples_per_s", "step_time_s", "reward_mean", "reward_std"):
        assert math.isfinite(on_disk[key]), key
    assert on_disk["tokens_per_s"] > 0 and on_disk["peak_memory_bytes"] > 0
    assert on_disk["memory_source"] and on_disk["device"] == "cpu" and on_disk["backend"] == "trl"
    assert set(LEVER_NAMES) <= set(on_disk["levers"])
    # Worst-case lengths: every step trains batch x max_seq_length tokens.
    eff = on_disk["effective"]
    assert eff["max_seq_length"] == 96 and eff["per_device_train_batch_size"] == 4
    assert all(row["tokens"] == 4 * 96 for row in on_disk["history"])
    assert on_disk["versions"]["trl"] and on_disk["versions"]["torch"]
    # The speed against the card's limit (memory.throughput.speed_record), every key known here.
    assert on_disk["speed_unknown"] == {}
    assert len(on_disk["generation_times_s"]) == 3 and on_disk["generation_s"] in on_disk["generation_times_s"][1:]
    assert 0 < on_disk["training_s"] < on_disk["step_time_s"]
    assert 0 < on_disk["completion_tokens_mean"] <= on_disk["completion_tokens_max"] <= 96 - 32
    assert 0 < on_disk["limit_step_s"] < on_disk["step_time_s"]
    assert on_disk["mfu_training"] > 0 and on_disk["decode_bandwidth_use"] > 0 and "peak" in on_disk["mfu_convention"]


@IN_PROCESS_TRIALS
def test_worst_case_off_uses_natural_lengths(tmp_path):
    record = run_trial(compose([*FAST, "trial.worst_case_lengths=false"]), tmp_path)
    assert record["status"] == "ok", record["error"]
    assert record["effective"]["max_prompt_tokens"] < 32


@IN_PROCESS_TRIALS
@pytest.mark.parametrize(
    "fault, status, needle",
    [
        ("raise", "failed", "injected failure"),
        ("signal", "failed", "SIGKILL"),
        pytest.param("hang", "timeout", "timeout_s", marks=pytest.mark.slow),  # waits out trial.timeout_s=4
        ("oom", "oom", "allocate"),
    ],
)
def test_failures_are_contained(tmp_path, fault, status, needle, warm_model):
    overrides = [*FAST, f"trial.debug_fault={fault}"]
    if fault == "hang":
        # Short: the clock starts once the worker is forked, and a warm worker builds its model and
        # trainer and reaches the hang in about half a second (the trial's whole run is ~1 s).
        overrides.append("trial.timeout_s=4")
    record = run_trial(compose(overrides), tmp_path)  # returning at all means the parent survived
    assert record["status"] == status
    assert needle in record["error"]
    if fault == "hang":  # stopped while hanging, not before it got there
        assert "hanging until stopped" in (tmp_path / "trial.log").read_text()
    assert load_metrics(tmp_path)["status"] == status
    assert set(load_metrics(tmp_path)) <= KEYS


@IN_PROCESS_TRIALS
def test_a_trial_sees_its_parents_environment_and_console_as_they_are_when_it_starts(tmp_path, monkeypatch):
    """Two trials in one process, as a Hydra multirun runs its jobs (each with its hydra.job.env_set):
    the second is forked from the forkserver the first started, yet it sees the environment and the
    stdout of its own start. The trial records PYTORCH_CUDA_ALLOC_CONF's other settings
    (process.set_alloc_conf), so the record shows which environment it ran in."""
    import os

    cfg = compose(FAST)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64")
    first = run_trial(cfg, tmp_path / "first")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")
    console = tmp_path / "console.txt"
    saved = os.dup(1)
    try:
        with open(console, "w") as out:
            os.dup2(out.fileno(), 1)
            second = run_trial(cfg, tmp_path / "second")
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    assert first["status"] == second["status"] == "ok", (first["error"], second["error"])
    assert first["cuda_alloc_conf"] == "max_split_size_mb:64,expandable_segments:False"
    assert second["cuda_alloc_conf"] == "max_split_size_mb:128,expandable_segments:False"
    assert "[trial] step 2/2" in console.read_text()  # the trial printed where this process's stdout points now


@pytest.mark.slow
def test_a_multirun_console_is_its_trials_lines_only(tmp_path):
    """Over 20 s: a fresh `python train.py -m` (its own interpreter and resource tracker) of two trials.
    No weight-loading or saving progress bar in a trial (process.quiet_progress), and no
    "leaked semaphore objects" warning when the command ends: tqdm's multiprocessing lock, which a
    trial ending with os._exit never released, is a thread lock in the trial."""
    from helpers.runners import run_train

    out = run_train(["-m", "lora_rank=8,16", *FAST, f"hydra.sweep.dir={tmp_path}"])
    assert out.returncode == 0, out.stderr[-3000:]
    console = out.stdout + out.stderr
    assert console.count("trial ok |") == 2, console[-3000:]
    for noise in ("leaked semaphore", "resource_tracker", "Loading weights", "Writing model shards", "it/s]"):
        assert noise not in console, (noise, console[-3000:])


@IN_PROCESS_TRIALS
def test_a_trial_whose_only_generation_is_the_warm_up_is_not_ok(tmp_path, warm_model):
    """num_iterations=4: one generation feeds the 4 optimiser steps. Every step is logged, but only step 1 (the
    untimed warm-up) generated, so no timed step measured the throughput: the trial says so and is not ok."""
    record = run_trial(compose(["trial.steps=4", "+trial.grpo_config.num_iterations=4"]), tmp_path)
    assert [row["step"] for row in record["history"]] == [1, 2, 3, 4]
    assert [bool(row["tokens"]) for row in record["history"]] == [True, False, False, False]
    assert record["status"] == "failed" and "only step 1, the untimed warm-up, generated" in record["error"], record["error"]
    assert record["measured_steps"] == 0 and record.get("tokens_per_s") is None


def _meter_rows(tokens: list[int], tracked: list[bool] | None = None):
    """A StepMeter fed one log per optimiser step, as the trainer calls it (`tokens` each step trained anew)."""
    from types import SimpleNamespace

    from grpo_sweep.trial.measure.speed_meter import StepMeter

    meter, seen = StepMeter(len(tokens), 4), 0
    for step, (new, was_tracked) in enumerate(zip(tokens, tracked or [False] * len(tokens)), 1):
        meter.on_step_begin(None, SimpleNamespace(num_input_tokens_seen=seen), None)
        seen += new
        meter.on_step_end(None, SimpleNamespace(global_step=step, num_input_tokens_seen=seen), None)
        meter.on_log(None, None, None, logs={"loss": 0.1, **({"reward": 1.0} if new else {})})
        meter.rows[-1]["tracked"] = was_tracked
    return meter


def test_the_steady_state_is_whole_generation_cycles_after_the_first():
    every = _meter_rows([96] * 4)  # every step generates: every step after the first
    assert [r["step"] for r in every.timed_rows()] == [2, 3, 4] and every.unmeasured() is None
    cycles = _meter_rows([96, 0, 96, 0, 96, 0, 96])  # num_iterations=2: the two whole cycles after the first
    assert [r["step"] for r in cycles.timed_rows()] == [3, 4, 5, 6]
    assert cycles.summary()["measured_steps"] == 4 and cycles.summary()["steps"] == 7
    clean = _meter_rows([96, 0, 96, 0, 96, 0], tracked=[True, True, True, False, False, False])
    assert [r["step"] for r in clean.timed_rows()] == [5, 6]  # the cycle the tracker slowed is left out
    partial = _meter_rows([96, 0, 0, 0, 96, 0])  # no whole cycle after the first: the partial one
    assert [r["step"] for r in partial.timed_rows()] == [5, 6]
    first_only = _meter_rows([96, 0, 0, 0])
    assert first_only.timed_rows() == [] and "only step 1" in first_only.unmeasured()
    assert first_only.summary() == {"steps": 4, "measured_steps": 0}
