"""No secret in any output, and the SLURM path (Hydra's submitit launcher) runs real trials.

The secrets test runs a real sweep against PostgreSQL with its password in the storage URL and a
W&B key in the environment, logging to W&B offline, then searches every byte written under the
sweep directory (W&B's binary .wandb run files, Hydra's saved configs, logs, metrics.json, the
report, the study export) and the study's attributes for either secret.
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path
from urllib.parse import urlparse

import pytest
from helpers.runners import OFFLINE_ENV, SMALL, run_train, sweep_args, train_here
from helpers.studies import counted, load_study

FAKE_WANDB_KEY = "0123456789abcdef" * 2 + "fedcba98"  # 40 hex characters, the shape of a real key


def _files_holding(root: Path, secrets: list[bytes]) -> list[str]:
    hits = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            hits += [f"{path.relative_to(root)}: {s.decode()[:4]}..." for s in secrets if s in data]
    return hits


def test_a_key_and_a_storage_password_are_masked_in_any_line(monkeypatch):
    """credentials.redact, which every error line the sweep and the trial print goes through: the W&B
    key and a storage password (in the URL and as a query parameter) never appear, the rest stays."""
    from grpo_sweep.credentials import redact

    monkeypatch.setenv("WANDB_API_KEY", FAKE_WANDB_KEY)
    line = f"HTTPError 401 (key {FAKE_WANDB_KEY}) after postgresql://grpo:s3cret@db:5432/sweeps?password=s3cret"
    assert redact(line) == "HTTPError 401 (key ***) after postgresql://grpo:***@db:5432/sweeps?password=***"
    monkeypatch.delenv("WANDB_API_KEY")
    assert redact("no secret here: journal:/tmp/study.journal") == "no secret here: journal:/tmp/study.journal"


def test_the_submitit_local_launcher_composes_with_the_sweeper():
    """hydra/launcher=submitit_local, as the tests below use it, is found and composed beside the
    sweeper's own config before any job is submitted (grpo_slurm: test_multi_gpu.py)."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from grpo_sweep.config.compose import CONF_DIR
    from grpo_sweep.config.schema import register

    register()
    overrides = ["+sweeps=tiny_cpu", "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=15"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = hydra_compose("train", overrides=overrides, return_hydra_config=True)
    assert cfg.hydra.launcher._target_.endswith("LocalLauncher") and cfg.hydra.launcher.timeout_min == 15
    assert cfg.hydra.sweeper.study_name == "tiny_cpu"


@pytest.mark.slow
def test_no_secret_reaches_any_output(tmp_path, postgres):
    """The storage password and the W&B key in this sweep's command and environment reach no file, no stream and no study
    attribute."""
    password = urlparse(postgres).password
    assert password, "the test needs a storage URL with a password"
    name = f"secrets-{uuid.uuid4().hex[:8]}"
    sweep_dir = tmp_path / "sweep"
    cmd = sweep_args(
        sweep_dir,
        f"hydra.sweeper.storage={postgres}",
        f"hydra.sweeper.study_name={name}",
        "hydra.sweeper.n_trials=2",
        "logger=wandb",
        *SMALL,
    )
    result = train_here(cmd, env={**OFFLINE_ENV, "WANDB_API_KEY": FAKE_WANDB_KEY})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    study = load_study(postgres, name)
    assert len(counted(study)) == 2
    wandb_runs = list(sweep_dir.rglob("run-*.wandb"))
    assert len(wandb_runs) == 2, "each trial wrote its offline W&B run file"
    secrets = [password.encode(), FAKE_WANDB_KEY.encode()]
    assert _files_holding(sweep_dir, secrets) == []
    for stream in (result.stdout, result.stderr):
        assert password not in stream and FAKE_WANDB_KEY not in stream
    attrs = repr(
        [
            study.user_attrs,
            study._storage.get_study_system_attrs(study._study_id),
            [(t.user_attrs, t.system_attrs) for t in study.trials],
        ]
    )
    assert password not in attrs and FAKE_WANDB_KEY not in attrs


# 4 completions per step, held: one process accumulates 2 micro-batches of 2, two processes 1 each
HELD_4 = [o for o in SMALL if not o.startswith("completions_per_step=")] + ["completions_per_step=4"]
SUBMITIT = pytest.mark.xdist_group("submitit")  # one worker builds submitit_sweep and runs both of its tests


@pytest.fixture(scope="module")
def submitit_sweep(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """(sweep dir, finished train.py process) of one sweep through `hydra/launcher=submitit_local`: a
    grid over trial.num_processes, so one trial of one process and one of two ranks (torchrun inside
    the submitit job). Its own train.py process: submitit starts each job as a process of its own."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    root = tmp_path_factory.mktemp("submitit")
    result = run_train(
        sweep_args(
            root, "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=15", "hydra.sweeper.n_trials=2",
            "hydra.sweeper.sampler=grid", "trial.num_processes=choice(1,2)", *HELD_4,
        )
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return root, result


@SUBMITIT
@pytest.mark.slow
def test_sweep_through_submitit_local_launcher(submitit_sweep):
    """`hydra/launcher=submitit_local`: the same code path as submitit_slurm, jobs in submitit's own
    processes; two real trials finish and the study holds them. Over 20 s: the first of the two tests to run
    builds submitit_sweep: each trial in a job process of its own, importing torch and TRL, one with two torchrun ranks."""
    sweep_dir, _ = submitit_sweep
    study = load_study(f"journal:{sweep_dir / 'study.journal'}")
    trials = counted(study)
    assert len(trials) == 2 and all(t.state.name == "COMPLETE" for t in trials)
    assert all(t.user_attrs["status"] == "ok" and t.value > 0 for t in trials)
    assert list(sweep_dir.rglob(".submitit")), "the jobs ran through submitit"
    assert (sweep_dir / "best.yaml").exists()


@SUBMITIT
@pytest.mark.slow
def test_submitit_local_runs_a_two_process_trial(submitit_sweep):
    """A trial of 2 ranks (trial.num_processes=2, DDP over gloo) as a submitit job: torchrun inside
    the job, the study told the merged record (the largest rank's peak). Over 20 s: the first of the two tests to run
    builds submitit_sweep."""
    import json

    sweep_dir, _ = submitit_sweep
    study = load_study(f"journal:{sweep_dir / 'study.journal'}")
    (trial,) = [t for t in counted(study) if t.params["trial.num_processes"] == 2]
    assert trial.state.name == "COMPLETE" and trial.user_attrs["status"] == "ok"
    metrics = json.loads((Path(trial.user_attrs["run_dir"]) / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and len(metrics["rank_peak_memory_bytes"]) == 2
    assert metrics["peak_memory_bytes"] == max(metrics["rank_peak_memory_bytes"])
    assert trial.user_attrs["world_size"] == 2
    assert list(Path(trial.user_attrs["run_dir"]).parent.rglob(".submitit")), "the job ran through submitit"
