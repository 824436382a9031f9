"""Your data (task=dataset), your rewards (task.reward_funcs) and the winner exported for TRL.

The proof test runs a real tiny sweep over a local jsonl with a reward module the test writes, then
real `trl grpo --config best.trl.yaml --max_steps 2` on CPU, and checks that TRL's own parsed
GRPOConfig (saved by the TRL run itself) holds the winner's effective levers; it also executes
best_grpo_config.py and compares the objects it builds.
"""

from __future__ import annotations

import json
import os
import runpy
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers.config import compose
from helpers.data import dataset_overrides, save_tiny_model, write_data
from helpers.runners import SPLIT_SPACE, cli, load_metrics, run_train, sweep_args, train_here
from helpers.studies import load_study

from grpo_sweep.config.local import validate_here
from grpo_sweep.config.schema import ConfigError

# --- errors before any model loads ----------------------------------------------------------------


def test_bad_data_and_rewards_are_config_errors_naming_file_and_column(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = write_data(tmp_path, chat=False)
    ok = dataset_overrides(data, "my_rewards.contains_solution")
    validate_here(compose(ok), cuda=False)  # the good config passes

    def error(overrides: list[str]) -> str:
        with pytest.raises(ConfigError) as err:
            validate_here(compose(overrides), cuda=False)
        return str(err.value)

    missing = error(dataset_overrides(tmp_path / "nope.jsonl", "my_rewards.contains_solution"))
    assert "task.path=" in missing and "nope.jsonl" in missing and "no such file" in missing
    column = error([*ok, "task.prompt_column=question"])
    assert "task.prompt_column=question" in column and str(data) in column and "prompt, solution" in column
    (tmp_path / "empty.csv").write_text("prompt,solution\n")
    empty = error(dataset_overrides(tmp_path / "empty.csv", "my_rewards.contains_solution"))
    assert "empty.csv" in empty and "0 rows" in empty
    no_module = error(dataset_overrides(data, "not_my_rewards.contains_solution"))
    assert "not_my_rewards" in no_module and "no module" in no_module
    no_function = error(dataset_overrides(data, "my_rewards.accuracy"))
    assert "'accuracy'" in no_function and "contains_solution" in no_function  # what it does define
    weights = error([*ok, "task.reward_weights=[1.0,2.0]"])
    assert "2 weights for 1 reward functions" in weights
    assert "task.path=null" in error(["task=dataset", "task.reward_funcs=[my_rewards.brevity]"])
    # TRL's built-in reward names and dotted paths into installed packages are found without importing them
    validate_here(compose(dataset_overrides(data, "think_format_reward", "trl.rewards.accuracy_reward")), cuda=False)
    # parquet and csv are read for their columns too
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"question": ["a"], "solution": ["1"]}), tmp_path / "d.parquet")
    assert "question" in error(dataset_overrides(tmp_path / "d.parquet", "my_rewards.brevity"))
    # .json as datasets' json builder reads it: a list of records; an object is one row of its keys
    (tmp_path / "records.json").write_text(json.dumps([{"prompt": "a", "solution": "1"}]))
    validate_here(compose(dataset_overrides(tmp_path / "records.json", "my_rewards.brevity")), cuda=False)
    (tmp_path / "wrapped.json").write_text(json.dumps({"data": [{"prompt": "a"}]}))
    assert "its columns: data)" in error(dataset_overrides(tmp_path / "wrapped.json", "my_rewards.brevity"))


def test_missing_column_stops_train_py_before_any_trial(tmp_path):
    data = write_data(tmp_path, chat=False)
    start = time.monotonic()
    result = train_here([*dataset_overrides(data, "my_rewards.brevity"), "task.prompt_column=text"], cwd=tmp_path)
    assert result.returncode != 0
    assert "task.prompt_column=text" in result.stderr and str(data) in result.stderr, result.stderr[-2000:]
    assert not list(tmp_path.rglob("metrics.json"))  # no trial started, no model loaded
    assert time.monotonic() - start < 120


@pytest.mark.slow
def test_unreachable_hub_dataset_fails_before_the_model_loads(tmp_path):
    write_data(tmp_path, chat=False)
    run_dir = tmp_path / "run"
    overrides = ["task=dataset", "task.path=someorg/somedata", "task.reward_funcs=[my_rewards.brevity]", "model.init=random"]
    run_train([*overrides, f"hydra.run.dir={run_dir}"], cwd=tmp_path, env={"HF_HUB_OFFLINE": "1"})
    record = load_metrics(run_dir)
    assert record["status"] == "failed" and record["error"].startswith("ConfigError: task.path=someorg/somedata")
    assert "huggingface.co" in record["error"]  # failures.ADVICE's Hub advice if a sweep keeps failing so
    assert record["trainable_params"] is None and not record["effective"]  # no trainer, no model was built


# --- one trial on your data ------------------------------------------------------------------------


@pytest.mark.slow
def test_conversational_data_reaches_trl_and_the_rewards(tmp_path):
    data = write_data(tmp_path, chat=True)
    run_dir = tmp_path / "run"
    result = train_here(
        [
            *dataset_overrides(data, "my_rewards.contains_solution", "my_rewards.brevity"),
            "task.reward_weights=[1.0,0.5]",
            "model.init=random",
            "trial.steps=2",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=tmp_path,
    )
    record = load_metrics(run_dir)
    assert record["status"] == "ok", result.stdout[-3000:] + result.stderr[-3000:]
    lengths = record["prompt_lengths"]
    assert lengths["count"] == 48 and lengths["min"] <= lengths["median"] <= lengths["p95"] <= lengths["max"]
    assert lengths["cut"] > 0 and lengths["max"] > 32  # the long ones were cut to max_prompt_length=32
    said = f"[trial] {lengths['cut']} of 48 prompts are longer than max_prompt_length=32 tokens (the longest {lengths['max']})"
    assert said in result.stdout  # on the console, not only in metrics.json
    from grpo_sweep.report.export import export_trial

    exported = export_trial(run_dir, tmp_path / "export", prefix="x")
    text = exported[0].read_text()
    assert f"{lengths['cut']} of 48 prompts were longer than max_prompt_length=32 tokens" in text
    assert "`trl grpo` trains them whole and its steps are longer than the ones measured" in text
    # worst case: every conversation padded/cut to exactly 32 tokens as TRL tokenizes it (template included)
    assert record["effective"]["max_prompt_tokens"] == 32 and not record["lever_mismatch"]
    assert record["reward_seconds_per_step"] is not None and record["reward_seconds_per_step"] > 0
    last = record["history"][-1]
    assert "reward/contains_solution" in last and "reward/brevity" in last  # TRL logged each by its name
    assert last["reward/brevity"] < 0  # conversational completions reached the reward (message lists)
    settings = record["trainer_settings"]
    assert settings["grpo_config"]["reward_weights"] == [1.0, 0.5]
    assert settings["reward_funcs"] == ["my_rewards.contains_solution", "my_rewards.brevity"]


@pytest.mark.slow
def test_a_raising_reward_fails_the_trial_by_name_not_as_oom(tmp_path):
    data = write_data(tmp_path, chat=False)
    run_dir = tmp_path / "run"
    train_here(
        [*dataset_overrides(data, "my_rewards.broken"), "model.init=random", "trial.steps=2", f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
    )
    record = load_metrics(run_dir)
    assert record["status"] == "failed"
    assert record["error"].startswith("RewardFunctionError: reward function my_rewards.broken raised ZeroDivisionError")
    assert record["oom_phase"] is None and record["deficit_bytes"] is None


@pytest.mark.slow
def test_a_sweep_whose_reward_always_raises_stops_with_that_reason(tmp_path):
    data = write_data(tmp_path, chat=False)
    cmd = sweep_args(
        tmp_path / "sweep",
        *SPLIT_SPACE,
        *dataset_overrides(data, "my_rewards.broken"),
        "model.init=random",
        "hydra.sweeper.n_trials=6",
        "hydra.sweeper.max_failures_in_a_row=2",
        "hydra.sweeper.prescreen=false",  # every point runs (a pruned point between two failures resets the count)
    )
    result = train_here(cmd, cwd=tmp_path)
    out = result.stdout + result.stderr
    assert "Sweep stopped" in out and "my_rewards.broken raised ZeroDivisionError" in out, out[-3000:]
    assert "the task's reward function raised" in out  # failures.ADVICE: not "nothing fits"
    assert "nothing fits" not in out
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    k = max(i for i, line in enumerate(lines) if line.startswith("Sweep stopped: trials"))
    assert lines[k + 1].startswith("  What to do:") and all(line.startswith("  ") for line in lines[k + 1 :]), lines[k:]
    study = load_study(f"journal:{tmp_path / 'sweep' / 'study.journal'}")
    assert len(study.trials) == 2  # stopped after 2 of 6
    assert all(t.state.name == "FAIL" and t.user_attrs["status"] == "failed" for t in study.trials)  # none an OOM


# --- the proof: the exported config is the one that was measured ----------------------------------


@pytest.mark.slow
def test_exported_config_is_what_was_measured(tmp_path):
    """Over 20 s: a real 3-trial sweep, then `trl grpo --config best.trl.yaml` itself in its own process."""
    data = write_data(tmp_path, chat=True)
    corpus = [line for line in data.read_text().splitlines()] + [" ." * 8]
    model_dir = save_tiny_model(tmp_path / "tiny-model", corpus)
    sweep_dir = tmp_path / "sweep"
    cmd = sweep_args(
        sweep_dir,
        *SPLIT_SPACE,
        *dataset_overrides(data, "my_rewards.contains_solution", "my_rewards.brevity"),
        "task.reward_weights=[1.0,0.25]",
        "model=hub",
        f"model.hub_id={model_dir}",
        # the recipe: 4 completions per step in micro-batches of 2, so accumulation 2 > 1 (TRL's generation
        # batch = batch x accumulation)
        "completions_per_step=4",
        "per_device_train_batch_size=2",
        "hydra.sweeper.n_trials=3",
    )
    result = train_here(cmd, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    best = yaml.safe_load((sweep_dir / "best.yaml").read_text())
    assert best["export"]["files"][:2] == ["best.trl.yaml", "best_grpo_config.py"]
    assert "trl grpo --config" in result.stdout
    winner = load_metrics(Path(best["run_dir"]))
    eff = winner["effective"]
    trl_yaml = (sweep_dir / "best.trl.yaml").read_text()
    # names the sweep, the trial and what it measured
    assert f"sweep tiny_cpu, trial {best['best_trial']}" in trl_yaml
    assert f"{winner['tokens_per_s']:.1f} tokens/s" in trl_yaml and f"({winner['peak_memory_bytes']} B)" in trl_yaml
    assert "best_unsloth.py" not in best["export"]["files"]  # backend=trl ran

    # TRL's own parser, on the file as it is
    from trl.scripts.grpo import make_parser

    script_args, grpo_args, model_args, dataset_args = make_parser().parse_args_and_config(
        args=["--config", str(sweep_dir / "best.trl.yaml")]
    )
    assert model_args.model_name_or_path == str(model_dir)
    assert model_args.use_peft and model_args.lora_r == eff["lora_rank"]
    assert sorted(model_args.lora_target_modules) == sorted(eff["lora_target_modules"])
    assert model_args.load_in_4bit is eff["load_in_4bit"] is False
    assert script_args.reward_funcs == ["my_rewards.contains_solution", "my_rewards.brevity"]
    assert dataset_args.datasets[0].data_files == str(data)

    # real `trl grpo` on CPU, two steps; it saves the GRPOConfig it ran with (training_args.bin)
    out_dir = tmp_path / "trl-out"
    trl = shutil.which("trl", path=str(Path(sys.executable).parent))
    run = subprocess.run(
        [
            trl,
            "grpo",
            "--config",
            str(sweep_dir / "best.trl.yaml"),
            "--max_steps",
            "2",
            "--output_dir",
            str(out_dir),
            "--report_to",
            "none",
        ],
        cwd=tmp_path,  # trl grpo imports my_rewards from the current directory, as the export says
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": ""},
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    import torch

    ran = torch.load(out_dir / "training_args.bin", weights_only=False)  # TRL's parsed GRPOConfig, as it trained
    assert type(ran).__name__ == "GRPOConfig" and ran.max_steps == 2
    for key in ("per_device_train_batch_size", "gradient_accumulation_steps", "num_generations", "max_completion_length"):
        assert getattr(ran, key) == eff[key], key
    assert ran.generation_batch_size == eff["generation_batch_size"] == 2 * eff["per_device_train_batch_size"]
    assert ran.gradient_checkpointing == eff["gradient_checkpointing"]
    assert ran.bf16 is False and winner["device"] == "cpu"  # precision as measured (float32 on CPU)
    assert ran.model_init_kwargs["dtype"] == "float32" == winner["trainer_settings"]["dtype"]
    assert ran.reward_weights == [1.0, 0.25]
    assert ran.learning_rate == winner["trainer_settings"]["grpo_config"]["learning_rate"]
    adapter = json.loads((out_dir / "adapter_config.json").read_text())
    assert adapter["r"] == eff["lora_rank"] and sorted(adapter["target_modules"]) == sorted(eff["lora_target_modules"])
    assert eff["max_seq_length"] == eff["max_prompt_tokens"] + eff["max_completion_length"]

    # best_grpo_config.py builds the same objects
    built = runpy.run_path(str(sweep_dir / "best_grpo_config.py"))
    args, lora = built["training_args"], built["peft_config"]
    for key in (
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "num_generations",
        "max_completion_length",
        "gradient_checkpointing",
        "bf16",
        "learning_rate",
        "beta",
        "reward_weights",
        "generation_batch_size",
    ):
        assert getattr(args, key) == getattr(ran, key), key
    assert args.model_init_kwargs == {"dtype": "float32"}
    assert lora.r == eff["lora_rank"] and sorted(lora.target_modules) == sorted(eff["lora_target_modules"])
    assert lora.lora_alpha == adapter["lora_alpha"]
    assert built["quantization_config"] is None and built["MODEL"] == str(model_dir)

    # `grpo-sweep export --trial N` writes the same files for any trial
    study = load_study(f"journal:{sweep_dir / 'study.journal'}")
    other = next(t.number for t in study.trials if t.user_attrs.get("status") == "ok")
    done = cli("export", str(sweep_dir), "--trial", str(other))
    assert done.returncode == 0, done.stderr
    exported = (sweep_dir / f"trial{other}.trl.yaml").read_text()
    assert f"trial {other} " in exported and (sweep_dir / f"trial{other}_grpo_config.py").exists()
    if other == best["best_trial"]:
        assert exported == trl_yaml


# --- the other export files, from the functions the trials call -----------------------------------


def _metrics_for(settings: dict, backend: str) -> dict:
    return {
        "status": "ok",
        "backend": backend,
        "device": "cuda",
        "run_dir": "/runs/trial_0007",
        "steps": 3,
        "tokens_per_s": 1234.5,
        "step_time_s": 2.0,
        "reward_seconds_per_step": 0.5,
        "peak_memory_bytes": 12 * 2**30,
        "budget_bytes": 16 * 2**30,
        "trainer_settings": settings,
    }


def test_unsloth_export_makes_the_calls_the_trial_made(tmp_path, monkeypatch):
    """best_unsloth.py, executed against a recording stand-in for Unsloth (it needs CUDA), calls
    from_pretrained and get_peft_model with exactly the arguments trial/backends/unsloth.py passes."""
    import types

    import torch

    from grpo_sweep.report.export import export_trial
    from grpo_sweep.trial.backends import unsloth as backend

    cfg = compose(["backend=unsloth", "gpu=t4_16g", "load_in_4bit=true", "lora_rank=32", "gradient_checkpointing=true"])
    loaded = backend.from_pretrained_kwargs(cfg, "Qwen/Qwen2.5-0.5B", device_util=0.41, dtype=torch.bfloat16)
    grpo = backend.grpo_unsloth_args(cfg, on_cuda=True, output_dir="x")
    keep = ("per_device_train_batch_size", "gradient_accumulation_steps", "num_generations", "max_completion_length")
    settings = {
        "model_name_or_path": "Qwen/Qwen2.5-0.5B",
        "model": {"name": "qwen", "source": "hub"},
        "dtype": "bfloat16",
        "grpo_config": {k: grpo[k] for k in keep}
        | {"bf16": False, "use_vllm": True, "vllm_mode": "colocate", "gradient_checkpointing": True},
        "lora": None,
        "quantization": None,
        "unsloth": backend.unsloth_settings(cfg, loaded),
        "task": "arithmetic",
        "max_prompt_length": 32,
        "worst_case_lengths": True,
    }
    run_dir = tmp_path / "trial_0007"
    run_dir.mkdir()
    (run_dir / "metrics.json").write_text(json.dumps(_metrics_for(settings, "unsloth")))
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"trial": {"study": "qwen_t4", "number": 7}, "gpu": {"name": "t4_16g"}}))
    files = export_trial(run_dir, tmp_path, prefix="best")
    assert [p.name for p in files] == ["best.trl.yaml", "best_grpo_config.py", "best_unsloth.py"]
    text = (tmp_path / "best_unsloth.py").read_text()
    assert "sweep qwen_t4, trial 7" in text and "1234.5 tokens/s" in text and "25.0% of the step" in text

    calls = {}

    class FastLanguageModel:
        @staticmethod
        def from_pretrained(**kwargs):
            calls["from_pretrained"] = kwargs
            return "model", "tokenizer"

        @staticmethod
        def get_peft_model(model, **kwargs):
            calls["get_peft_model"] = kwargs
            return model

    monkeypatch.setitem(sys.modules, "unsloth", types.SimpleNamespace(FastLanguageModel=FastLanguageModel))
    built = runpy.run_path(str(tmp_path / "best_unsloth.py"))
    # the lever's share of the target card (the trial passed 0.41 of the card it emulated on), else identical
    assert calls["from_pretrained"] == {**loaded, "gpu_memory_utilization": cfg.gpu_memory_utilization}
    assert calls["get_peft_model"] == backend.peft_kwargs(cfg)
    assert calls["get_peft_model"]["use_gradient_checkpointing"] == "unsloth" and calls["get_peft_model"]["r"] == 32
    args = built["training_args"]
    assert args.gradient_checkpointing is False  # Unsloth's own checkpointing, as the trial ran it
    assert (args.per_device_train_batch_size, args.num_generations) == (
        grpo["per_device_train_batch_size"],
        grpo["num_generations"],
    )
    # the TRL file for the same trial: vLLM colocate with the lever's share, a built-in task's note
    trl_text = (tmp_path / "best.trl.yaml").read_text()
    assert "grpo-sweep's built-in task: add your data" in trl_text
    parsed = yaml.safe_load(trl_text)
    assert parsed["use_vllm"] is True and parsed["vllm_mode"] == "colocate" and parsed["gradient_checkpointing"] is True


def test_four_bit_export_builds_the_bitsandbytes_config(tmp_path):
    from grpo_sweep.report.export import export_trial

    settings = {
        "model_name_or_path": "meta-llama/Llama-3.2-1B",
        "dtype": "bfloat16",
        "grpo_config": {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 2, "num_generations": 4, "bf16": False},
        "lora": {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0, "target_modules": ["q_proj", "v_proj"], "bias": "none"},
        "quantization": {
            "load_in_4bit": True,
            "bnb_4bit_quant_type": "nf4",
            "bnb_4bit_use_double_quant": True,
            "bnb_4bit_compute_dtype": "bfloat16",
        },
        "task": "gsm8k",
    }
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.json").write_text(json.dumps(_metrics_for(settings, "trl")))
    export_trial(run_dir, tmp_path)
    import torch

    built = runpy.run_path(str(tmp_path / "best_grpo_config.py"))
    quant = built["quantization_config"]
    assert quant.load_in_4bit and quant.bnb_4bit_quant_type == "nf4" and quant.bnb_4bit_use_double_quant
    assert quant.bnb_4bit_compute_dtype == torch.bfloat16
    # (bf16 false: this CPU cannot build a bf16 GRPOConfig; the precision check is the proof test's)
    assert built["training_args"].generation_batch_size == 16
    from trl.scripts.grpo import make_parser

    _, grpo_args, model_args, _ = make_parser().parse_args_and_config(args=["--config", str(tmp_path / "best.trl.yaml")])
    assert model_args.load_in_4bit and model_args.bnb_4bit_quant_type == "nf4" and model_args.use_bnb_nested_quant
    assert model_args.dtype == "bfloat16" and grpo_args.gradient_accumulation_steps == 2


# --- a study is its data and rewards ---------------------------------------------------------------


@pytest.mark.slow
def test_a_study_resumed_with_other_data_or_rewards_is_refused_naming_the_difference(tmp_path):
    """Over 20 s: one real trial starts the study; each refused resume stops before any trial. Other
    data under the same path, the same file edited in place, and other reward functions are each
    another study: one line naming the difference; the study's own command still resumes it."""
    data = write_data(tmp_path, chat=False)
    other = tmp_path / "other.jsonl"
    other.write_text(data.read_text())
    sweep = tmp_path / "sweep"

    def sweep_with(path, *rewards, n=1):
        overrides = [*SPLIT_SPACE, *dataset_overrides(path, *rewards), "model.init=random", f"hydra.sweeper.n_trials={n}"]
        return train_here(sweep_args(sweep, *overrides, "hydra.sweeper.prescreen=false"), cwd=tmp_path)

    first = sweep_with(data, "my_rewards.contains_solution")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]

    def refused(result, *words):
        out = result.stdout + result.stderr
        assert result.returncode != 0 and "is another search: task " in out and "Traceback" not in out, out[-3000:]
        assert all(w in out for w in words), out[-3000:]
        assert len(load_study(f"journal:{sweep / 'study.journal'}").trials) == 1  # nothing ran

    refused(sweep_with(other, "my_rewards.contains_solution"), f'task path: the study has "{data}"', str(other))
    refused(sweep_with(data, "my_rewards.brevity"), "task reward_funcs", "my_rewards.brevity")
    with open(data, "a") as fh:  # edited in place
        fh.write(json.dumps({"prompt": "What is 1 + 1?", "solution": "2"}) + "\n")
    refused(sweep_with(data, "my_rewards.contains_solution"), 'task fingerprint: the study has "sha256:')


@pytest.mark.slow
def test_a_long_system_message_is_cut_to_what_the_estimate_assumed(tmp_path):
    """A conversation whose system message alone is longer than max_prompt_length: the system message
    is cut too, so TRL tokenizes max_prompt_length tokens (template included), as estimated, and no
    lever is reported changed."""
    write_data(tmp_path, chat=False)
    data = tmp_path / "long_system.jsonl"
    system = "You are a careful assistant who answers arithmetic questions. " * 8
    rows = [
        {
            "prompt": [{"role": "system", "content": system}, {"role": "user", "content": f"What is {a} + 2?"}],
            "solution": str(a + 2),
        }
        for a in range(16)
    ]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run_dir = tmp_path / "run"
    train_here(
        [
            *dataset_overrides(data, "my_rewards.contains_solution"),
            "model.init=random",
            "trial.steps=1",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=tmp_path,
    )
    record = load_metrics(run_dir)
    assert record["status"] == "ok", record["error"]
    assert record["prompt_lengths"]["cut"] == 16  # every prompt was over the budget
    assert record["effective"]["max_prompt_tokens"] == 32 and not record["lever_mismatch"], record["lever_mismatch"]
