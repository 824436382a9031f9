"""Names the user controls (folders, study names, model and data names) reach the files we write and
the commands we print as values only: the exports run and parse to what a plain name gives, a study
name of any characters composes to itself, and the printed command is one shell-quoted line."""

from __future__ import annotations

import json
import os
import runpy
import shlex
import subprocess
import sys
import types

import pytest
import yaml
from helpers.runners import FAST, IN_PROCESS_TRIALS, NO_FILE_SPACE, ROOT, load_metrics, sweep_args, train_here

# Quotes, triple quotes, a newline and the line breaks YAML knows, `$(...)`, a backtick, `;|&<`, `${`.
HOSTILE = (
    'q"""+__import__("os").system("id>PWNED.txt")+"""\'\'\'\n'
    "x: injected\r\u2028y: injected\x85 $(touch PWNED2) `touch PWNED3` ; | & < ${oc.env:HOME} \\"
)
STUDY_NAMES = ["'", '"', ";", "|", "&", "<", "`", "a ' \" ; | & < ` b", "nl\nname", "${oc.env:HOME}", "1.5", "end\\"]


def _settings(model_name: str | None, cwd: str, column: str) -> dict:
    return {
        "model_name_or_path": model_name,
        "model": {"name": "tiny", "source": "random"},
        "dtype": "float32",
        "grpo_config": {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 2, "num_generations": 2, "bf16": False},
        "lora": {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "target_modules": ["q_proj", "v_proj"], "bias": "none"},
        "quantization": None,
        "dataset": {"path": "json", "data_files": "d.jsonl", "split": "train", "prompt_column": column},
        "reward_funcs": ["rewards.ok"],
        "cwd": cwd,
        "task": "your_data",
        "unsloth": {
            "from_pretrained": {"model_name": model_name, "max_seq_length": 128, "dtype": "float32"},
            "get_peft_model": {"r": 8, "target_modules": ["q_proj", "v_proj"]},
        },
    }


def _export(tmp_path, name: str, sub: str) -> dict:
    from grpo_sweep.report.export import export_trial

    run_dir = tmp_path / sub / f"run{name}"
    run_dir.mkdir(parents=True)
    metrics = {
        "status": "ok",
        "backend": "trl",
        "device": "cpu",
        "run_dir": str(run_dir),
        "steps": 2,
        "tokens_per_s": 10.0,
        "step_time_s": 1.0,
        "peak_memory_bytes": 2**30,
        "trainer_settings": _settings(None, f"/work/{name}", f"text{name}"),
    }
    (run_dir / "metrics.json").write_text(json.dumps(metrics))
    config = {"trial": {"study": f"s{name}", "number": 3}, "gpu": {"name": f"g{name}"}}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    out = tmp_path / sub / f"out{name}"
    files = export_trial(run_dir, out, prefix="best", sweep=f"s{name}", held={"learning_rate": f"lr{name}"})
    return {p.name: p.read_text() for p in files}


def _run_py(text: str, tmp_path, monkeypatch) -> dict:
    """Execute an exported Python file against recording stand-ins for trl and peft, in tmp_path."""
    made: dict = {}

    def recorder(kind):
        def build(**kwargs):
            made[kind] = kwargs
            return kwargs

        return build

    monkeypatch.setitem(sys.modules, "trl", types.SimpleNamespace(GRPOConfig=recorder("GRPOConfig")))
    monkeypatch.setitem(sys.modules, "peft", types.SimpleNamespace(LoraConfig=recorder("LoraConfig")))
    unsloth_calls = types.SimpleNamespace(
        from_pretrained=lambda **kw: (made.setdefault("from_pretrained", kw), None),
        get_peft_model=lambda model, **kw: made.setdefault("get_peft_model", kw),
    )
    monkeypatch.setitem(sys.modules, "unsloth", types.SimpleNamespace(FastLanguageModel=unsloth_calls))
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(float32="torch.float32"))
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "exported.py"
    path.write_text(text)
    compile(text, str(path), "exec")
    ran = runpy.run_path(str(path))
    return {"made": made, "doc": ran.get("__doc__")} | {
        k.lower(): ran[k] for k in ("MODEL", "DATASET", "REWARD_FUNCS") if k in ran
    }


def test_exports_under_hostile_names_run_and_parse_as_plain_ones(tmp_path, monkeypatch):
    """A run folder, study, GPU, working folder and prompt column holding quotes, triple quotes, a
    newline, `$(...)`, a backtick and `;|&<`: best_grpo_config.py and best_unsloth.py run with no side
    effect and build what a plain name's exports build; best.trl.yaml parses to exactly the plain export's keys and values."""
    hostile, plain = _export(tmp_path, HOSTILE, "h"), _export(tmp_path, "", "p")
    assert sorted(hostile) == sorted(plain) == ["best.trl.yaml", "best_grpo_config.py", "best_unsloth.py"]

    ran = _run_py(hostile["best_grpo_config.py"], tmp_path / "h", monkeypatch)
    assert not [p.name for p in tmp_path.rglob("PWNED*")]
    base = _run_py(plain["best_grpo_config.py"], tmp_path / "p", monkeypatch)
    out_dir = ran["made"]["GRPOConfig"].pop("output_dir")
    assert "/" not in out_dir and out_dir.startswith("grpo-s") and out_dir.endswith("-trial3")  # one folder
    base["made"]["GRPOConfig"].pop("output_dir")
    assert ran["made"] == base["made"] and ran["model"] is None and ran["reward_funcs"] == ["rewards.ok"]
    assert ran["doc"] == base["doc"]  # a fixed docstring: no name on the first lines
    assert ran["dataset"] == base["dataset"]

    ran, base = (_run_py(files["best_unsloth.py"], tmp_path / d, monkeypatch) for files, d in ((hostile, "h"), (plain, "p")))
    for made in (ran["made"], base["made"]):
        made["GRPOConfig"].pop("output_dir")
    assert ran["made"] == base["made"] and ran["made"]["get_peft_model"]["r"] == 8 and ran["doc"] == base["doc"]
    assert not [p.name for p in tmp_path.rglob("PWNED*")]

    parsed, expected = yaml.safe_load(hostile["best.trl.yaml"]), yaml.safe_load(plain["best.trl.yaml"])
    assert list(parsed) == list(expected)
    parsed.pop("output_dir"), expected.pop("output_dir")
    assert parsed == expected
    # every name is still said, each on its comment line
    comments = [line for line in hostile["best.trl.yaml"].splitlines() if line.startswith("#")]
    assert any("id>PWNED.txt" in line and "injected" in line for line in comments)


def test_a_kwarg_name_that_is_no_identifier_is_written_as_a_value():
    from grpo_sweep.report.export import _call

    text = _call("f", {"ok": 1, "x=__import__('os')": 2, "class": 3})
    assert eval(text, {"f": lambda **kw: kw}) == {"ok": 1, "x=__import__('os')": 2, "class": 3}


@pytest.mark.parametrize("name", STUDY_NAMES)
def test_any_study_name_composes_to_itself(name):
    """The `trial.study` override a trial gets composes back to exactly the study's name (Hydra's
    grammar, then OmegaConf's interpolation), whatever it holds."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    from hydra_plugins.grpo_optuna_sweeper.space import to_override

    parsed = OverridesParser.create().parse_override(to_override("trial.study", name)).value()
    assert OmegaConf.to_container(OmegaConf.create({"x": parsed}), resolve=True)["x"] == name


@pytest.mark.slow
@IN_PROCESS_TRIALS
def test_a_hostile_sweep_and_its_printed_command_run_under_the_users_own_configs(tmp_path, warm_model):
    """One real trial: a study name holding `' " ; | & <`, a backtick and `$(...)`, a sweep folder
    holding triple quotes, `gpu=mine` from the user's own hydra.searchpath. The trial runs ok, the
    exports compile and parse with no side effect, and best.yaml's `command`, run through bash
    (a stand-in `python` records the arguments bash hands it), reruns the winner as one trial.
    Over 20 s: two real trials (the sweep's and the rerun's), with the sweep's report and exports."""
    conf = tmp_path / "my_conf" / "gpu"
    conf.mkdir(parents=True)
    (conf / "mine.yaml").write_text((ROOT / "src/grpo_sweep/conf/gpu/cpu_sim.yaml").read_text().replace("cpu_sim", "mine"))
    name = "a ' \" ; | & < ` $(touch PWNED) b"
    sweep_dir = tmp_path / 'q"""+__import__("os").system("id>PWNED.txt")+"""x'
    searchpath = f"hydra.searchpath=[file://{conf.parent}]"
    result = train_here(
        [
            "-m",
            "+sweeps=tiny_cpu",
            f"hydra.sweep.dir='{sweep_dir}'",
            "hydra.sweeper.study_name='a \\' \" ; | & < ` $(touch PWNED) b'",  # Hydra's quoting, by hand
            NO_FILE_SPACE,
            "hydra.sweeper.enqueue=[]",
            "hydra.sweeper.start_points=0",
            "hydra.sweeper.neighbour_every=0",
            "hydra.sweeper.n_trials=1",
            "gpu=mine",
            "gpu.memory_gib=0.09375",
            searchpath,
            *FAST,
        ],
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    best = yaml.safe_load((sweep_dir / "best.yaml").read_text())
    assert best["study"] == name and best["trials"] == {"COMPLETE": 1}, best
    compile((sweep_dir / "best_grpo_config.py").read_text(), "best_grpo_config.py", "exec")
    assert yaml.safe_load((sweep_dir / "best.trl.yaml").read_text())["use_peft"] is True
    command = best["command"]
    assert f"Run it:\n  {command}\n" in result.stdout and "\n" not in command
    assert command.startswith(f"python train.py {shlex.quote(searchpath)} ")

    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "python").write_text(f"#!{sys.executable}\nimport json, sys\njson.dump(sys.argv[1:], open('argv.json', 'w'))\n")
    (shim / "python").chmod(0o755)
    env = {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}"}
    subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, check=True, timeout=60)
    argv = json.loads((tmp_path / "argv.json").read_text())
    assert argv[0] == "train.py" and searchpath in argv and "gpu=mine" in argv
    rerun = train_here([*argv[1:], f"hydra.run.dir={tmp_path / 'rerun'}"], cwd=tmp_path)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    metrics = load_metrics(tmp_path / "rerun")
    assert metrics["status"] == "ok" and yaml.safe_load((tmp_path / "rerun" / "config.yaml").read_text())["gpu"]["name"] == "mine"
    assert not list(tmp_path.rglob("PWNED*"))


def test_the_rerun_command_carries_the_hydra_settings_a_run_needs():
    """hydra.searchpath (and the job's other Hydra settings) lead the command; what only concerns the
    sweep (its dir, sweeper, launcher, mode) is left out; each argument is shell-quoted."""
    from omegaconf import OmegaConf
    from optuna.trial import create_trial

    from hydra_plugins.grpo_optuna_sweeper.launch_config import HYDRA_OVERRIDES_ATTR, rerun_overrides
    from hydra_plugins.grpo_optuna_sweeper.tables import command_line

    given = [
        "hydra.searchpath=[file:///my conf]",
        "hydra.mode=MULTIRUN",
        "hydra.sweep.dir=out",
        "hydra.sweeper.n_trials=3",
        "hydra/launcher=basic",
        "hydra.launcher.n_jobs=2",
        "hydra.job.chdir=true",
        "hydra.run.dir=first",
    ]
    kept = rerun_overrides(OmegaConf.create({"hydra": {"overrides": {"hydra": given}}}))
    assert kept == ["hydra.searchpath=[file:///my conf]", "hydra.job.chdir=true"]
    point = ["gpu=mine", "trial.note='a b;c'"]
    trial = create_trial(value=1.0, user_attrs={HYDRA_OVERRIDES_ATTR: kept, "overrides": point})
    command = command_line(trial)
    assert shlex.split(command) == ["python", "train.py", *kept, *point]


def test_a_study_name_holding_a_literal_interpolation_is_refused_in_one_line(tmp_path):
    """Hydra resolves the sweeper's node twice, so an escaped `\\${...}` in the name would open the study
    under the resolved name: refused in one line before the storage opens. Quotes, `;|&<` and a
    backtick in the same name are fine (test_any_study_name_composes_to_itself)."""
    result = train_here(
        sweep_args(tmp_path / "sweep", "hydra.sweeper.study_name='a;b \\${oc.env:HOME}'", "hydra.sweeper.n_trials=1")
    )
    assert result.returncode != 0
    first = result.stderr.splitlines()[0]
    assert first.startswith("hydra.sweeper.study_name=") and "must not hold a literal '${'" in first, result.stderr[-2000:]
    assert "Traceback" not in result.stderr + result.stdout
    assert not (tmp_path / "sweep").exists()  # no sweep dir, no journal, no trial


def test_a_run_folders_command_carries_its_recorded_hydra_settings(tmp_path):
    """A run directory read without a study (grpo-sweep report <dir>): its rerun command is built from
    its config, led by the Hydra settings Hydra recorded for it (.hydra/hydra.yaml)."""
    from grpo_sweep.report.trials import load_dir, overrides

    run_dir = tmp_path / "run"
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / "metrics.json").write_text(json.dumps({"status": "ok", "tokens_per_s": 1.0, "levers": {"lora_rank": 8}}))
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"gpu": {"name": "mine"}, "model": {"name": "tiny"}}))
    recorded = {"hydra": {"overrides": {"hydra": ["hydra.searchpath=[file:///my conf]", "hydra.run.dir=x", "hydra.mode=RUN"]}}}
    (run_dir / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump(recorded))
    (trial,) = load_dir(tmp_path)
    argv = shlex.split(overrides(trial))
    assert argv[:3] == ["python", "train.py", "hydra.searchpath=[file:///my conf]"] and "gpu=mine" in argv
    assert not [a for a in argv if a.startswith(("hydra.run", "hydra.mode"))]
