"""The Python API (grpo_sweep.api) and a `trl grpo` YAML as the recipe (config/trl_config.py).

Fast: the TRL CLI docs' example YAML becomes the recipe; a setting that cannot be mapped is one line;
a GRPOConfig and a LoraConfig read exactly; a reward that cannot be pickled is refused; the export in
TRL 0.22's names only uses names of that version (trl_fields.json, read from its wheels by
scripts/trl_fields.py). Slow: a real Jupyter kernel runs a notebook whose cells build a reward that
reads a global, a datasets.Dataset and a GRPOConfig, sweep 3 trials of the tiny model, and train a
step from the winner's GRPOConfig; and a sweep started from a `trl grpo` YAML exports a file that
`trl grpo --config` runs with the same recipe.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from helpers.config import compose
from helpers.runners import cli

from grpo_sweep.config import trl_config
from grpo_sweep.config.schema import ConfigError

# TRL's CLI docs' configuration file (docs/source/clis.md, "Using Configuration Files" and "Scaling Up with
# Accelerate": model_name_or_path, dataset_name, num_processes, accelerate_config), written for `trl grpo`
# with dotted reward functions (import paths, as `--reward_funcs` takes them), the adapter and 4-bit keys.
TRL_CLI_EXAMPLE = """\
# grpo_config.yaml
model_name_or_path: Qwen/Qwen2.5-0.5B
dataset_name: trl-lib/DeepMath-103K
reward_funcs:
  - my_rewards.contains_solution
  - think_format_reward
use_peft: true
lora_r: 32
lora_alpha: 64
lora_target_modules: [q_proj, k_proj, v_proj, o_proj]
load_in_4bit: false
dtype: bfloat16
attn_implementation: eager
per_device_train_batch_size: 4
gradient_accumulation_steps: 4
num_generations: 8
max_completion_length: 256
learning_rate: 1.0e-5
beta: 0.04
temperature: 0.9
output_dir: Qwen2.5-0.5B-GRPO
logging_steps: 10
report_to: none
num_processes: 2
accelerate_config: zero2
"""
REWARDS = "def contains_solution(completions, **kwargs):\n    return [1.0 for _ in completions]\n"


def test_the_trl_cli_docs_yaml_is_the_recipe(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    path = tmp_path / "grpo_config.yaml"
    path.write_text(TRL_CLI_EXAMPLE)
    cfg = compose(trl_config.read(path))
    assert (cfg.model.name, cfg.model.hub_id, cfg.model.dtype) == ("hub", "Qwen/Qwen2.5-0.5B", "bfloat16")
    assert (cfg.task.name, cfg.task.path, cfg.task.split) == ("dataset", "trl-lib/DeepMath-103K", "train")
    assert list(cfg.task.reward_funcs) == ["my_rewards.contains_solution", "think_format_reward"]
    assert (cfg.lora_rank, cfg.lora_alpha, list(cfg.lora_target_modules)) == (32, 64, ["q_proj", "k_proj", "v_proj", "o_proj"])
    assert cfg.load_in_4bit is False and cfg.attn_implementation == "eager" and cfg.trial.full_finetune is False
    # the effective batch is held; the split into micro-batch x accumulation is the sweep's knob
    assert (cfg.completions_per_step, cfg.per_device_train_batch_size, cfg.gradient_accumulation_steps) == (16, 4, None)
    assert cfg.num_generations == 8 and cfg.max_seq_length - cfg.max_prompt_length == 256
    assert (cfg.learning_rate, cfg.beta) == (1e-5, 0.04)
    assert dict(cfg.trial.grpo_config) == {"temperature": 0.9}  # another GRPOConfig field: passed on as given
    assert (cfg.trial.num_processes, cfg.trial.strategy) == (2, "zero2")  # the launcher's keys
    # the commands take it as trl_config=...; later overrides win
    done = cli("estimate", f"trl_config={path}", "model=qwen2_5_0_5b", "gpu=l4_24g", "lora_rank=8", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["assumptions"]["backend"]
    oom = tmp_path / "oom.txt"
    oom.write_text(
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 22.06 GiB of which 1.10 GiB is free."
    )
    done = cli("doctor", "--message", str(oom), f"trl_config={path}", "model=qwen2_5_0_5b", "gpu=l4_24g", "--json")
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    "line, named",
    [
        ("lora_dropout: 0.05", "lora_dropout=0.05: grpo-sweep trains with lora_dropout=0.0"),
        ("bogus_setting: 3", "bogus_setting=3: not a `trl grpo` setting of TRL"),
        ("dataset_config: main", "dataset_config='main': a dataset configuration name is not supported"),
        ("gradient_accumulation_steps: 2", "given without per_device_train_batch_size"),
        ("accelerate_config: fsdp2", "accelerate_config='fsdp2': grpo-sweep takes the profiles single_gpu"),
    ],
)
def test_a_setting_that_cannot_be_mapped_is_one_line_naming_it(tmp_path, line, named):
    path = tmp_path / "my.yaml"
    path.write_text(f"model_name_or_path: Qwen/Qwen2.5-0.5B\n{line}\n")
    with pytest.raises(ConfigError) as err:
        trl_config.read(path)
    assert named in str(err.value) and f"trl_config={path}" in str(err.value) and "\n" not in str(err.value)
    done = cli("estimate", f"trl_config={path}")
    assert done.returncode == 2 and named in done.stderr


def test_a_grpo_config_and_a_lora_config_are_read_exactly():
    from peft import LoraConfig
    from trl import GRPOConfig

    from grpo_sweep.api import recipe_overrides

    args = GRPOConfig(
        output_dir="x",
        use_cpu=True,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=3,
        num_generations=3,
        max_completion_length=40,
        learning_rate=2e-5,
        beta=0.01,
        temperature=0.7,
        gradient_checkpointing=True,
    )
    peft = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    cfg = compose(recipe_overrides(training_args=args, peft=peft))
    assert (cfg.completions_per_step, cfg.per_device_train_batch_size, cfg.num_generations) == (6, 2, 3)
    assert cfg.max_seq_length - cfg.max_prompt_length == 40 and cfg.gradient_checkpointing is True
    assert (cfg.learning_rate, cfg.beta, dict(cfg.trial.grpo_config)) == (2e-5, 0.01, {"temperature": 0.7})
    assert (cfg.lora_rank, cfg.lora_alpha, sorted(cfg.lora_target_modules)) == (4, 8, ["q_proj", "v_proj"])
    # get_peft_model's kwargs, as an Unsloth notebook passes them
    kwargs = dict(
        r=16, lora_alpha=16, target_modules=["q_proj"], lora_dropout=0, bias="none", use_gradient_checkpointing="unsloth"
    )
    cfg = compose(recipe_overrides(peft=kwargs))
    assert (cfg.lora_rank, cfg.lora_alpha, cfg.gradient_checkpointing) == (16, 16, True)
    with pytest.raises(ConfigError, match=r"peft: use_dora=True: not an adapter setting grpo-sweep maps"):
        recipe_overrides(peft={"r": 8, "use_dora": True})


def test_train_and_plan_refuse_a_bad_trl_config_in_one_line(tmp_path):
    from helpers.runners import train_here

    path = tmp_path / "bad.yaml"
    path.write_text("bogus_setting: 3\n")
    named = f"trl_config={path}: bogus_setting=3: not a `trl grpo` setting of TRL"
    run = train_here([f"trl_config={path}"], cwd=tmp_path)
    assert run.returncode == 1 and f"Invalid configuration: {named}" in run.stderr
    done = cli("plan", f"trl_config={path}")
    assert done.returncode == 2 and named in done.stderr


def test_a_reward_that_cannot_be_pickled_is_one_line_with_the_fix(tmp_path):
    from grpo_sweep.api import recipe_overrides

    lock = threading.Lock()

    def guarded(completions, **kwargs):
        with lock:
            return [0.0 for _ in completions]

    import datasets

    data = datasets.Dataset.from_dict({"prompt": ["1+1="]})
    with pytest.raises(ConfigError) as err:
        recipe_overrides(reward_funcs=[guarded], train_dataset=data, folder=tmp_path)
    text = str(err.value)
    assert "reward_funcs[0] guarded: cannot travel to the trial processes by value" in text
    assert "put it in a module and pass 'module.function'" in text and "\n" not in text


def test_the_shipped_names_are_the_installed_trls_and_trl_022s():
    from transformers import TrainingArguments
    from trl import GRPOConfig, ModelConfig

    version = trl_config.installed_version()
    grpo = {f.name for f in dataclasses.fields(GRPOConfig)}
    assert trl_config.fields(version, grpo_only=True) == grpo
    assert set(trl_config._table()[version]["ModelConfig"]) == {f.name for f in dataclasses.fields(ModelConfig)}
    assert set(trl_config._table()[version]["TrainingArguments"]) == {f.name for f in dataclasses.fields(TrainingArguments)}
    # TRL 0.22 (read from its wheel): GRPOConfig still has max_prompt_length; ModelConfig says torch_dtype
    old = trl_config.fields("0.22", grpo_only=True)
    assert "max_prompt_length" in old and "max_prompt_length" not in grpo
    assert "torch_dtype" in trl_config._table()["0.22"]["ModelConfig"] and "trl-0.22.2" in trl_config.source("0.22")


def _settings() -> dict:
    """trainer_settings as trial/backends/trl.py writes them, with fields TRL 0.22 renamed or lacks."""
    return {
        "model_name_or_path": "Qwen/Qwen2.5-0.5B",
        "dtype": "float32",
        "grpo_config": {
            "per_device_train_batch_size": 2,
            "gradient_accumulation_steps": 2,
            "num_generations": 2,
            "max_completion_length": 32,
            "gradient_checkpointing": True,
            "learning_rate": 5e-6,
            "beta": 0.0,
            "loss_type": "dapo",
            "seed": 0,
            "use_transformers_continuous_batching": False,
            "cast_lm_head_to_fp32": False,
            "vllm_importance_sampling_correction": True,
            "log_unique_prompts": True,
        },
        "lora": {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "target_modules": ["q_proj", "v_proj"]},
        "max_prompt_length": 32,
        "reward_funcs": ["my_rewards.contains_solution"],
        "dataset": {"path": "json", "data_files": "data.jsonl", "split": "train"},
    }


def test_the_export_for_trl_022_uses_only_trl_022s_names():
    from grpo_sweep.report.export import trl_yaml_for

    metrics = {"trainer_settings": _settings(), "status": "ok", "steps": 2}
    text = trl_yaml_for(metrics, {}, "0.22", sweep="s", trial=0)
    out = yaml.safe_load(text)
    assert set(out) <= trl_config.fields("0.22"), set(out) - trl_config.fields("0.22")
    assert out["max_prompt_length"] == 32 and out["torch_dtype"] == "float32" and "dtype" not in out
    assert out["wandb_log_unique_prompts"] is True and "log_unique_prompts" not in out
    for gone in ("use_transformers_continuous_batching", "cast_lm_head_to_fp32", "vllm_importance_sampling_correction"):
        assert gone not in out and f"# {gone}=" in text and "dropped, TRL 0.22 has no such setting" in text
    assert "# dtype: named torch_dtype in TRL 0.22" in text and "written for TRL 0.22" in text
    # the installed TRL's export reads back as the same recipe
    from grpo_sweep.report.export import trl_yaml

    current = yaml.safe_load(trl_yaml(metrics, {}, sweep="s", trial=0))
    assert set(current) <= trl_config.fields(trl_config.installed_version())


# --- real: a Jupyter kernel, and `trl grpo` ----------------------------------------------------------------

# The notebook's own 24 prompts key a warm model of their own (trial/warmup.py), built inside the test:
# a short warm-up (the default's 400 steps of 64 rows take ~25 CPU-s); nothing here asserts what it learnt.
NOTEBOOK_WARMUP = ["model.warmup.steps=40", "model.warmup.batch_size=16"]
NOTEBOOK_CELLS = [
    "import re\nimport datasets\nimport grpo_sweep\nfrom trl import GRPOConfig, GRPOTrainer\n"
    'ANSWER = re.compile(r"<answer>(\\d+)</answer>")',
    # a reward that reads the notebook's global ANSWER at call time
    "def has_answer(completions, **kwargs):\n"
    "    return [1.0 if ANSWER.search(c if isinstance(c, str) else c[-1]['content']) else 0.0 for c in completions]",
    'train_dataset = datasets.Dataset.from_dict({"prompt": [f"{a} + {b} = " for a in range(6) for b in range(4)]})',
    "args = GRPOConfig(output_dir='unused', use_cpu=True, per_device_train_batch_size=2, gradient_accumulation_steps=2,\n"
    "                  num_generations=2, max_completion_length=16, learning_rate=1e-5, report_to='none')",
    "best = grpo_sweep.sweep(training_args=args, reward_funcs=[has_answer], train_dataset=train_dataset, n_trials=3,\n"
    "                        study_name='nb', knobs=['per_device_train_batch_size', 'gradient_checkpointing'],\n"
    "                        overrides=['trial.steps=2', 'hydra.sweeper.confirm_top=0',\n"
    "                                   'hydra.sweeper.search_stop=false', *WARMUP])",
    "best.table",
    "best",
    "trainer = GRPOTrainer(model=MODEL_DIR, reward_funcs=[has_answer], train_dataset=train_dataset,\n"
    "                      args=best.training_args(output_dir='step', max_steps=1, use_cpu=True, report_to='none'))\n"
    "trainer.train()\n"
    "print('STEPS', trainer.state.global_step, best.training_args().per_device_train_batch_size, best.notes)\n"
    "print('UNSLOTH', best.unsloth_kwargs()['from_pretrained']['max_seq_length'], best.report_path.exists(), best.overrides)",
]


@pytest.mark.slow
def test_a_notebook_sweeps_with_its_own_reward_data_and_grpo_config(tmp_path, monkeypatch, warm_model):
    """Over 20 s: a real ipykernel runs the cells; 3 trials of the tiny model, then a GRPOTrainer step."""
    import nbformat
    from helpers.data import save_tiny_model
    from nbclient import NotebookClient

    model_dir = save_tiny_model(
        tmp_path / "tiny-model", [f"{a} + {b} = <answer>{a + b}</answer>" for a in range(10) for b in range(10)]
    )
    kernels = tmp_path / "jupyter" / "kernels" / "grpo-sweep-test"
    kernels.mkdir(parents=True)
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"], "language": "python"}
    (kernels / "kernel.json").write_text(json.dumps({**spec, "display_name": "grpo-sweep test"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    cells = [f"MODEL_DIR = {str(model_dir)!r}\nWARMUP = {NOTEBOOK_WARMUP!r}", *NOTEBOOK_CELLS]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    client = NotebookClient(nb, kernel_name="grpo-sweep-test", timeout=900, resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    outputs = {i: c.outputs for i, c in enumerate(nb.cells)}
    sweep_text = "".join(o.get("text", "") for o in outputs[5])
    assert "trial 3/3" in sweep_text, sweep_text[-3000:]
    table = outputs[6][0]["data"]
    assert "<table" in table["text/html"] and "peak_memory_bytes" in table["text/html"]
    assert "[3 rows x" in table["text/plain"]  # the three trials
    shown = outputs[7][0]["data"]["text/html"]
    assert 'class="grpo-sweep-best"' in shown and "data:image/png;base64," in shown and "Winner: trial" in shown
    steps = "".join(o.get("text", "") for o in outputs[8])
    assert "STEPS 1" in steps and "UNSLOTH 48 True [" in steps, steps[-3000:]
    assert f"max_prompt_length=32: dropped, TRL {trl_config.installed_version()} (installed) has no such setting" in steps
    # the progress bar (tqdm.auto: a widget where ipywidgets is installed, else its text on stderr)
    bar = [o for o in outputs[5] if o.get("name") == "stderr" or "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    assert bar and ("sweep nb" in json.dumps([o for o in bar]) or "widget" in json.dumps(bar)), outputs[5][:3]
    # the notebook's reward travelled by value, its data as a file in the study's folder
    folder = tmp_path / "outputs" / "sweeps" / "nb"
    assert (folder / "grpo_sweep_notebook_rewards.py").exists() and (folder / "train_dataset.parquet").exists()
    best = yaml.safe_load((folder / "best.yaml").read_text())
    assert best["recipe"]["completions_per_step"] == 4 and best["recipe"]["num_generations"] == 2


@pytest.mark.slow
def test_a_sweep_from_a_trl_config_exports_what_trl_grpo_runs_with_the_same_recipe(tmp_path, monkeypatch, capsys):
    """Over 20 s: 2 trials from a `trl grpo` YAML through grpo_sweep.sweep, then `trl grpo --config` on the export."""
    from helpers.data import save_tiny_model, write_data

    import grpo_sweep

    monkeypatch.chdir(tmp_path)
    data = write_data(tmp_path, chat=False, rows=8)
    model_dir = save_tiny_model(tmp_path / "tiny-model", data.read_text().splitlines())
    recipe = {
        "model_name_or_path": str(model_dir),
        "datasets": [{"path": "json", "data_files": str(data), "split": "train"}],
        "reward_funcs": ["my_rewards.contains_solution"],
        "use_peft": True,
        "lora_r": 8,
        "lora_alpha": 16,
        "lora_target_modules": ["q_proj", "v_proj"],
        "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 1,
        "num_generations": 2,
        "max_completion_length": 16,
        "learning_rate": 2.0e-5,
        "beta": 0.01,
        "temperature": 0.9,
    }
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(recipe))
    best = grpo_sweep.sweep(
        trl_config="mine.yaml",
        study_name="rt",
        n_trials=2,
        knobs={"gradient_checkpointing": [False, True]},
        overrides=["trial.steps=2", "hydra.sweeper.confirm_top=0"],
        progress=False,
    )
    # the same call with the same study name resumes the study: its 2 trials are done, none runs again
    capsys.readouterr()
    again = grpo_sweep.sweep(
        trl_config="mine.yaml",
        study_name="rt",
        n_trials=2,
        knobs={"gradient_checkpointing": [False, True]},
        overrides=["trial.steps=2", "hydra.sweeper.confirm_top=0"],
        progress=False,
    )
    assert "Resuming study 'rt' with 2 trials" in capsys.readouterr().out
    assert again.summary["best_trial"] == best.summary["best_trial"] and again.summary["trials"] == {"COMPLETE": 2}
    exported = best.folder / "best.trl.yaml"
    back = yaml.safe_load(exported.read_text())
    for key in ("reward_funcs", "lora_r", "lora_alpha", "num_generations", "max_completion_length", "learning_rate", "beta"):
        assert back[key] == recipe[key], key
    assert back["model_name_or_path"] == str(model_dir) and sorted(back["lora_target_modules"]) == ["q_proj", "v_proj"]
    assert back["temperature"] == 0.9
    assert back["per_device_train_batch_size"] * back["gradient_accumulation_steps"] == 2
    # the same winner in TRL 0.22's names, for a notebook that pins it
    done = cli("export", str(best.folder), "--trl-version", "0.22")
    assert done.returncode == 0, done.stderr
    old = yaml.safe_load((best.folder / "best.trl-0.22.yaml").read_text())
    assert set(old) <= trl_config.fields("0.22") and old["max_prompt_length"] == back.get("max_prompt_length", 32)
    assert {k: old[k] for k in ("lora_r", "num_generations", "max_completion_length")} == {
        k: recipe[k] for k in ("lora_r", "num_generations", "max_completion_length")
    }
    trl = shutil.which("trl", path=str(Path(sys.executable).parent))
    out_dir = tmp_path / "trl-out"
    run = subprocess.run(
        [trl, "grpo", "--config", str(exported), "--max_steps", "1", "--output_dir", str(out_dir), "--report_to", "none"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    import torch

    ran = torch.load(out_dir / "training_args.bin", weights_only=False)
    for key in ("num_generations", "max_completion_length", "learning_rate", "beta", "temperature"):
        assert getattr(ran, key) == recipe[key], key


def test_an_enum_field_and_a_bad_value_are_read_and_refused_before_anything_runs(tmp_path, monkeypatch):
    """transformers' OptimizerNames is written by its value; a value no trial could run is one line."""
    from trl import GRPOConfig

    import grpo_sweep
    from grpo_sweep.api import recipe_overrides

    monkeypatch.chdir(tmp_path)
    args = GRPOConfig(output_dir="x", use_cpu=True, optim="adamw_torch", per_device_train_batch_size=2, num_generations=2)
    assert "optim=adamw_torch" in recipe_overrides(training_args=args)
    args = GRPOConfig(output_dir="x", use_cpu=True, optim="adafactor", per_device_train_batch_size=2, num_generations=2)
    with pytest.raises(ConfigError, match=r"^optim=adafactor: must be one of adamw_torch"):
        grpo_sweep.sweep(training_args=args, n_trials=1)
    assert not (tmp_path / "outputs").exists()  # nothing ran


def test_a_dataset_of_prompts_only_becomes_trls_prompt_column(tmp_path):
    """A notebook's Dataset often holds nothing but prompts; the trial's dataset keeps them all."""
    import datasets

    from grpo_sweep.api import recipe_overrides
    from grpo_sweep.trial.models import load_tokenizer
    from grpo_sweep.trial.tasks import get_task

    data = datasets.Dataset.from_dict({"prompt": [f"{a} + 1 = " for a in range(5)]})
    over = recipe_overrides(reward_funcs=["trl.rewards.think_format_reward"], train_dataset=data, folder=tmp_path)
    cfg = compose([*over, "trial.steps=2"])
    task = get_task(cfg)
    built = task.dataset(load_tokenizer(cfg, task.corpus()))
    assert built.column_names == ["prompt"] and len(built) == 5


def test_estimate_and_plan_take_the_notebooks_objects(tmp_path, monkeypatch):
    """estimate: no trial, no torch in the prediction; plan: the sweeper's forecast, nothing run."""
    import grpo_sweep
    from grpo_sweep.api import recipe_overrides

    monkeypatch.chdir(tmp_path)
    loading = dict(model_name="qwen2_5_0_5b", max_seq_length=512, load_in_4bit=True, fast_inference=True, max_lora_rank=16)
    cfg = compose([*recipe_overrides(unsloth=loading, gpu="l4_24g"), "lora_rank=16"])
    assert (cfg.backend.name, cfg.model.name, cfg.max_seq_length, cfg.load_in_4bit) == ("unsloth", "qwen2_5_0_5b", 512, True)
    with pytest.raises(ConfigError, match=r"^unsloth: rope_scaling=2: not a from_pretrained argument grpo-sweep maps"):
        recipe_overrides(unsloth={"rope_scaling": 2})
    small = grpo_sweep.estimate(model="qwen2_5_0_5b", gpu=2, training_args={"per_device_train_batch_size": 8})
    large = grpo_sweep.estimate(model="qwen2_5_0_5b", gpu=80, training_args={"per_device_train_batch_size": 8})
    assert small.total_bytes == large.total_bytes and not small.fits and large.fits  # gpu in GiB: the budget
    forecast = grpo_sweep.plan(training_args={"per_device_train_batch_size": 4, "num_generations": 2}, study_name="p")
    assert forecast["space"]["size"] == 3 * 2 * 2, forecast  # batch 1,2,4 x checkpointing x attention
    assert not (tmp_path / "outputs" / "sweeps" / "p" / "study.journal").exists()  # the storage never opened
