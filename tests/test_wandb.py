"""logger=wandb: a real trial writes an offline W&B run holding what its metrics.json holds.

No network anywhere: WANDB_MODE=offline, no API key, no netrc, and a W&B base URL nothing listens
on, so any attempt to reach a server would fail at once instead of leaving the machine.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers.config import compose
from helpers.runners import DEAD_URL, load_metrics
from helpers.wandb_runs import read_run
from omegaconf import OmegaConf

from grpo_sweep.credentials import wandb_mode as resolve_mode
from grpo_sweep.levers import LEVER_NAMES
from grpo_sweep.trial.wandb_logger import open_logger, run_group, run_name

STEP_KEYS = (
    "reward",
    "reward_std",
    "loss",
    "grad_norm",
    "step_time_s",
    "tokens",
    "tokens_per_s",
    "completion_length",
    "peak_memory_bytes",
    "reward/correctness_reward",
    "reward/format_reward",
)


def history_by_step(records: list[dict]) -> dict[int, dict]:
    return {int(r["history"]["step"]["num"]): r["history"]["item"] for r in records if r["type"] == "history"}


@pytest.fixture(scope="module")
def sweep(wandb_sweep):
    return wandb_sweep[0]


@pytest.mark.slow
def test_offline_run_holds_config_history_and_summary(sweep, wandb_sweep):
    """Over 20 s: the first user of the once-per-run offline-W&B multirun (conftest.wandb_sweep) builds it."""
    m = load_metrics(sweep / "0")
    assert m["status"] == "ok" and m["levers"]["lora_rank"] == 8, m["error"]
    # The run directory and the W&B run point to each other; the group is the multirun directory.
    assert m["wandb_mode"] == "offline" and m["wandb_group"] == str(sweep.resolve())
    run_path = Path(m["wandb_dir"])
    assert run_path.is_dir() and (sweep / "0").resolve() in run_path.resolve().parents
    assert f"wandb sync {m['wandb_dir']}" in wandb_sweep[1]  # the upload command, printed at the end
    assert "online logging failed" not in wandb_sweep[1]

    summary, records = read_run(run_path)
    assert summary["run_id"] == m["wandb_run_id"] and summary["state"] == "finished"
    assert summary["name"] == "seq96-util0.6-b4x1-g4-r8"
    assert "ok" in summary["tags"] and "model:tiny" in summary["tags"]
    run = next(r["run"] for r in records if r["type"] == "run")
    assert run["run_group"] == m["wandb_group"] and run["job_type"] == "trial"

    config = summary["config"]
    assert {k: config[k] for k in LEVER_NAMES} == {k: m["levers"][k] for k in LEVER_NAMES}
    assert config["grpo_sweep"]["run_dir"] == str((sweep / "0").resolve())
    assert config["grpo_sweep"]["trial_number"] is None and config["trial"]["study"] is None
    assert config["grpo_sweep"]["backend"] == m["backend"] and config["model"]["name"] == "tiny"
    assert config["gpu"]["name"] == "cpu"
    assert config["grpo_sweep"]["versions"]["torch"] == m["versions"]["torch"]
    assert config["grpo_sweep"]["versions"]["wandb"]

    history = history_by_step(records)
    assert sorted(history) == [row["step"] for row in m["history"]] == [1, 2]
    for row in m["history"]:
        for key in STEP_KEYS:
            assert history[row["step"]][key] == pytest.approx(row[key]), key

    s = summary["summary"]
    assert s["status"] == "ok" and s["objective_name"] == "tokens_per_s"
    for key in (
        "tokens_per_s",
        "samples_per_s",
        "step_time_s",
        "peak_memory_bytes",
        "reward_mean",
        "reward_first",
        "reward_last",
    ):
        assert s[key] == pytest.approx(m[key]), key
    assert s["objective"] == pytest.approx(m["tokens_per_s"])
    assert s["peak_memory_gib"] == pytest.approx(m["peak_memory_bytes"] / 2**30)
    assert s["requested"] == m["levers"] and s["effective"] == m["effective"]
    assert s["trainable_params"] == m["trainable_params"]


@pytest.mark.slow
def test_oom_trial_is_tagged_and_summarised(sweep):
    m = load_metrics(sweep / "1")
    assert m["status"] == "oom" and m["levers"]["lora_rank"] == 8
    summary, _ = read_run(m["wandb_dir"])
    assert "oom" in summary["tags"] and summary["exit_code"] == 1
    s = summary["summary"]
    assert s["status"] == "oom" and s["error"] == m["error"] and s.get("objective") is None
    assert s["effective"] == m["effective"] and s["requested"] == m["levers"]


def test_network_failure_falls_back_offline_without_leaking_the_key(tmp_path, monkeypatch, capsys):
    """An API key but an unreachable server: online init fails, the run goes offline, key stays secret."""
    key = "0123456789abcdef0123456789abcdef01234567"
    monkeypatch.setenv("WANDB_API_KEY", key)
    monkeypatch.setenv("WANDB_BASE_URL", DEAD_URL)
    monkeypatch.setenv("NETRC", os.devnull)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg = OmegaConf.create(
        OmegaConf.to_container(compose(["logger=wandb", "logger.init_timeout_s=1", "trial.number=2"]), resolve=True)
    )
    record = {"status": "failed", "levers": {"lora_rank": 16}, "effective": {}, "backend": "trl", "versions": {}}
    logger = open_logger(cfg, tmp_path, record)
    assert record["wandb_mode"] == "offline" and "wandb_error" in record
    logger.log_step({"step": 1, "reward": 0.5, "tokens_per_s": 12.0, "step_time_s": 1.0})
    record.update(status="oom", oom_phase="backward", deficit_bytes=3 * 2**30, predicted_peak_bytes=2**30)
    logger.finish(record)
    out = capsys.readouterr().out
    assert "online logging failed" in out and "logging offline instead" in out
    assert f"wandb sync {record['wandb_dir']}" in out

    summary, records = read_run(record["wandb_dir"])
    assert history_by_step(records)[1]["reward"] == 0.5
    s = summary["summary"]
    assert s["status"] == "oom" and s["oom_phase"] == "backward" and s.get("objective") is None
    assert s["deficit_gib"] == 3.0 and s["predicted_peak_gib"] == 1.0
    assert "oom" in summary["tags"]
    leaked = [p for p in tmp_path.rglob("*") if p.is_file() and key.encode() in p.read_bytes()]
    assert key not in out and key not in json.dumps(record) and not leaked


def test_a_run_wandb_refuses_leaves_the_trial_without_a_logger(tmp_path, capsys):
    cfg = OmegaConf.create(
        OmegaConf.to_container(compose(["logger=wandb", "logger.mode=offline", "logger.project=bad/name"]), resolve=True)
    )
    record = {"backend": "trl"}
    logger = open_logger(cfg, tmp_path, record)
    logger.log_step({"step": 1, "reward": 0.0})  # a no-op, not an error
    logger.finish(record)
    assert "Invalid project name" in record["wandb_error"] and "wandb_run_id" not in record
    assert "no W&B run" in capsys.readouterr().out


def test_mode_auto_goes_online_only_with_a_key(tmp_path, monkeypatch):
    for var in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_BASE_URL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    assert resolve_mode("auto")[0] == "offline"
    (tmp_path / "netrc").write_text("machine api.wandb.ai\n  login user\n  password secret\n")
    assert resolve_mode("auto") == ("online", "an API key is configured")
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert resolve_mode("auto")[0] == "offline"
    assert resolve_mode("disabled")[0] == "disabled" and resolve_mode("online")[0] == "online"


def test_group_and_name_come_from_the_sweep(tmp_path):
    sweep = tmp_path / "multirun"
    (sweep / "3").mkdir(parents=True)
    (sweep / "multirun.yaml").write_text("{}\n")
    cfg = compose(
        ["logger=wandb", "lora_rank=32", "per_device_train_batch_size=2", "gradient_accumulation_steps=2", "num_generations=2"]
    )
    assert run_group(cfg, sweep / "3") == str(sweep.resolve())  # outside the cwd: the full path
    assert run_group(cfg, tmp_path) is None  # a lone run has no group
    assert run_group(compose(["logger=wandb", "trial.study=s1"]), sweep / "3") == "s1"
    assert run_group(compose(["logger=wandb", "logger.group=mine", "trial.study=s1"]), sweep / "3") == "mine"
    assert run_name(cfg) == "seq96-util0.6-b2x2-g2-r32"
    assert run_name(compose(["trial.number=7", "lora_rank=8"])) == "t7-seq96-util0.6-b4x1-g4-r8"


def test_logger_config_is_validated():
    from grpo_sweep.config.schema import ConfigError
    from grpo_sweep.config.validate import validate

    with pytest.raises(ConfigError, match="logger.mode=sometimes: must be one of auto, online, offline"):
        validate(compose(["logger=wandb", "logger.mode=sometimes"]))
    with pytest.raises(ConfigError, match="logger.init_timeout_s"):
        validate(compose(["logger=wandb", "logger.init_timeout_s=0"]))
