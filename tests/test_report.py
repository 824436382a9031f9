"""`grpo-sweep report` on a real multirun (and on a real Optuna SQLite study built from it)."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import subprocess
from html.parser import HTMLParser

import pytest
from helpers.runners import load_metrics

from grpo_sweep import cli as grpo_cli
from grpo_sweep.cli.report import cli
from grpo_sweep.levers import LEVER_NAMES
from grpo_sweep.report.trials import Trial, lever_effects, load_dir, load_presets, match_preset

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--no-first-run",
    "--disable-component-update",
    "--disable-sync",
]


class TableRows(HTMLParser):
    """Rows of the trials table: {trial name: (status, {column key: data-v})}, in document order."""

    def __init__(self):
        super().__init__()
        self.rows, self._keys, self._row, self._in, self._col = [], [], None, False, 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self._in = a.get("id") == "trials"
        elif self._in and tag == "th":
            self._keys.append(a["data-key"])
        elif self._in and tag == "tr" and "data-status" in a:
            self._row, self._col = {"_status": a["data-status"], "_class": a["class"]}, 0
            self.rows.append(self._row)
        elif self._in and tag == "td" and self._row is not None:
            self._row[self._keys[self._col]] = a.get("data-v", "")
            self._col += 1

    def handle_endtag(self, tag):
        if tag == "table":
            self._in = False


def table_rows(html_text: str) -> list[dict]:
    parser = TableRows()
    parser.feed(html_text)
    return parser.rows


@pytest.fixture(scope="module")
def sweep(wandb_sweep):
    """The 4-trial offline-W&B multirun (conftest.wandb_sweep: built once per test run)."""
    return wandb_sweep[0]


@pytest.fixture(scope="module")
def report(sweep):
    """`grpo-sweep report SWEEP --wandb`, through the CLI dispatcher; returns (sweep, stdout)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert grpo_cli.main(["report", str(sweep), "--wandb"]) == 0
    return sweep, buf.getvalue()


@pytest.mark.slow
def test_report_lists_every_trial_and_writes_its_figures(report):
    """Over 20 s: its setup is the once-per-run offline-W&B multirun (conftest.wandb_sweep); the test itself reads it."""
    sweep, stdout = report
    html_text = (sweep / "report.html").read_text()
    images = re.findall(r'<img src="([^"]+)"', html_text)
    assert {"throughput_vs_memory.png", "lever_effects.png", "reward_curves.png"} <= set(images)
    for name in images:
        data = (sweep / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name

    expected = {str(d.name): load_metrics(d)["status"] for d in sweep.iterdir() if (d / "metrics.json").exists()}
    assert sorted(expected.values()) == ["ok", "ok", "oom", "oom"]
    rows = table_rows(html_text)
    assert {r["name"]: r["_status"] for r in rows} == expected
    assert {r["_class"].split()[0] for r in rows} == {"feasible", "oom"}
    for r in rows:
        m = load_metrics(sweep / r["name"])
        assert r["lora_rank"] == str(m["levers"]["lora_rank"]) and r["wandb"] == m["wandb_run_id"]

    best = max((load_metrics(sweep / n) for n, s in expected.items() if s == "ok"), key=lambda m: m["tokens_per_s"])
    assert f"lora_rank={best['levers']['lora_rank']} " in stdout
    assert re.search(
        rf"<pre id=best-overrides>python train.py model=tiny gpu=cpu .*lora_rank={best['levers']['lora_rank']}", html_text
    )
    assert "<td class=l>lora_rank</td><td>8</td><td>16</td>" in html_text  # the measured-effect row
    assert "(4 trials: 2 feasible, 2 oom)" in stdout


@pytest.mark.slow
def test_wandb_report_spec_names_panels_and_metrics(report):
    sweep, stdout = report
    spec_path = sweep / "wandb_report.json"
    assert f"grpo-sweep report --publish {spec_path}" in stdout  # offline: how to publish it
    data = json.loads(spec_path.read_text())
    group = load_metrics(sweep / "0")["wandb_group"]
    assert data["group"] == group == str(sweep.resolve()) and data["project"] == "grpo-sweep"
    grid = next(b for b in data["viewspec"]["spec"]["blocks"] if b["type"] == "panel-grid")["metadata"]
    (runset,) = grid["runSets"]
    assert runset["filters"]["filters"] == [
        {"key": {"section": "run", "name": "group"}, "op": "=", "value": group, "disabled": False}
    ]
    panels = {p["viewType"]: p for p in grid["panelBankSectionConfig"]["panels"]}
    scatter = panels["Scatter Plot"]["config"]
    assert (scatter["xAxis"], scatter["yAxis"]) == ("summary:peak_memory_gib", "summary:tokens_per_s")
    columns = [c["accessor"] for c in panels["Parallel Coordinates Plot"]["config"]["columns"]]
    assert columns == [f"config:{lv}.value" for lv in LEVER_NAMES] + ["summary:peak_memory_gib", "summary:tokens_per_s"]
    assert "Run Comparer" in panels
    lines = [p["config"]["metrics"] for p in grid["panelBankSectionConfig"]["panels"] if p["viewType"] == "Run History Line Plot"]
    assert ["reward"] in lines and ["reward/correctness_reward", "reward/format_reward"] in lines
    from grpo_sweep.report.wandb_report import load_spec

    assert load_spec(spec_path).title.startswith("grpo-sweep report")  # publishable as written


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium: apt-get update && apt-get install -y chromium")
def test_report_renders_in_headless_chromium(report, tmp_path):
    sweep, _ = report
    url = (sweep / "report.html").resolve().as_uri() + "#sort=-lora_rank"
    flags = [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr"]
    dom = subprocess.run([*flags, "--dump-dom", url], check=False, capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    body = re.search(r"<body[^>]*>", dom.stdout).group(0)
    n_images = len(re.findall(r"<img ", (sweep / "report.html").read_text()))
    assert 'data-report-js="ready"' in body  # the inline script ran to its end
    assert f'data-images-loaded="{n_images}/{n_images}"' in body  # every PNG decoded
    assert "Uncaught" not in dom.stderr
    ranks = [int(r["lora_rank"]) for r in table_rows(dom.stdout)]
    assert ranks == sorted(ranks, reverse=True) and len(ranks) == 4  # #sort=-lora_rank sorted the table
    shot = tmp_path / "report.png"
    subprocess.run([*flags, "--window-size=1280,2400", f"--screenshot={shot}", url], capture_output=True, timeout=120, check=True)
    assert shot.stat().st_size > 20_000


@pytest.mark.slow
def test_report_on_an_optuna_study(sweep, tmp_path, capsys):
    """A real SQLite study whose trials point at the multirun's run dirs, with flat user attrs as the
    Optuna sweeper stores them (status, run_dir, predicted_peak_bytes, preset)."""
    import optuna

    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="s1", storage=storage, direction="maximize")
    optuna.create_study(study_name="other", storage=storage)
    dist = {"lora_rank": optuna.distributions.CategoricalDistribution([8, 16, 32])}
    for trial in load_dir(sweep):
        ok = trial.status == "ok"
        study.add_trial(
            optuna.trial.create_trial(
                params={"lora_rank": trial.levers["lora_rank"]},
                distributions=dist,
                value=trial.record["tokens_per_s"] if ok else None,
                state=optuna.trial.TrialState.COMPLETE if ok else optuna.trial.TrialState.FAIL,
                user_attrs={
                    "run_dir": trial.run_dir,
                    "status": trial.status,
                    "predicted_peak_bytes": int(trial.record["peak_memory_bytes"] * 1.1),
                },
            )
        )
    study.add_trial(
        optuna.trial.create_trial(  # pre-screened by the estimator: attrs only, no run dir
            params={"lora_rank": 32},
            distributions=dist,
            state=optuna.trial.TrialState.PRUNED,
            user_attrs={"status": "pruned", "predicted_peak_bytes": 2**31, "preset": "seed_baseline"},
        )
    )

    assert cli([storage, "--out", str(tmp_path)]) == 2
    assert re.search(r"--study is required; studies in .*'s1'", capsys.readouterr().err)
    assert cli([storage, "--study", "s1", "--out", str(tmp_path / "out")]) == 0
    html_text = (tmp_path / "out" / "report.html").read_text()
    rows = table_rows(html_text)
    assert [r["name"] for r in rows] == [f"trial {i}" for i in range(5)]
    assert [r["_status"] for r in rows].count("pruned") == 1 and [r["_status"] for r in rows].count("ok") == 2
    assert "<h2>Parameter importances (Optuna)</h2>" in html_text
    assert rows[4]["preset"] == "seed_baseline" and rows[4]["predicted_gib"] == "2.0"
    assert float(rows[0]["predicted_gib"]) > float(rows[0]["peak_gib"])  # attrs and metrics.json merged
    assert (tmp_path / "out" / "predicted_vs_measured.png").stat().st_size > 5000
    assert (tmp_path / "out" / "throughput_vs_memory.png").stat().st_size > 5000


def test_seed_presets_are_recognised():
    presets = load_presets()
    assert {"seed_baseline", "seed_optimized"} <= set(presets)
    levers = {**dict.fromkeys(LEVER_NAMES), **presets["seed_optimized"], "lora_target_modules": ["q_proj"]}
    assert match_preset(levers, presets) == "seed_optimized"
    assert match_preset({**levers, "lora_rank": 64}, presets) is None


def test_lever_effect_prefers_controlled_pairs():
    base = {"lora_rank": 8, "per_device_train_batch_size": 4}

    def trial(name, peak, tps, **levers):
        return Trial(
            name=name, record={"status": "ok", "levers": {**base, **levers}, "peak_memory_bytes": peak, "tokens_per_s": tps}
        )

    trials = [
        trial("a", 100, 10.0),
        trial("b", 150, 8.0, lora_rank=16),
        trial("c", 300, 20.0, per_device_train_batch_size=8, lora_rank=32),
    ]
    rows = {r["lever"]: r for r in lever_effects(trials)}
    assert rows["lora_rank"]["peak_change_pct"] == pytest.approx(50.0)  # the a/b pair only
    assert rows["lora_rank"]["objective_change_pct"] == pytest.approx(-20.0)
    assert rows["lora_rank"]["basis"].startswith("1 pair")
    batch = rows["per_device_train_batch_size"]  # no controlled pair: medians, and it says so
    assert batch["low"] == "4" and batch["high"] == "8" and "other settings varied" in batch["basis"]


def test_lever_effects_cover_boolean_and_categorical_knobs_not_the_derived_accumulation():
    """A held completions_per_step: the split's micro-batch and gradient checkpointing (a boolean in
    config.yaml, not a lever) and the backend (a choice) get rows; the accumulation, which the
    micro-batch decides, does not."""

    def trial(name, peak, tps, batch, checkpointing, backend="trl"):
        levers = {"per_device_train_batch_size": batch, "gradient_accumulation_steps": 8 // batch}
        config = {"completions_per_step": 8, "gradient_checkpointing": checkpointing, "backend": {"name": backend}}
        return Trial(
            name=name, record={"status": "ok", "levers": levers, "peak_memory_bytes": peak, "tokens_per_s": tps}, config=config
        )

    trials = [
        trial("a", 100, 10.0, 2, False),
        trial("b", 80, 8.0, 2, True),
        trial("c", 150, 12.0, 4, False),
        trial("d", 160, 14.0, 4, False, backend="trl_vllm"),
    ]
    rows = {r["lever"]: r for r in lever_effects(trials)}
    assert set(rows) == {"per_device_train_batch_size", "gradient_checkpointing", "backend"}
    assert rows["gradient_checkpointing"]["low"] == "False" and rows["gradient_checkpointing"]["high"] == "True"
    assert rows["gradient_checkpointing"]["peak_change_pct"] == pytest.approx(-20.0)
    assert rows["gradient_checkpointing"]["basis"].startswith("1 pair")  # a vs b
    assert rows["per_device_train_batch_size"]["basis"].startswith("1 pair")  # a vs c: the accumulation is not a difference
    assert rows["backend"]["low"] == "trl" and rows["backend"]["high"] == "trl_vllm"
    assert "the generation engine" in rows["backend"]["expected"]  # levers.KINDS's reason


def test_bad_source_is_named(capsys):
    assert cli(["/nonexistent/x"]) == 2
    assert "'/nonexistent/x' is neither a directory, a storage URL nor a file" in capsys.readouterr().err


def test_memory_fields_from_other_modules_show_up(tmp_path):
    """Keys the memory modules add (budget, prediction, phases, deficit) reach the page when present."""
    from grpo_sweep.report.html import write_report

    presets = load_presets()
    base = {**dict.fromkeys(LEVER_NAMES, 1), "lora_target_modules": ["q_proj", "v_proj"]}
    seed = {**base, **presets["seed_optimized"]}
    gib = 2**30

    def trial(name, status, levers, **record):
        return Trial(
            name=name,
            record={"status": status, "levers": levers, "budget_bytes": 20 * gib, **record},
            config={"objective": "tokens_per_s", "gpu": {"name": "l4_24g", "memory_gib": 22.06}},
        )

    trials = [
        trial(
            "fits",
            "ok",
            {**base, "lora_rank": 16},
            tokens_per_s=900.0,
            peak_memory_bytes=12 * gib,
            predicted_peak_bytes=13 * gib,
            peak_phase="backward",
        ),
        trial("seed", "ok", seed, tokens_per_s=700.0, peak_memory_bytes=15 * gib, predicted_peak_bytes=14 * gib),
        trial(
            "too big",
            "oom",
            {**base, "lora_rank": 64},
            oom_phase="logits",
            deficit_bytes=3 * gib,
            requested_bytes=4 * gib,
            error="CUDA out of memory. Tried to allocate 4.00 GiB",
        ),
        trial("screened", "pruned", {**base, "max_seq_length": 4096}, predicted_peak_bytes=31 * gib),
    ]
    for t in trials:
        t.preset = match_preset(t.levers, presets)
    page = write_report(trials, tmp_path, title="synthetic").read_text()
    assert "Budget 20.00 GiB." in page
    assert "<pre id=best-overrides>python train.py gpu=l4_24g" in page
    rows = {r["name"]: r for r in table_rows(page)}
    assert rows["seed"]["preset"] == "seed_optimized" and rows["fits"]["peak_phase"] == "backward"
    assert rows["too big"]["oom_phase"] == "logits" and rows["too big"]["deficit_gib"] == "3.0"
    assert rows["screened"]["_status"] == "pruned" and rows["fits"]["_class"] == "feasible best"
    for png in ("throughput_vs_memory", "predicted_vs_measured", "lever_effects"):
        assert (tmp_path / f"{png}.png").stat().st_size > 5000


def test_report_reads_a_journal_study_with_importances(tmp_path):
    """The sweeper's default storage (a journal file), trials known only from their user attrs."""
    import optuna
    from optuna.storages.journal import JournalFileBackend

    path = tmp_path / "study.journal"
    study = optuna.create_study(
        study_name="j", direction="maximize", storage=optuna.storages.JournalStorage(JournalFileBackend(str(path)))
    )
    dists = {
        "lora_rank": optuna.distributions.IntDistribution(8, 64),
        "per_device_train_batch_size": optuna.distributions.IntDistribution(1, 8),
    }
    for i, (rank, batch, tps) in enumerate([(8, 2, 500.0), (16, 4, 900.0), (64, 8, 1200.0), (32, 2, 450.0)]):
        status = "oom" if i == 2 else "ok"
        study.add_trial(
            optuna.trial.create_trial(
                params={"lora_rank": rank, "per_device_train_batch_size": batch},
                distributions=dists,
                value=tps if status == "ok" else 0.0,
                state=optuna.trial.TrialState.COMPLETE,
                user_attrs={
                    "status": status,
                    "tokens_per_s": tps if status == "ok" else None,
                    "peak_memory_bytes": (rank + 10 * batch) * 2**24,
                    "levers": {"lora_rank": rank, "per_device_train_batch_size": batch},
                },
            )
        )
    # Fastest, ran without OOM, but over the sweep's headroom: the study marked it infeasible.
    study.add_trial(
        optuna.trial.create_trial(
            params={"lora_rank": 8, "per_device_train_batch_size": 8},
            distributions=dists,
            value=2000.0,
            state=optuna.trial.TrialState.COMPLETE,
            constraints={"memory_over_budget_bytes": float(2**24)},
            user_attrs={
                "status": "ok",
                "tokens_per_s": 2000.0,
                "peak_memory_bytes": 90 * 2**24,
                "levers": {"lora_rank": 8, "per_device_train_batch_size": 8},
            },
        )
    )
    assert cli([f"journal:{path}", "--out", str(tmp_path / "out")]) == 0  # the only study: no --study needed
    page = (tmp_path / "out" / "report.html").read_text()
    assert '<img src="param_importances.png"' in page
    assert (tmp_path / "out" / "param_importances.png").stat().st_size > 3000
    rows = {r["name"]: r for r in table_rows(page)}
    assert rows["trial 2"]["_status"] == "oom" and rows["trial 1"]["_class"] == "feasible best"
    assert rows["trial 4"]["_class"] == "over_headroom" and rows["trial 4"]["_status"] == "ok"
    assert "<pre id=best-overrides>python train.py per_device_train_batch_size=4 lora_rank=16</pre>" in page


def _study_with_trials(storage, name: str, direction: str):
    """A study the way the sweeper leaves one: ok trials with their metrics as user attrs, one OOM."""
    import optuna

    study = optuna.create_study(study_name=name, direction=direction, storage=storage)
    dists = {"lora_rank": optuna.distributions.IntDistribution(8, 64)}
    for rank, value, status in [(8, 0.30, "ok"), (16, 0.20, "ok"), (32, 0.25, "ok"), (64, 0.0, "oom")]:
        study.add_trial(
            optuna.trial.create_trial(
                params={"lora_rank": rank},
                distributions=dists,
                value=value,
                state=optuna.trial.TrialState.COMPLETE,
                constraints={"memory_over_budget_bytes": 1.0 if status == "oom" else -1.0},
                user_attrs={
                    "status": status,
                    "step_time_s": value if status == "ok" else None,
                    "peak_memory_bytes": rank * 2**24,
                    "levers": {"lora_rank": rank},
                },
            )
        )
    return study


@pytest.mark.parametrize("direction, best_rank", [("minimize", 16), ("maximize", 8)])
def test_report_and_sweep_summary_name_the_same_winner(tmp_path, direction, best_rank):
    """One best-trial rule: the HTML report and the sweeper's best.yaml follow the study's direction."""
    from grpo_sweep.study.storage import open_storage
    from hydra_plugins.grpo_optuna_sweeper.standings import best_trial as summary_best

    source = f"journal:{tmp_path / 'study.journal'}"
    study = _study_with_trials(open_storage(source), "d", direction)
    assert summary_best(study).params["lora_rank"] == best_rank
    assert cli([source, "--out", str(tmp_path / "out")]) == 0
    rows = {r["name"]: r for r in table_rows((tmp_path / "out" / "report.html").read_text())}
    best = [name for name, r in rows.items() if "best" in r["_class"].split()]
    assert best == [f"trial {[8, 16, 32, 64].index(best_rank)}"], rows


def test_report_reads_a_postgresql_study(tmp_path, capsys, postgres):
    """`grpo-sweep report postgresql://...` opens the storage the way the sweeper does (one opener)."""
    import uuid

    from grpo_sweep.study.storage import open_storage

    url = postgres
    name = f"report-{uuid.uuid4().hex[:8]}"
    _study_with_trials(open_storage(url), name, "maximize")
    assert grpo_cli.main(["report", url, "--study", name, "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert "4 trials" in out and "best: trial 0" in out
    assert url.split("://", 1)[1].split("@")[0].split(":")[1] not in out  # the password is never printed


def test_reward_change_beside_throughput(tmp_path):
    """Each trial's reward change in the table, the best config's reward beside its throughput, and
    a long run's moving reward curve."""
    from grpo_sweep.report.html import write_report

    base = {**dict.fromkeys(LEVER_NAMES, 1), "lora_target_modules": ["q_proj", "v_proj"]}
    rewards = [0.1 + 0.003 * i for i in range(40)]
    history = [{"step": i + 1, "reward": r} for i, r in enumerate(rewards)]
    trials = [
        Trial(
            name="learns",
            record={
                "status": "ok",
                "levers": {**base, "lora_rank": 16},
                "tokens_per_s": 900.0,
                "peak_memory_bytes": 2**20,
                "reward_mean": sum(rewards) / 40,
                "reward_first": rewards[0],
                "reward_last": rewards[-1],
                "reward_change": sum(rewards[-10:]) / 10 - sum(rewards[:10]) / 10,
                "history": history,
            },
            config={"objective": "tokens_per_s"},
        ),
        Trial(
            name="slower",
            record={"status": "ok", "levers": {**base, "lora_rank": 8}, "tokens_per_s": 500.0, "peak_memory_bytes": 2**20},
            config={"objective": "tokens_per_s"},
        ),
    ]
    page = write_report(trials, tmp_path, title="rewards").read_text()
    rows = {r["name"]: r for r in table_rows(page)}
    assert float(rows["learns"]["reward_change"]) == pytest.approx(0.09) and float(rows["learns"]["reward_first"]) == 0.1
    assert rows["slower"]["reward_change"] == ""  # no reward logged: an empty cell, not a zero
    mean = sum(rewards) / 40
    assert f"tokens_per_s 900.0, peak 0.001 GiB, reward {mean:.3f} (first step 0.100 -&gt; last 0.217" in page
    assert "last quarter - first quarter +0.090)" in page
    assert (tmp_path / "reward_curves.png").stat().st_size > 5000


def test_directory_report_reads_the_study_next_to_the_trials(tmp_path, capsys):
    """A sweep directory holds study.journal: its pruned (never run) trials are in the report too."""
    import optuna

    from grpo_sweep.study.storage import SWEEP_JOURNAL, open_storage

    study = optuna.create_study(
        study_name="sweep", direction="maximize", storage=open_storage(f"journal:{tmp_path / SWEEP_JOURNAL}")
    )
    dists = {"lora_rank": optuna.distributions.IntDistribution(8, 64)}
    run_dir = tmp_path / "trial_0000"
    run_dir.mkdir()
    (run_dir / "metrics.json").write_text(
        json.dumps({"status": "ok", "tokens_per_s": 900.0, "peak_memory_bytes": 2**26, "levers": {"lora_rank": 8}})
    )
    study.add_trial(
        optuna.trial.create_trial(
            params={"lora_rank": 8}, distributions=dists, value=900.0, user_attrs={"status": "ok", "run_dir": str(run_dir)}
        )
    )
    study.add_trial(
        optuna.trial.create_trial(
            params={"lora_rank": 64},
            distributions=dists,
            state=optuna.trial.TrialState.PRUNED,
            user_attrs={"status": "pruned", "predicted_peak_bytes": 2**33},
        )
    )
    assert cli([str(tmp_path)]) == 0
    assert "2 trials: 1 feasible, 1 pruned" in capsys.readouterr().out
    rows = {r["name"]: r for r in table_rows((tmp_path / "report.html").read_text())}
    assert rows["trial 1"]["_status"] == "pruned" and "best" in rows["trial 0"]["_class"]


def _ranked_trials(finalist: set[str], recipes: dict[str, int] | None = None) -> list[Trial]:
    """Trial 0 ran twice (a repeat); trial 3, once, is fastest. `finalist`: the trials confirmation chose."""
    history = [{"step": 1, "reward": 0.5}, {"step": 2, "reward": 0.75}]

    def trial(number, tps, **record):
        recipe = {"completions_per_step": 8, "lora_rank": (recipes or {}).get(str(number), 16)}
        record = {"status": "ok", "levers": {"lora_rank": 16}, "peak_memory_bytes": 2**20, "tokens_per_s": tps,
                  "history": history, "recipe": recipe, **record}  # fmt: skip
        if str(number) in finalist:
            record["finalist"] = True
        return Trial(name=f"trial {number}", number=number, record=record, config={"seed": 42})

    return [trial(0, 100.0), trial(1, 90.0), trial(2, 105.0, repeats=0), trial(3, 120.0)]


def test_finalists_are_the_configs_confirmation_compared_winner_included(tmp_path):
    from grpo_sweep.report.html import write_report

    page = write_report(_ranked_trials({"0", "3"}), tmp_path, title="confirmed").read_text()
    body = page.split("<table id=finalists>")[1].split("</table>")[0]
    assert body.index("trial 3") < body.index("trial 0") and "trial 1" not in body  # the winner first, only the chosen
    assert "<b>trial 3</b>" in page

    page = write_report(_ranked_trials(set()), tmp_path, title="unconfirmed").read_text()
    assert "id=finalists>" not in page
    note = page.split("<p id=finalists-note>")[1].split("</p>")[0]
    assert "No confirmation runs were made (hydra.sweeper.confirm_top is 0" in note and "trial 3, rests on 1 run." in note
    assert "trial 0 ran 2 times (its median counted)" in note

    # Confirmation chose finalists, found the noise beyond its budget and gave its runs to the search.
    state = {"stopped": "undecidable", "why": "too few runs; its reserved runs went back to the search", "given_back": True}
    page = write_report(_ranked_trials(set()), tmp_path, title="given back", confirmation=state).read_text()
    note = page.split("<p id=finalists-note>")[1].split("</p>")[0]
    assert "beyond what its budget could settle, or no run within its budget, and gave its runs to the search" in note
    assert "confirm_top is 0" not in note
    assert "went back to the search" in page.split("<p id=confirmation-note>")[1]


def test_the_reward_section_says_when_every_trial_trained_one_recipe(tmp_path):
    from grpo_sweep.report.html import write_report

    page = write_report(_ranked_trials(set()), tmp_path, title="one recipe").read_text()
    note = page.split("<p id=same-recipe>")[1].split("</p>")[0]
    assert note.startswith("All 4 trials that logged a reward trained the same recipe with the same seed")
    assert "identical and the lines lie on top of one another" in note
    page = write_report(_ranked_trials(set(), recipes={"1": 32}), tmp_path, title="two recipes").read_text()
    assert "id=same-recipe" not in page


def test_a_trials_config_is_parsed_once_per_version_of_its_file(tmp_path):
    """The summary and the report read every trial's config.yaml: one parse per version of the file
    (its mtime and size), each caller given a copy of its own, a rewritten file read again."""
    import os

    from grpo_sweep.report.trials import _load_config

    path = tmp_path / "config.yaml"
    path.write_text("lora_rank: 16\ntrial: {number: 3}\n")
    first = _load_config(tmp_path)
    first["lora_rank"], first["trial"]["number"] = 99, 99  # a caller's changes stay its own
    assert _load_config(tmp_path) == {"lora_rank": 16, "trial": {"number": 3}}
    path.write_text("lora_rank: 32\ntrial: {number: 3}\n")  # the same size: its mtime tells
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert _load_config(tmp_path)["lora_rank"] == 32
    path.write_text("lora_rank: 8\n")
    assert _load_config(tmp_path) == {"lora_rank": 8}
