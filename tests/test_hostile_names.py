"""Names the user controls (folders, study names, model and data names) reach the files we write and
the commands we print as values only: the exports run and parse to what a plain name gives, a study
name of any characters composes to itself, and the printed command is one shell-quoted line."""

from __future__ import annotations

import json
import runpy
import sys
import types

import pytest
import yaml

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
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "exported.py"
    path.write_text(text)
    compile(text, str(path), "exec")
    ran = runpy.run_path(str(path))
    return {
        "made": made,
        "model": ran["MODEL"],
        "dataset": ran["DATASET"],
        "rewards": ran["REWARD_FUNCS"],
        "doc": ran.get("__doc__"),
    }


def test_exports_under_hostile_names_run_and_parse_as_plain_ones(tmp_path, monkeypatch):
    """A run folder, study, GPU, working folder and prompt column holding quotes, triple quotes, a
    newline, `$(...)`, a backtick and `;|&<`: best_grpo_config.py runs with no side effect and builds
    what a plain name's export builds; best.trl.yaml parses to exactly the plain export's keys and values."""
    hostile, plain = _export(tmp_path, HOSTILE, "h"), _export(tmp_path, "", "p")
    assert sorted(hostile) == sorted(plain) == ["best.trl.yaml", "best_grpo_config.py"]

    ran = _run_py(hostile["best_grpo_config.py"], tmp_path / "h", monkeypatch)
    assert not [p.name for p in tmp_path.rglob("PWNED*")]
    base = _run_py(plain["best_grpo_config.py"], tmp_path / "p", monkeypatch)
    out_dir = ran["made"]["GRPOConfig"].pop("output_dir")
    assert "/" not in out_dir and out_dir.startswith("grpo-s") and out_dir.endswith("-trial3")  # one folder
    base["made"]["GRPOConfig"].pop("output_dir")
    assert ran["made"] == base["made"] and ran["model"] is None and ran["rewards"] == ["rewards.ok"]
    assert ran["doc"] == base["doc"]  # a fixed docstring: no name on the first lines
    assert ran["dataset"] == base["dataset"]

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
