"""The Optuna sweeper (hydra/sweeper=grpo_optuna): real trials on the tiny model, a real journal storage.

Fast tests check the pieces (grammar -> distributions, metrics -> what Optuna is told, masking);
slow ones run `python train.py -m +sweeps=tiny_cpu` as users do.
"""

from __future__ import annotations

import json
import math
import signal
from pathlib import Path

import pytest
import yaml
from helpers.runners import SMALL, SPLIT_SPACE, read_csv, start_train, sweep_args, train_here, wait_for
from helpers.studies import counted, load_study, trials_so_far

from hydra_plugins.grpo_optuna_sweeper.outcome import memory_constraint


def test_grammar_to_distributions():
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    from hydra_plugins.grpo_optuna_sweeper.space import parse_space, to_override

    dists, fixed = parse_space(
        [
            "lora=choice(qv,all_linear)",
            "lora_rank=range(8,40,8)",
            "gpu_memory_utilization=interval(0.3,0.7)",
            "max_seq_length=int(interval(64,512))",
            "learning_rate=tag(log,interval(1e-6,1e-4))",
            "per_device_train_batch_size=tag(log,int(interval(1,16)))",
            "+sweeps=tiny_cpu",
            "trial.steps=2",
            "trial.debug_fault=null,oom",
        ]
    )
    assert dists["lora"] == CategoricalDistribution(["qv", "all_linear"])
    assert dists["lora_rank"] == IntDistribution(8, 32, step=8)  # Hydra's range excludes its stop
    assert dists["gpu_memory_utilization"] == FloatDistribution(0.3, 0.7)
    assert dists["max_seq_length"] == IntDistribution(64, 512)
    assert dists["learning_rate"] == FloatDistribution(1e-6, 1e-4, log=True)
    assert dists["per_device_train_batch_size"] == IntDistribution(1, 16, log=True)
    assert fixed == {"+sweeps": "+sweeps=tiny_cpu", "trial.steps": "trial.steps=2"}
    # Hydra's grammar: `null` in a sweep list stays `null` on the job's command line (None there).
    assert [to_override("trial.debug_fault", v) for v in dists["trial.debug_fault"].choices] == [
        "trial.debug_fault=null",
        "trial.debug_fault=oom",
    ]
    assert to_override("load_in_4bit", True) == "load_in_4bit=true"
    # A fixed value on the command line wins over the sweep file's range for the same key.
    dists, fixed = parse_space(["lora_rank=choice(8,16)", "lora_rank=32"])
    assert "lora_rank" not in dists and fixed["lora_rank"] == "lora_rank=32"


def test_the_resume_line_counts_done_trials_apart_from_queued_and_running():
    """The resume line names the trials done (those counted toward n_trials) and the queued and
    running ones apart: 4 done and 2 queued are not "6 trials"."""
    import optuna

    from hydra_plugins.grpo_optuna_sweeper.opening import resume_line

    study = optuna.create_study(study_name="s")
    for _ in range(4):
        study.tell(study.ask(), 1.0)
    study.enqueue_trial({"x": 1})
    study.enqueue_trial({"x": 2})
    assert resume_line(study) == "Resuming study 's' with 4 trials done, 2 queued"
    study.ask()  # takes a queued one: running
    assert resume_line(study) == "Resuming study 's' with 4 trials done, 1 queued, 1 running"
    one = optuna.create_study(study_name="one")
    one.tell(one.ask(), 1.0)
    assert resume_line(one) == "Resuming study 'one' with 1 trial done"


def test_metrics_to_optuna_outcome():
    from hydra_plugins.grpo_optuna_sweeper.outcome import judge

    gib = 2**30
    common = {"objective": "tokens_per_s", "direction": "maximize", "budget_bytes": 1 * gib, "headroom": None}
    ok = judge({"status": "ok", "tokens_per_s": 100.0, "peak_memory_bytes": 0.75 * gib, "memory_source": "cuda"}, **common)
    assert (ok.state, ok.value, ok.constraint) == ("COMPLETE", 100.0, -0.25 * gib)
    # Headroom 0.5: the same peak is now over the allowed half of the card.
    assert (
        judge(
            {"status": "ok", "tokens_per_s": 1.0, "peak_memory_bytes": 0.75 * gib, "memory_source": "cuda"},
            **{**common, "headroom": 0.5},
        ).constraint
        == 0.25 * gib
    )
    message = (
        "CUDA out of memory. Tried to allocate 512.00 MiB. GPU 0 has a total capacity of 1.00 GiB of which 128.00 MiB is free."
    )
    oom = judge({"status": "oom", "error": f"OutOfMemoryError: {message}", "peak_memory_bytes": 0.9 * gib}, **common)
    assert (oom.state, oom.value, oom.constraint) == ("COMPLETE", 0.0, 384 * 2**20)  # infeasible by the deficit
    assert oom.attrs["deficit_source"] == "oom message"
    assert judge({"status": "oom", "deficit_bytes": 1234}, **common).constraint == 1234
    failed = judge({"status": "timeout", "error": "trial exceeded trial.timeout_s=5 s"}, **common)
    assert failed.state == "FAIL" and "timeout_s" in failed.attrs["error"]
    # Process RSS on CPU is not device memory: it ran without OOM, so feasible (0), whatever the RSS.
    assert (
        judge(
            {"status": "ok", "tokens_per_s": 1.0, "peak_memory_bytes": 5 * gib, "memory_source": "cpu-rss"}, **common
        ).constraint
        == 0.0
    )
    assert judge(None, **common).state == "FAIL"
    assert math.isinf(judge({"status": "oom"}, **{**common, "direction": "minimize"}).value)


@pytest.mark.parametrize("name", ["tpe", "gp", "random", "grid"])
def test_every_sampler_choice_learns_from_constraints(name):
    """Each `hydra.sweeper.sampler` value builds and runs ask/tell with the memory constraint as the
    sweeper tells it (GPSampler needs scipy, a dependency of ours, not of optuna's)."""
    import optuna

    from hydra_plugins.grpo_optuna_sweeper.opening import build_sampler
    from hydra_plugins.grpo_optuna_sweeper.outcome import tell_constraint

    space = {
        "batch": optuna.distributions.CategoricalDistribution([1, 2, 4, 8]),
        "seq": optuna.distributions.IntDistribution(64, 256, step=64),
    }
    study = optuna.create_study(direction="maximize", sampler=build_sampler(name, 0, space))
    for _ in range(14):  # past the samplers' 10 start-up trials
        trial = study.ask(space)
        used = trial.params["batch"] * trial.params["seq"]
        tell_constraint(trial, float(used - 512))  # > 0: out of memory
        study.tell(trial, 0.0 if used > 512 else float(used))
    assert len(study.trials) == 14 and all(t.state.name == "COMPLETE" for t in study.trials)
    with pytest.raises(ValueError, match="tpe, gp, random, grid"):
        build_sampler("cmaes", 0, space)


def test_n_startup_trials_reaches_tpe_and_bad_values_are_refused():
    """hydra.sweeper.n_startup_trials: TPE asks that many random points, then models the study: with 2,
    the third ask already follows the told values (the fit region), with 10 it is still random."""
    import optuna

    from hydra_plugins.grpo_optuna_sweeper.opening import build_sampler

    space = {"x": optuna.distributions.IntDistribution(0, 1000)}

    def third_asks(startup: int) -> list[int]:
        xs = []
        for seed in range(12):
            study = optuna.create_study(direction="maximize", sampler=build_sampler("tpe", seed, space, startup))
            study.enqueue_trial({"x": 990})
            study.enqueue_trial({"x": 10})
            for _ in range(2):
                trial = study.ask(space)
                study.tell(trial, float(trial.params["x"]))
            xs.append(study.ask(space).params["x"])
        return xs

    modelled, random_ = third_asks(2), third_asks(10)
    assert sum(x > 500 for x in modelled) >= 10  # near the better told point
    assert 2 <= sum(x > 500 for x in random_) <= 10  # uniform: about half
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match=r"n_startup_trials=.*integer >= 0"):
            build_sampler("tpe", 0, space, bad)


def test_gp_learns_from_prescreened_points():
    """GPSampler fits on COMPLETE trials only: told PRUNED, it proposed pruned points again in 10 of
    15 asks after start-up; told COMPLETE at the worst value with the predicted deficit, 2 of 15."""
    import optuna

    from hydra_plugins.grpo_optuna_sweeper.opening import build_sampler
    from hydra_plugins.grpo_optuna_sweeper.outcome import for_sampler, prescreen_verdict, tell_constraint

    space = {
        "batch": optuna.distributions.CategoricalDistribution([1, 2, 4, 8, 16]),
        "seq": optuna.distributions.CategoricalDistribution([64, 128, 256]),
    }
    study = optuna.create_study(direction="maximize", sampler=build_sampler("gp", 0, space))
    pruned_after_start = 0
    for i in range(25):
        trial = study.ask(space)
        used = float(trial.params["batch"] * trial.params["seq"])
        verdict = for_sampler(prescreen_verdict(used, 512, 0.1), "gp", "maximize")
        if verdict is not None:
            pruned_after_start += i >= 10
            tell_constraint(trial, verdict.constraint)
            study.tell(trial, verdict.value, state=optuna.trial.TrialState[verdict.state])
        else:
            tell_constraint(trial, used - 512)
            study.tell(trial, used)
    assert pruned_after_start <= 4
    assert for_sampler(prescreen_verdict(1e9, 512, 0.1), "tpe", "maximize").state == "PRUNED"  # TPE reads PRUNED


def test_storage_password_is_masked():
    from grpo_sweep.credentials import mask_url as mask

    assert mask("postgresql://u:s3cr%40t@db:5432/x") == "postgresql://u:***@db:5432/x"
    assert mask("postgresql://db/x?user=u&password=s3cret") == "postgresql://db/x?user=u&password=***"
    assert mask("journal:outputs/sweeps/a/study.journal") == "journal:outputs/sweeps/a/study.journal"


def test_storage_sources_to_urls_by_hand(tmp_path, monkeypatch):
    """Each accepted storage source, and the URL SQLAlchemy gets for it."""
    import importlib.util
    from pathlib import Path

    from grpo_sweep.study.storage import StorageError, to_url

    monkeypatch.chdir(tmp_path)
    assert to_url("journal:runs/a.journal") == "journal:runs/a.journal"
    assert to_url("runs/a.log") == "runs/a.log"  # a journal by its suffix
    assert to_url("runs/a.db") == f"sqlite:///{tmp_path / 'runs' / 'a.db'}"
    assert to_url("b.sqlite3") == f"sqlite:///{Path('b.sqlite3').resolve()}"
    assert to_url("sqlite:////abs/a.db") == "sqlite:////abs/a.db"
    assert to_url("mysql://u@h/db") == "mysql://u@h/db"
    with pytest.raises(StorageError) as err:
        to_url("runs/a.txt")
    assert str(err.value) == (
        "storage 'runs/a.txt': not a storage URL and not a .journal/.log/.db/.sqlite file "
        "(use journal:PATH, sqlite:///PATH or postgresql://user:password@host/db)"
    )
    # SQLAlchemy 2 reads a bare postgresql:// as psycopg 3; with only psycopg2 installed, say so.
    only_psycopg2 = importlib.util.find_spec("psycopg") is None and importlib.util.find_spec("psycopg2") is not None
    for scheme in ("postgresql", "postgres"):
        expected = "postgresql+psycopg2://u:p@h/db" if only_psycopg2 else f"{scheme}://u:p@h/db"
        assert to_url(f"{scheme}://u:p@h/db") == expected
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name == "psycopg2" else None)
    assert to_url("postgres://u:p@h/db") == "postgresql+psycopg2://u:p@h/db"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name in ("psycopg", "psycopg2") else None)
    # psycopg 3 installed (with or without psycopg2): as given
    assert to_url("postgresql://u:p@h/db") == "postgresql://u:p@h/db"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)  # neither: as given (the error comes later)
    assert to_url("postgresql://u:p@h/db") == "postgresql://u:p@h/db"


def test_journal_path_by_hand():
    from pathlib import Path

    from grpo_sweep.study.storage import journal_path

    assert journal_path("journal:runs/a.journal") == Path("runs/a.journal")
    assert journal_path("runs/b.log") == Path("runs/b.log")
    from grpo_sweep.study.storage import is_journal

    assert is_journal("journal:runs/study")  # the prefix alone makes it a journal
    assert is_journal("runs/a.journal") and not is_journal("postgresql://h/db.log") and not is_journal("runs/a.db")


def test_repair_journal_by_hand(tmp_path):
    """A journal written byte by byte: an intact one is left alone; a torn one keeps its whole records
    in order, recovers the whole record appended right behind a tear, drops the torn bytes and keeps
    the original beside it."""
    from grpo_sweep.study.storage import repair_journal

    a = b'{"op_code": 0, "worker_id": "w", "study_name": "s"}\n'
    b = b'{"op_code": 1, "worker_id": "w"}\n'
    torn = b'{"op_code": 4, "wor'
    path = tmp_path / "study.journal"
    path.write_bytes(a + b)
    assert repair_journal(path) is None and path.read_bytes() == a + b
    assert not list(tmp_path.glob("*.bak"))
    path.write_bytes(a + torn + b + torn)  # lines: a | torn + b (a record behind a tear) | a torn tail
    message = repair_journal(path)
    assert path.read_bytes() == a + b
    (backup,) = tmp_path.glob("study.journal.torn-*.bak")
    assert backup.read_bytes() == a + torn + b + torn
    assert message == (
        f"Journal {path} repaired: dropped {2 * len(torn)} torn bytes (a write cut short by a crash or a full "
        f"disk), kept 2 records (1 recovered from behind the tear); the original is in {backup}"
    )
    path.write_bytes(a + b"not json\n" + b'["op_code"]\n' + b)  # whole lines, but not records
    message = repair_journal(path)
    assert "dropped 21 torn bytes (a write cut short by a crash or a full disk), kept 2 records; the original" in message
    assert path.read_bytes() == a + b


def test_storage_error_first_line_by_hand():
    """The line a storage failure is reported in: the root cause's first non-blank line, under its
    class name, the URL's password masked, at most 400 characters."""
    from grpo_sweep.study.retry import first_line

    try:
        try:
            raise OSError("\n  refused: bad password s3cret  \nsecond line")
        except OSError as root:
            raise RuntimeError("wrapper") from root
    except RuntimeError as err:
        assert first_line(err, "postgresql://user:s3cret@host/db") == "OSError: refused: bad password ***"
        assert first_line(err, "journal:s3cret.journal") == "OSError: refused: bad password s3cret"
    try:
        try:
            raise KeyError("inner")
        except KeyError:
            raise RuntimeError("outer")  # noqa: B904 - an implicit context is followed too
    except RuntimeError as err:
        assert first_line(err, "journal:a") == "KeyError: 'inner'"
    # The password is what follows the user's first colon, up to the first @ after the scheme.
    assert first_line(OSError("auth failed: pa:ss"), "postgresql://user:pa:ss@host/db") == "OSError: auth failed: ***"
    assert first_line(OSError("no pa"), "postgresql://user:pa@host/db?x=a@b") == "OSError: no ***"
    assert first_line(ValueError("x" * 500), "journal:a") == ("ValueError: " + "x" * 500)[:400]
    assert first_line(ValueError(""), "journal:a") == "ValueError: "


def test_storage_create_race_and_load_study_by_hand(tmp_path):
    """Which errors are a lost schema-creation race (retried), and how a reader finds its study:
    the only one, or the one named; anything else is a StorageError that lists what is there."""
    import optuna

    from grpo_sweep.study.storage import StorageError, _lost_create_race, load_study, open_storage, study_names

    class UniqueViolation(Exception):  # psycopg2.errors.UniqueViolation, by its class name
        pass

    class IntegrityError(Exception):  # sqlalchemy.exc.IntegrityError
        pass

    assert _lost_create_race(UniqueViolation("CREATE TYPE studydirection"))
    assert _lost_create_race(IntegrityError("(sqlite3) constraint failed"))
    assert _lost_create_race(RuntimeError('relation "studies" already exists'))
    assert _lost_create_race(RuntimeError("duplicate key value violates unique constraint"))
    assert not _lost_create_race(RuntimeError("connection refused"))
    assert not _lost_create_race(ValueError("password authentication failed for user"))

    for source in (f"journal:{tmp_path / 'a.journal'}", f"sqlite:///{tmp_path / 'a.db'}"):
        with pytest.raises(StorageError, match="no such"):
            load_study(source)
        storage = open_storage(source)
        assert study_names(storage) == []
        with pytest.raises(StorageError) as err:
            load_study(source)
        assert str(err.value) == f"--study is required; studies in {source}: none"
        optuna.create_study(study_name="one", storage=storage)
        assert load_study(source).study_name == "one"  # the only one: no name needed
        optuna.create_study(study_name="two", storage=storage)
        assert study_names(storage) == ["one", "two"]
        with pytest.raises(StorageError, match=r"--study is required; studies in .*: \['one', 'two'\]"):
            load_study(source)
        assert load_study(source, "two").study_name == "two"
        with pytest.raises(StorageError) as err:
            load_study(source, "three")
        assert str(err.value) == f"--study='three' not found; studies in {source}: ['one', 'two']"


@pytest.mark.slow
def test_tiny_cpu_sweep(tiny_sweep):
    """The CI sweep end to end (the run's `tiny_sweep`): trials run, the study is stored, the best is feasible, the report
    exists."""
    sweep_dir, result = tiny_sweep
    study = load_study(f"journal:{sweep_dir / 'study.journal'}")
    trials = counted(study)
    assert len(trials) == len(study.trials) == 6  # the default frontier start filled only the room left
    # tiny_cpu.yaml's enqueued probes ran first: the smallest and the largest micro-batch; then the frontier start.
    assert [t.params["per_device_train_batch_size"] for t in study.trials[:2]] == [1, 8]
    assert any(t.user_attrs.get("frontier_start") for t in study.trials[2:6])
    for t in trials:
        assert t.user_attrs["status"] in ("ok", "oom", "pruned")
        assert t.user_attrs["levers"]["per_device_train_batch_size"] == t.params["per_device_train_batch_size"]
        levers = t.user_attrs["levers"]  # one recipe: 8 completions per optimiser step, however split
        assert levers["per_device_train_batch_size"] * levers["gradient_accumulation_steps"] == 8
    best = yaml.safe_load((sweep_dir / "best.yaml").read_text())
    best_trial = study.trials[best["best_trial"]]
    assert best_trial.user_attrs["status"] == "ok"
    assert all(v <= 0 for v in best_trial.constraints.values())
    assert best["best_value"] == max(t.value for t in trials if t.user_attrs["status"] == "ok")
    assert best["command"].startswith("python train.py +sweeps=tiny_cpu ")
    assert f"per_device_train_batch_size={best_trial.params['per_device_train_batch_size']}" in best["command"]
    # The winner's reward beside its throughput (the warm tiny model earns some): "still learns"
    assert best["reward_mean"] == best_trial.user_attrs["reward_mean"] and best["reward_mean"] > 0
    assert "reward_change" in best and "reward" in result.stdout.split("=== Study")[-1]
    # The winner against its card's limit (memory/throughput.py limit_words): in best.yaml and printed.
    assert best["card_limit"].endswith("% of bandwidth") and f"runs at {best['card_limit']}" in result.stdout
    assert best_trial.user_attrs["mfu_training"] > 0 and best_trial.user_attrs["generation_s"] > 0
    rows = read_csv(sweep_dir / "trials.csv")
    assert [int(r["number"]) for r in rows] == list(range(6))
    assert {"status", "objective", "peak_memory_bytes", "predicted_peak_bytes", "lora_rank", "gradient_checkpointing"} <= set(
        rows[0]
    )
    for t in trials:  # the W&B grouping keys reached each trial's config
        assert t.user_attrs["status"] != "pruned"
        run_dir = t.user_attrs["run_dir"]
        config = yaml.safe_load(Path(run_dir, "config.yaml").read_text())
        assert (config["trial"]["study"], config["trial"]["number"]) == ("tiny_cpu", t.number)
    assert "Best: trial" in result.stdout and "optuna-dashboard" in result.stdout
    # Six trials leave no room for confirmation: unless the sampler repeated a config, no noise is
    # measured and the summary says the lead rests on one run each.
    if "noise" not in best:
        assert best["lead_note"].startswith("No config ran twice") and best["lead_note"] in result.stdout
    infeasible = [t for t in trials if t.user_attrs["status"] == "oom"]
    assert study.trials[1] in infeasible, "a micro-batch of 8 x 128 tokens cannot fit tiny_cpu's 96 MiB card"
    for t in infeasible:
        assert memory_constraint(t) > 0
    assert study.trials[1].user_attrs["deficit_bytes"] > 0
    # Progress: each finished trial's line counts k/N with the best so far; a running trial its steps.
    out = result.stdout + result.stderr
    assert "[trial] step 1/2" in out and "[trial] step 2/2" in out
    assert all(f"| trial {k}/6 |" in out for k in range(1, 7))
    assert f"best tokens_per_s={best['best_value']:.4g} (trial {best['best_trial']})" in out
    _check_report_on_the_real_study(sweep_dir, study, best)


def _check_report_on_the_real_study(sweep_dir: Path, study, best: dict) -> None:
    """`grpo-sweep report journal:<the study this sweep wrote>`, as a user runs it: every trial
    (OOM included) is in it, and it names best.yaml's winner, as does the sweep's own report.html."""
    import re

    from helpers.runners import cli

    out_dir = sweep_dir / "report_from_study"
    result = cli("report", f"journal:{sweep_dir / 'study.journal'}", "--out", str(out_dir))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"({len(study.trials)} trials: " in result.stdout and " oom" in result.stdout
    assert f"best: trial {best['best_trial']} " in result.stdout
    for html in (out_dir / "report.html", sweep_dir / "report.html"):
        text = html.read_text()
        assert re.search(r"Best feasible trial: <b>trial (\d+)</b>", text).group(1) == str(best["best_trial"]), html
        for t in study.trials:
            assert f'data-v="trial {t.number}"' in text, f"trial {t.number} missing from {html}"


@pytest.mark.slow
def test_oom_is_infeasible_and_a_killed_trial_fails(tmp_path):
    """A grid over injected faults: ok -> feasible, OOM -> infeasible with a deficit, SIGKILL -> FAIL."""
    result = train_here(sweep_args(tmp_path, "hydra.sweeper.sampler=grid", "trial.debug_fault=null,oom,signal", *SMALL))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    study = load_study(f"journal:{tmp_path / 'study.journal'}")
    by_fault = {t.params["trial.debug_fault"]: t for t in study.trials}
    assert set(by_fault) == {None, "oom", "signal"}  # the sweep list's null is None, as Hydra reads it
    ok, oom, killed = by_fault[None], by_fault["oom"], by_fault["signal"]
    assert ok.state.name == "COMPLETE" and ok.user_attrs["status"] == "ok" and ok.value > 0
    assert oom.state.name == "COMPLETE" and oom.user_attrs["status"] == "oom"
    assert memory_constraint(oom) > 0
    assert killed.state.name == "FAIL" and "SIGKILL" in killed.user_attrs["error"]
    assert yaml.safe_load((tmp_path / "best.yaml").read_text())["best_trial"] == ok.number


@pytest.mark.slow
def test_interrupted_sweep_resumes_without_duplicates(tmp_path):
    """SIGTERM mid-trial, then the same command: finished trials kept, the count reached, nothing run twice. Over 20 s: two
    sweeps (the interrupted one in its own process, the resume)."""
    # search_stop=false: the count is the point here, not the model's stop (lead.py)
    cmd = sweep_args(
        tmp_path, "hydra.sweeper.n_trials=3", "hydra.sweeper.search_stop=false", *SPLIT_SPACE, "max_seq_length=64", "lora=qv"
    )
    journal = f"journal:{tmp_path / 'study.journal'}"
    proc = start_train(cmd, tmp_path / "first.log")
    try:

        def one_done_one_mid_trial():
            """A finished trial in the study, and a trial process alive now that has not yet written
            its metrics.json: the signal then lands during a trial, not between two."""
            states = [t.state.name for t in trials_so_far(journal)]
            if "COMPLETE" not in states or "RUNNING" not in states:
                return False
            return any(not (d / "metrics.json").exists() for d in _live_trial_dirs(tmp_path))

        wait_for(one_done_one_mid_trial, timeout=300, every=0.1, proc=proc)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
    before = {t.number: t for t in load_study(journal).trials}
    done = {n: t.value for n, t in before.items() if t.state.name == "COMPLETE"}
    interrupted = [t for t in before.values() if t.user_attrs.get("status") == "interrupted"]
    wait_for(lambda: not _trial_processes(tmp_path), timeout=15)  # the trial's process died with the sweep
    assert len(interrupted) == 1 and interrupted[0].state.name == "FAIL"
    waiting = [t for t in before.values() if t.state.name == "WAITING"]
    retries = [t for t in waiting if t.system_attrs.get("failed_trial") == interrupted[0].number]
    assert len(retries) == 1  # its retry, queued; the rest are frontier start points not reached yet
    assert all(t.user_attrs.get("frontier_start") for t in waiting if t not in retries)

    result = train_here(cmd)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    study = load_study(journal)
    trials = counted(study)
    assert len(trials) == 3
    assert {t.number: t.value for t in study.trials if t.number in done} == done  # kept, not re-run
    retry = [t for t in study.trials if t.system_attrs.get("failed_trial") == interrupted[0].number]
    assert len(retry) == 1 and retry[0].state.name == "COMPLETE"
    assert retry[0].params == interrupted[0].params
    run_dirs = [t.user_attrs.get("run_dir") for t in trials]
    assert len(set(run_dirs)) == len(run_dirs) == 3


def test_hydra_discovers_the_plugin_and_the_sweeps():
    """Found from the installed package (namespace `hydra_plugins`), and `+sweeps=` lists our sweeps."""
    from helpers.runners import train_here

    info = train_here(["--info", "plugins"])
    assert info.returncode == 0, info.stderr[-2000:]
    assert "GrpoOptunaSweeper" in info.stdout
    help_text = train_here(["--help"]).stdout
    assert "sweeps: gemma3_1b_l4, llama3_2_1b_a100, qwen2_5_0_5b_t4, tiny_cpu" in help_text


@pytest.mark.slow
def test_estimator_prescreen_prunes_without_running(tmp_path):
    """A point the estimator puts far over a 1 MiB card is PRUNED, its prediction recorded, nothing run."""
    result = train_here(sweep_args(tmp_path, "hydra.sweeper.n_trials=2", *SPLIT_SPACE, "gpu.memory_gib=0.001"))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    study = load_study(f"journal:{tmp_path / 'study.journal'}")
    assert [t.state.name for t in study.trials] == ["PRUNED", "PRUNED"]
    for t in study.trials:
        assert t.user_attrs["predicted_peak_bytes"] > 1.1 * 2**20
        assert memory_constraint(t) > 0
        assert "run_dir" not in t.user_attrs and not list(tmp_path.glob("trial_*/metrics.json"))
    rows = read_csv(tmp_path / "trials.csv")
    assert all(int(r["predicted_peak_bytes"]) > 0 for r in rows)


def test_frontier_pick_is_fullest_fit_first_and_spread_out():
    from hydra_plugins.grpo_optuna_sweeper.space import candidates
    from hydra_plugins.grpo_optuna_sweeper.start import pick

    grid = {"batch": [2, 4, 8], "seq": [64, 96], "lora": ["qv", "all"]}
    points = list(candidates(grid, seed=0))
    assert len(points) == 12 and len({tuple(p.values()) for p in points}) == 12
    peak = lambda p: p["batch"] * p["seq"] * (1.1 if p["lora"] == "all" else 1.0)  # noqa: E731
    chosen = pick([(p, peak(p) / 600) for p in points], k=3, seed=0)
    assert chosen[0] == {"batch": 8, "seq": 64, "lora": "all"}  # 563: the fullest that fits (8x96 does not)
    assert all(peak(p) <= 600 for p in chosen)
    for i, a in enumerate(chosen):  # each pick differs from the earlier ones in >= half the parameters
        assert all(sum(a[n] != b[n] for n in a) * 2 >= len(a) for b in chosen[:i])
    assert pick([(p, peak(p) / 100) for p in points], k=3, seed=0) == []  # nothing fits
    big = {f"p{i}": list(range(4)) for i in range(6)}  # 4096 points: sampled down, no repeats
    sampled = list(candidates(big, seed=1))
    assert len(sampled) == 256 == len({tuple(p.values()) for p in sampled})


@pytest.mark.slow
def test_model_start_runs_the_fastest_predicted_fit_first(tiny_sweep):
    """The start (tiny_cpu's default: hydra.sweeper.start=model, the room the enqueued probes leave) runs
    the points the throughput model predicts fastest among those predicted to fit, fastest first; the
    model's order is on the study, and the summary says how far the measured order followed it."""
    sweep_dir, result = tiny_sweep
    out = result.stdout + result.stderr
    assert "Frontier start (model): enqueued 4 of" in out
    assert "Model vs measured rank" in out
    study = load_study(f"journal:{sweep_dir / 'study.journal'}")
    picks = [t for t in study.trials if t.user_attrs.get("frontier_start")]
    assert [t.number for t in picks] == [2, 3, 4, 5]  # right after the two probes
    assert {t.user_attrs["start"] for t in picks} == {"model"}
    speeds = [t.user_attrs["predicted_tokens_per_s"] for t in picks]  # recorded with the pre-screen off too
    assert speeds == sorted(speeds, reverse=True)
    ranking = study.user_attrs["model_ranking"]["top"]
    assert [r["params"] for r in ranking[:4]] == [t.params for t in picks]
    budget = picks[0].user_attrs["budget_bytes"]
    # the pre-screen is off in this sweep: each trial's own prediction (the same estimator) is in its metrics.json
    predicted = [json.loads(Path(t.user_attrs["run_dir"], "metrics.json").read_text())["predicted_peak_bytes"] for t in picks]
    assert all(p <= budget for p in predicted)
    assert [t.user_attrs["status"] for t in picks[:2]] == ["ok", "ok"]


def _open_trial_logs(sweep_dir) -> dict[int, set[Path]]:
    """pid -> the run directories under sweep_dir whose trial.log that process holds open."""
    import os

    out = {}
    for proc_dir in Path("/proc").iterdir():
        if proc_dir.name.isdigit():
            try:
                targets = [os.readlink(fd) for fd in (proc_dir / "fd").iterdir()]
            except OSError:
                continue
            dirs = {Path(t).parent for t in targets if t.startswith(str(sweep_dir)) and t.endswith("trial.log")}
            if dirs:
                out[int(proc_dir.name)] = dirs
    return out


def _live_trial_dirs(sweep_dir) -> set[Path]:
    """Run directories whose trial.log a live process holds open (a trial under way)."""
    return set().union(*_open_trial_logs(sweep_dir).values())


def _trial_processes(sweep_dir) -> list[int]:
    """Processes that still hold a trial.log under sweep_dir open (a trial child outliving its sweep)."""
    return list(_open_trial_logs(sweep_dir))


@pytest.mark.slow
def test_warm_start_runs_the_preset_first_and_reports_the_ratio(tmp_path):
    """seed_optimized is trial 0 (its levers, where the space allows, as parameters); best.yaml has the ratio.

    The preset's 4-bit weights need CUDA, so this CPU test pins load_in_4bit=false and a short sequence
    on the command line (explicit keys win over the preset, as in `python train.py preset=...`).
    """
    result = train_here(
        sweep_args(
            tmp_path,
            "hydra.sweeper.n_trials=2",
            "hydra.sweeper.warm_start=true",
            "hydra.sweeper.presets=[seed_optimized]",
            *SPLIT_SPACE,
            "load_in_4bit=false",
            "max_seq_length=64",
            "max_prompt_length=32",
            "completions_per_step=4",  # the recipe: seed_optimized's own 2 x 2
        )
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    study = load_study(f"journal:{tmp_path / 'study.journal'}")
    first = study.trials[0]
    assert first.user_attrs["preset"] == "seed_optimized" and "preset=seed_optimized" in first.user_attrs["overrides"]
    assert first.params == {"per_device_train_batch_size": 2, "gradient_checkpointing": False}  # seed_optimized's values
    levers = first.user_attrs["levers"]
    assert (levers["gradient_accumulation_steps"], levers["num_generations"]) == (2, 2)  # from the preset
    best = yaml.safe_load((tmp_path / "best.yaml").read_text())
    assert first.user_attrs["status"] == "ok"
    ratio = best["vs_presets"]["seed_optimized"]["ratio"]
    assert ratio == pytest.approx(best["best_value"] / first.value) and ratio >= 1.0
    assert "vs seed_optimized:" in result.stdout


def test_open_storage_creates_only_the_sweep_folder_and_passes_the_heartbeat(tmp_path):
    """A journal or SQLite file in a folder that does not exist: an error naming the folder (a typo in
    a resume path must not start a new, empty study), unless the folder is the one the caller may
    create (the sweep directory). An RDB storage gets the heartbeat, the grace period and the
    stale-trial callback it was given."""
    from grpo_sweep.study.storage import StorageError, open_storage

    for source in (f"journal:{tmp_path / 'a' / 'b' / 'study.journal'}", f"sqlite:///{tmp_path / 'a' / 'b' / 'x.db'}"):
        with pytest.raises(StorageError, match=f"folder {tmp_path / 'a' / 'b'} does not exist"):
            open_storage(source)
        assert not (tmp_path / "a").exists()
    open_storage(f"journal:{tmp_path / 'a' / 'b' / 'study.journal'}", may_create_dir=tmp_path / "a" / "b")
    assert (tmp_path / "a" / "b").is_dir()

    def callback(study, trial):  # the sweeper's retry of a dead worker's trial
        pass

    rdb = open_storage(
        f"sqlite:///{tmp_path / 'c' / 'd' / 'x.db'}",
        heartbeat_interval=7,
        grace_period=30,
        stale_trial_callback=callback,
        may_create_dir=tmp_path / "c" / "d",
    )
    assert (tmp_path / "c" / "d" / "x.db").is_file()
    assert (rdb.heartbeat_interval, rdb.grace_period, rdb.failed_trial_callback) == (7, 30, callback)


def test_open_storage_retries_only_a_lost_schema_race(monkeypatch):
    """Workers started together on a fresh database all run Optuna's CREATE TABLE / CREATE TYPE and
    all but one fail with a unique violation. open_storage retries that error, up to
    CREATE_ATTEMPTS times with a growing pause, and nothing else: another error is raised at once.
    The constructor below raises the recorded errors in turn (the real race, 3 workers on a fresh
    PostgreSQL database, is the slow test in test_sweeper_workers.py)."""
    import optuna

    from grpo_sweep.study import storage as st

    calls, sleeps = [], []

    def rdb(errors):
        def build(url, **kwargs):
            calls.append(kwargs)
            if errors:
                raise errors.pop(0)
            return "the storage"

        return build

    monkeypatch.setattr(st.time, "sleep", sleeps.append)
    race = RuntimeError('(psycopg.errors.UniqueViolation) duplicate key value violates "pg_type_typname_nsp_index"')
    monkeypatch.setattr(optuna.storages, "RDBStorage", rdb([race, race]))
    assert st.open_storage("postgresql://u@localhost/fresh") == "the storage"
    # A growing pause with jitter (workers that lost together do not retry together): 0.2 s x the
    # attempt, plus up to 0.3 s; the windows overlap, so two pauses need not be in order.
    assert len(calls) == 3 and len(sleeps) == 2
    assert 0.2 <= sleeps[0] < 0.5 and 0.4 <= sleeps[1] < 0.7
    assert calls[0]["engine_kwargs"] == {"pool_pre_ping": True}  # a server connection is checked before use

    calls.clear()
    monkeypatch.setattr(optuna.storages, "RDBStorage", rdb([ConnectionRefusedError("connection refused")]))
    with pytest.raises(ConnectionRefusedError):
        st.open_storage("postgresql://u@localhost/fresh")
    assert len(calls) == 1

    calls.clear()
    monkeypatch.setattr(optuna.storages, "RDBStorage", rdb([race] * st.CREATE_ATTEMPTS))
    with pytest.raises(RuntimeError, match="UniqueViolation"):
        st.open_storage("postgresql://u@localhost/fresh")
    assert len(calls) == st.CREATE_ATTEMPTS

    calls.clear()
    monkeypatch.setattr(optuna.storages, "RDBStorage", rdb([]))
    st.open_storage(f"sqlite:///{Path('/tmp') / 'grpo_sweep_never_written.db'}")
    assert calls[0]["engine_kwargs"] is None  # SQLite: the default pool
