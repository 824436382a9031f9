"""The Python API for notebooks: `grpo_sweep.estimate`, `grpo_sweep.plan` and `grpo_sweep.sweep` take
the notebook's own objects (a GRPOConfig, a LoraConfig or the get_peft_model kwargs, Unsloth's
from_pretrained kwargs, reward functions, a datasets.Dataset, a `trl grpo` YAML) as the recipe.

Nothing is sampled or run here: the objects become Hydra overrides (config/trl_config.py reads the
GRPOConfig fields), and the sweep is the app's own `python -m grpo_sweep -m` in a fresh process, as
from a shell; trials run in their own processes under it. Reward functions travel by value
(cloudpickle) through a module written into the study's folder; the dataset travels as a parquet
file there. The same call with the same study name resumes the study. `sweep` returns a Best.
"""

from __future__ import annotations

import base64
import dataclasses
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from .config.schema import ConfigError
from .config.trl_config import adapt, installed_version, read, to_overrides, value_text
from .units import GIB

# The knobs searched when `knobs` is not given (each a levers.KINDS knob that every backend and card runs).
DEFAULT_KNOBS = ("per_device_train_batch_size", "gradient_checkpointing", "attn_implementation")
KNOB_VALUES = {"gradient_checkpointing": [False, True], "attn_implementation": ["sdpa", "eager"]}
# get_peft_model / LoraConfig argument -> `trl grpo` setting (config/trl_config.py maps those)
PEFT_NAMES = {"r": "lora_r", "lora_alpha": "lora_alpha", "target_modules": "lora_target_modules", "lora_dropout": "lora_dropout"}
# get_peft_model arguments that do not change what the sweep measures, at the values given
PEFT_DEFAULTS = {"bias": "none", "use_rslora": False, "loftq_config": None, "task_type": "CAUSAL_LM", "random_state": None}
UNSLOTH_NAMES = {
    "max_seq_length": "max_seq_length",
    "load_in_4bit": "load_in_4bit",
    "gpu_memory_utilization": "gpu_memory_utilization",
}
REWARDS_MODULE = "grpo_sweep_notebook_rewards"  # written into the study's folder, on the trials' PYTHONPATH
REWARDS_FILE = "reward_funcs.pkl"
DATASET_FILE = "train_dataset.parquet"


def _conf_names(group: str) -> set[str]:
    return {p.stem for p in (Path(__file__).parent / "conf" / group).glob("*.yaml")}


def _grpo_settings(args: Any) -> dict:
    """A GRPOConfig (or a subclass such as Unsloth's) as `trl grpo` settings: every field a lever reads,
    at its value there (TRL's defaults included; the vLLM ones only with use_vllm), and each other field
    that differs from that class's defaults for the same batch and device; a dict as given."""
    if isinstance(args, dict):
        return dict(args)
    if not dataclasses.is_dataclass(args):
        raise ConfigError(f"training_args: a trl.GRPOConfig, Unsloth's config or a dict, not a {type(args).__name__}")
    from .config.trl_config import MAPPED, READ_BELOW

    keep = ("output_dir", "use_cpu", "per_device_train_batch_size", "gradient_accumulation_steps", "num_generations")
    baseline = type(args)(**{k: getattr(args, k) for k in keep if hasattr(args, k)})
    levers = (set(MAPPED) | READ_BELOW) - ({"use_vllm"} if getattr(args, "use_vllm", False) else set())
    out = {}
    for f in dataclasses.fields(args):
        value = getattr(args, f.name)
        if f.name.startswith("vllm_") and not getattr(args, "use_vllm", False):
            continue
        if f.init and (f.name in levers or value != getattr(baseline, f.name, None)):
            out[f.name] = value
    if out.get("steps_per_generation") == args.gradient_accumulation_steps:
        out.pop("steps_per_generation", None)  # derived from the accumulation by GRPOConfig itself
    return {k: v for k, v in out.items() if not k.startswith("_")}


def _peft_settings(peft: Any) -> dict:
    given = (
        dict(peft) if isinstance(peft, dict) else {k: getattr(peft, k) for k in (*PEFT_NAMES, "bias", "use_rslora", "task_type")}
    )
    out = {}
    for key, value in given.items():
        value = getattr(value, "value", value)  # peft's TaskType enum
        if key in PEFT_NAMES:
            out[PEFT_NAMES[key]] = sorted(value) if isinstance(value, (set, frozenset)) else value
        elif key == "use_gradient_checkpointing":
            out["gradient_checkpointing"] = bool(value)  # "unsloth" or True: on, as the starting point
        elif key in PEFT_DEFAULTS:
            if value != PEFT_DEFAULTS[key] and not (key == "random_state" or (key == "task_type" and value is None)):
                raise ConfigError(
                    f"peft: {key}={value!r}: grpo-sweep trains adapters with {key}={PEFT_DEFAULTS[key]!r}; set it so"
                )
        elif key != "model":
            raise ConfigError(
                f"peft: {key}={value!r}: not an adapter setting grpo-sweep maps ({', '.join(PEFT_NAMES)}); remove it"
            )
    return out


def _unsloth_overrides(kwargs: dict) -> list[str]:
    out = ["backend=unsloth"]
    for key, value in kwargs.items():
        if key in UNSLOTH_NAMES:
            out.append(f"{UNSLOTH_NAMES[key]}={value_text(value)}")
        elif key == "fast_inference":
            out.append(f"backend.fast_inference={value_text(bool(value))}")
        elif key == "model_name":
            out += _model_overrides(value)
        elif key == "max_lora_rank" or (key == "dtype" and value is None):
            continue  # vLLM's adapter capacity: grpo-sweep sets it to lora_rank; dtype None: the model's own
        else:
            raise ConfigError(
                f"unsloth: {key}={value!r}: not a from_pretrained argument grpo-sweep maps "
                f"({', '.join([*UNSLOTH_NAMES, 'fast_inference', 'max_lora_rank', 'model_name'])}); remove it"
            )
    return out


def _model_overrides(model: str) -> list[str]:
    if model in _conf_names("model"):
        return [f"model={model}"]
    return ["model=hub", f"model.hub_id={value_text(str(model))}"]


def _gpu_overrides(gpu: Any) -> list[str]:
    if isinstance(gpu, bool) or not isinstance(gpu, (int, float, str)):
        raise ConfigError(f"gpu={gpu!r}: a conf/gpu name ({', '.join(sorted(_conf_names('gpu')))}) or a memory size in GiB")
    if isinstance(gpu, str):
        return [f"gpu={gpu}"]
    return [f"gpu.memory_gib={value_text(float(gpu))}"]


def _write_rewards(funcs: list, folder: Path) -> list[str]:
    """Import paths for `funcs`: a string as given; a callable pickled by value (cloudpickle) into
    `folder`, with a module there that loads it under the function's name."""
    import cloudpickle

    named, paths = {}, []
    for i, func in enumerate(funcs):
        if isinstance(func, str):
            paths.append(func)
            continue
        if not callable(func):
            raise ConfigError(f"reward_funcs[{i}]={func!r}: a function or an import path ('module.function')")
        base = getattr(func, "__name__", "") or ""
        name = base if base.isidentifier() and not base.startswith("_") else f"reward_{i}"
        while name in named:
            name = f"{name}_{i}"
        try:
            cloudpickle.dumps(func)
        except Exception as err:  # noqa: BLE001 - whatever the pickler meets (a lock, a file, a model)
            raise ConfigError(
                f"reward_funcs[{i}] {base or repr(func)}: cannot travel to the trial processes by value "
                f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); make what it reads at "
                "call time plain data (strings, numbers, regexes), or put it in a module and pass 'module.function'"
            ) from None
        named[name] = func
        paths.append(f"{REWARDS_MODULE}.{name}")
    if named:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / REWARDS_FILE).write_bytes(cloudpickle.dumps(named))
        lines = [
            '"""The notebook\'s reward functions, pickled by value (grpo_sweep.api): loaded under their names."""',
            "import pathlib",
            "",
            "import cloudpickle",
            "",
            f"_FUNCS = cloudpickle.loads(pathlib.Path(__file__).with_name({REWARDS_FILE!r}).read_bytes())",
            *[f"{n} = _FUNCS[{n!r}]" for n in named],
        ]
        (folder / f"{REWARDS_MODULE}.py").write_text("\n".join(lines) + "\n")
    return paths


def _write_dataset(dataset: Any, folder: Path) -> Path:
    if not hasattr(dataset, "to_parquet"):
        raise ConfigError(f"train_dataset: a datasets.Dataset, not a {type(dataset).__name__}")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / DATASET_FILE
    tmp = path.with_name(f".{path.name}.tmp")
    dataset.to_parquet(str(tmp))
    if not path.exists() or path.read_bytes() != tmp.read_bytes():  # unchanged bytes keep the study's identity
        tmp.replace(path)
    else:
        tmp.unlink()
    return path


def study_dir(study_name: str) -> Path:
    """The study's folder: its journal, trials, best.yaml, report, and what the notebook sent."""
    return Path("outputs") / "sweeps" / study_name


def recipe_overrides(
    *,
    model: str | None = None,
    gpu: Any = None,
    training_args: Any = None,
    peft: Any = None,
    unsloth: dict | None = None,
    reward_funcs: list | None = None,
    train_dataset: Any = None,
    trl_config: str | Path | None = None,
    overrides: list[str] | None = None,
    folder: Path | None = None,
) -> list[str]:
    """The Hydra overrides the notebook's objects stand for, in order (later ones win): the `trl grpo`
    YAML, the GRPOConfig, the adapter, Unsloth's loading, the model, the card, the data and rewards
    (written into `folder`), then `overrides`.

    Args:
        model: A model name or path.
        gpu: The target card: a conf/gpu name, or its memory in GiB.
        training_args: A GRPOConfig (or its fields as a dict).
        peft: A LoraConfig, or the get_peft_model kwargs.
        unsloth: Unsloth's from_pretrained kwargs.
        reward_funcs: Reward callables, sent by value.
        train_dataset: A datasets.Dataset, written as parquet.
        trl_config: A `trl grpo` YAML file.
        overrides: Hydra overrides, applied last.
        folder: The study's folder, where the data and rewards are written.

    Returns:
        The Hydra overrides.
    """
    out: list[str] = list(read(trl_config)) if trl_config is not None else []
    if training_args is not None:
        out += to_overrides(_grpo_settings(training_args), "training_args")
    if peft is not None:
        out += to_overrides(_peft_settings(peft), "peft")
    if unsloth is not None:
        out += _unsloth_overrides(dict(unsloth))
    if model is not None:
        out += _model_overrides(model)
    if gpu is not None:
        out += _gpu_overrides(gpu)
    if (train_dataset is None) != (reward_funcs is None) and trl_config is None:
        given, missing = ("train_dataset", "reward_funcs") if reward_funcs is None else ("reward_funcs", "train_dataset")
        raise ConfigError(f"{given} is given without {missing}: your task needs both (or neither, for the built-in task)")
    if train_dataset is not None:
        if folder is None:
            raise ConfigError("train_dataset: needs the study's folder (sweep, plan)")
        path = _write_dataset(train_dataset, folder)
        out += ["task=dataset", f"task.path={value_text(str(path.resolve()))}", "task.split=train"]
        out += [f"task.num_prompts={len(train_dataset)}"] if len(train_dataset) < 512 else []
    if reward_funcs is not None:
        funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        out.append(f"task.reward_funcs={value_text(_write_rewards(funcs, folder or Path('.')))}")
    return out + list(overrides or [])


def _compose(over: list[str]):
    """The trial's config (hydra.* settings belong to the app's run, not to it), checked as
    `grpo-sweep estimate` checks it, for the target card: a bad value is refused before anything runs."""
    from .config.compose import compose_train_config
    from .config.validate import validate
    from .memory.shapes import target_device

    cfg = compose_train_config([o for o in over if not o.lstrip("+~").startswith("hydra")])
    validate(cfg, cuda=target_device(cfg) == "cuda")
    return cfg


def knob_space(cfg: Any, knobs: Any = None, concessions: list[str] | None = None) -> dict[str, list]:
    """hydra.sweeper.params: `knobs` a list of names (their usual values) or {name: [values]}; None:
    DEFAULT_KNOBS. The micro-batch's values divide the config's completions per step.

    Args:
        cfg: The composed config.
        knobs: Knob names (their usual values) or {name: [values]}; None: DEFAULT_KNOBS.
        concessions: Recipe settings the sweep may change too.

    Returns:
        hydra.sweeper.params: each searched setting's values.
    """
    from .levers import kind_of

    batch = int(cfg.per_device_train_batch_size)
    per_step = int(cfg.completions_per_step or batch * int(cfg.gradient_accumulation_steps or 1))
    usual = {**KNOB_VALUES, "per_device_train_batch_size": [d for d in range(1, per_step + 1) if per_step % d == 0]}
    chosen = (
        {k: usual.get(k) for k in (DEFAULT_KNOBS if knobs is None else knobs)} if not isinstance(knobs, dict) else dict(knobs)
    )
    space = {}
    for name, values in chosen.items():
        if values is None:
            raise ConfigError(f"knobs: {name!r} has no usual values; give them: knobs={{{name!r}: [...]}}")
        if kind_of(name) != "knob" and name not in (concessions or []):
            raise ConfigError(
                f"knobs: {name} is a recipe setting (it changes what is learned); "
                "list it in concessions=[...] to let the sweep change it"
            )
        space[name] = list(values)
    return space


def _sweep_command(
    over: list[str], study_name: str, n_trials: int, folder: Path, space: dict, concessions: list[str] | None
) -> list[str]:
    """The app's command line: the fixed overrides, the study, the space as `key=choice(...)`; the
    recipe's own value of each searched knob is enqueued as the first point (the starting point).

    Args:
        over: The recipe's overrides.
        study_name: The study's name.
        n_trials: How many trials count toward the sweep.
        folder: The study's folder.
        space: Each searched setting's values.
        concessions: Recipe settings the sweep may change.

    Returns:
        The command line.
    """
    fixed = [o for o in over if o.lstrip("+").split("=", 1)[0] not in space]
    given = {o.split("=", 1)[0]: o.split("=", 1)[1] for o in over if "=" in o}
    start = {k: given[k] for k in space if k in given and given[k] in [value_text(v) for v in space[k]]}
    cmd = [sys.executable, "-m", "grpo_sweep", "-m", "hydra/sweeper=grpo_optuna", *fixed]
    cmd += [f"hydra.sweeper.study_name={value_text(study_name)}", f"hydra.sweeper.n_trials={int(n_trials)}"]
    cmd += [f"hydra.sweep.dir={value_text(str(folder.resolve()))}"]
    cmd += [f"{k}=choice({','.join(value_text(v) for v in values)})" for k, values in space.items()]
    if start:
        cmd.append("hydra.sweeper.enqueue=[{" + ",".join(f"{k}:{v}" for k, v in start.items()) + "}]")
    if concessions:
        cmd.append(f"hydra.sweeper.concessions={value_text(list(concessions))}")
    return cmd


def _env(folder: Path) -> dict:
    path = os.pathsep.join(p for p in (str(folder.resolve()), os.getcwd(), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


def estimate(*, logits_mode: str | None = None, **recipe: Any):
    """The predicted peak memory of the recipe on its card (memory.estimator.Estimate), without a GPU
    and without running anything. Takes recipe_overrides' arguments; data and rewards play no part."""
    from .memory.estimator import estimate as predict

    recipe.pop("reward_funcs", None)
    recipe.pop("train_dataset", None)
    return predict(_compose(recipe_overrides(**recipe)), logits_mode=logits_mode)


def plan(*, study_name: str = "notebook", knobs: Any = None, concessions: list[str] | None = None, **recipe: Any) -> dict:
    """The sweep's forecast before any trial (what `grpo-sweep plan --json` prints), as a dict.

    Args:
        study_name: The study's name (its folder: outputs/sweeps/<name>).
        knobs: Knob names or {name: [values]}; None: DEFAULT_KNOBS.
        concessions: Recipe settings the sweep may change too.
        **recipe: The recipe's objects, as `recipe_overrides` takes them.

    Returns:
        The forecast, as `grpo-sweep plan --json` prints it.
    """
    import json
    import tempfile

    folder = study_dir(study_name)
    over = recipe_overrides(folder=folder, **recipe)
    space = knob_space(_compose(over), knobs, concessions)
    with tempfile.TemporaryDirectory(prefix="grpo-sweep-plan-") as tmp:
        path = Path(tmp) / "plan.json"
        cmd = _sweep_command(over, study_name, 1, folder, space, concessions)
        cmd += ["hydra.sweeper.plan_only=true", f"hydra.sweeper.plan_json={path}"]
        done = subprocess.run(cmd, env=_env(folder), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
        if done.returncode != 0 or not path.exists():
            raise RuntimeError(f"grpo-sweep plan failed:\n{done.stdout[-3000:]}")
        return json.loads(path.read_text())


def sweep(
    *,
    study_name: str = "notebook",
    n_trials: int = 8,
    knobs: Any = None,
    concessions: list[str] | None = None,
    progress: bool = True,
    **recipe: Any,
) -> Best:
    """Run the sweep (or resume the study of that name) and return its Best. The sweep's lines are
    printed as they come, beside a tqdm.auto bar of the trials that count toward n_trials.

    Args:
        study_name: The study's name; the same name resumes it.
        n_trials: How many trials count toward the sweep.
        knobs: Knob names or {name: [values]}; None: DEFAULT_KNOBS.
        concessions: Recipe settings the sweep may change too.
        progress: Show a tqdm bar of the trials.
        **recipe: The recipe's objects, as `recipe_overrides` takes them.

    Returns:
        The sweep's Best.
    """
    folder = study_dir(study_name)
    over = recipe_overrides(folder=folder, **recipe)
    space = knob_space(_compose(over), knobs, concessions)
    cmd = _sweep_command(over, study_name, n_trials, folder, space, concessions)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=int(n_trials), desc=f"sweep {study_name}", unit="trial")
    lines: list[str] = []
    proc = subprocess.Popen(cmd, env=_env(folder), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            lines.append(line)
            print(line, end="", flush=True)
            counted = re.search(r"\btrial (\d+)/(\d+)", line)
            if bar is not None and counted:
                bar.update(max(0, int(counted.group(1)) - bar.n))
    except KeyboardInterrupt:  # Jupyter's stop button: the sweep stops as on Ctrl-C (the study keeps what ran)
        proc.send_signal(signal.SIGINT)
        proc.wait()
        raise
    finally:
        if bar is not None:
            bar.close()
    code = proc.wait()
    if code != 0 or not (folder / "best.yaml").exists():
        raise RuntimeError(f"the sweep {study_name} ended with exit status {code}:\n{''.join(lines[-30:])}")
    return Best(folder)


class Best:
    """A finished sweep's winner: `.training_args()`, `.unsloth_kwargs()`, `.overrides`, `.report_path`,
    `.table` (a pandas DataFrame of the trials); shown in Jupyter as the throughput-against-memory
    figure and the winner."""

    def __init__(self, folder: str | Path):
        import yaml

        self.folder = Path(folder)
        self.summary = yaml.safe_load((self.folder / "best.yaml").read_text()) or {}
        if self.summary.get("best_trial") is None:
            raise ConfigError(f"{self.folder / 'best.yaml'}: no best trial (nothing fit or finished); see its report")
        self.overrides: list[str] = list(self.summary.get("overrides") or [])
        self.report_path = self.folder / "report.html"
        self.notes: list[str] = []

    @property
    def settings(self) -> dict:
        from .metrics import read_metrics

        metrics = read_metrics(Path(self.summary["run_dir"])) or {}
        return metrics.get("trainer_settings") or {}

    @property
    def table(self):
        import pandas

        return pandas.read_csv(self.folder / "trials.csv")

    def training_args(self, **changes: Any):
        """The winner as a GRPOConfig of the installed TRL: renamed fields under their names there, a
        field it lacks dropped (each noted in `.notes`); `changes` (output_dir, max_steps, ...) on top."""
        from trl import GRPOConfig

        settings = self.settings
        grpo = dict(settings.get("grpo_config") or {})
        grpo["max_prompt_length"] = settings.get("max_prompt_length")
        names = {f.name for f in dataclasses.fields(GRPOConfig)}
        kept, self.notes = adapt(grpo, f"{installed_version()} (installed)", known=names)
        kept.setdefault("output_dir", f"grpo-{self.summary.get('study', 'sweep')}")
        return GRPOConfig(**{**kept, **changes})

    def unsloth_kwargs(self) -> dict:
        """{"from_pretrained": {...}, "get_peft_model": {...}}: the winner in Unsloth's calls."""
        settings = self.settings
        if settings.get("unsloth"):
            return {k: dict(v) for k, v in settings["unsloth"].items()}
        levers = self.summary.get("levers") or {}
        lora = settings.get("lora") or {}
        return {
            "from_pretrained": {
                "model_name": settings.get("model_name_or_path"),
                "max_seq_length": levers.get("max_seq_length"),
                "load_in_4bit": bool(levers.get("load_in_4bit")),
                "max_lora_rank": lora.get("r", levers.get("lora_rank")),
            },
            "get_peft_model": {
                "r": lora.get("r", levers.get("lora_rank")),
                "lora_alpha": lora.get("lora_alpha"),
                "target_modules": lora.get("target_modules", levers.get("lora_target_modules")),
                "use_gradient_checkpointing": "unsloth" if levers.get("gradient_checkpointing") else False,
            },
        }

    def _figure_png(self) -> bytes | None:
        import tempfile

        from .report.figures import throughput_vs_memory
        from .report.trials import best_trial, budget_gib, load_dir

        trials = load_dir(self.folder)
        budget = budget_gib(trials)
        with tempfile.TemporaryDirectory() as tmp:
            path = throughput_vs_memory(trials, Path(tmp) / "fig.png", budget=budget, best=best_trial(trials))
            return path.read_bytes() if path else None

    def _repr_html_(self) -> str:
        import html

        s = self.summary
        png = self._figure_png()
        img = (
            f'<img src="data:image/png;base64,{base64.b64encode(png).decode()}"/>' if png else "<p>(no trial measured a peak)</p>"
        )
        peak = s.get("peak_memory_bytes")
        words = (
            f"<p><b>Winner: trial {s['best_trial']}</b>, {s.get('objective', 'objective')} = {s.get('best_value', 0):.1f}"
            + (f", peak {peak / GIB:.3f} GiB" if peak else "")
            + "</p><p><code>"
            + html.escape(" ".join(self.overrides))
            + f"</code></p><p>Report: {html.escape(str(self.report_path))}</p>"
        )
        return f'<div class="grpo-sweep-best">{img}{words}</div>'

    def __repr__(self) -> str:
        return f"Best(trial {self.summary.get('best_trial')}: {' '.join(self.overrides)})"
