"""The winner handed back in the user's own stack: `best.trl.yaml` for `trl grpo --config`,
`best_grpo_config.py` (GRPOConfig, LoraConfig, BitsAndBytesConfig) and, for backend=unsloth,
`best_unsloth.py` (FastLanguageModel.from_pretrained / get_peft_model and the GRPOConfig).

Written from one trial's run directory: metrics.json `trainer_settings` (the GRPOConfig fields,
adapter, 4-bit loading, model and data, read back from the trainer that ran: trial/backends/trl.py
`settings`) and the numbers it measured. Pure text: no torch, TRL or PEFT is imported here (the
sweep's parent writes these files). Measuring-only settings are not exported (output_dir,
max_steps, use_cpu, logging, the worst-case generation floor); the files say so.

Folder, study and model names come from the user and may hold anything: every one reaches a file as
a value (`repr()` in Python, yaml.safe_dump in YAML) or inside a `#` comment cut to one line
(`one_line`); the Python files open with a fixed docstring, so no name lands on their first two
lines, where Python reads an encoding declaration.
"""

from __future__ import annotations

import keyword
import re
from pathlib import Path
from typing import Any

from ..config.backends import VLLM_ENGINE_SETTINGS
from ..files import write_atomic
from ..metrics import read_metrics
from ..study.attrs import Status
from ..units import GIB

# The first line of each Python file: fixed text (what the trial measured follows as comments).
PY_DOC = '"""{what} of one grpo-sweep trial: which trial and what it measured, below."""\n'

FILES = {"trl": "{prefix}.trl.yaml", "python": "{prefix}_grpo_config.py", "unsloth": "{prefix}_unsloth.py"}


class ExportError(ValueError):
    """The trial cannot be exported (no metrics.json, or it ran before trainer_settings existed)."""


def _load(run_dir: Path) -> tuple[dict, dict]:
    import yaml

    metrics = read_metrics(run_dir)
    if metrics is None:
        raise ExportError(f"{run_dir}: no metrics.json (the trial did not finish)")
    settings = metrics.get("trainer_settings")
    if not settings:
        raise ExportError(
            f"{run_dir}: metrics.json has no trainer_settings (status {metrics.get('status')}: the trainer was never built, "
            "or grpo-sweep was older than the export); run the point again"
        )
    config_path = Path(run_dir) / "config.yaml"
    config = yaml.safe_load(config_path.read_text()) if config_path.exists() else {}
    return metrics, config or {}


def header(metrics: dict, config: dict, *, sweep: str | None, trial: int | None, held: dict | None = None) -> list[str]:
    """Which sweep and trial, and what it measured: the numbers this file reproduces.

    Args:
        metrics: The trial's metrics.json.
        config: The trial's config.yaml, as a dict.
        sweep: The sweep's name; None: the trial's study.
        trial: The trial's number; None: the config's.
        held: The recipe the sweep held (best.yaml `recipe`), to name the concessions taken.

    Returns:
        The header's comment lines.
    """
    trial_cfg = config.get("trial") or {}
    sweep = sweep or trial_cfg.get("study") or "(a single run)"
    trial = trial if trial is not None else trial_cfg.get("number")
    peak, budget = metrics.get("peak_memory_bytes"), metrics.get("budget_bytes")
    gpu = (config.get("gpu") or {}).get("name", "?")
    tps, step = metrics.get("tokens_per_s"), metrics.get("step_time_s")
    reward_s = metrics.get("reward_seconds_per_step")
    status = metrics.get("status")
    warning = (
        [f"NOT A FINISHED TRIAL: it ended {status} ({first_line(metrics.get('error'))}); exported with --force"]
        if status != Status.OK
        else []
    )
    lines = [
        *warning,
        f"grpo-sweep export: sweep {sweep}, trial {trial if trial is not None else '-'} "
        f"(backend {metrics.get('backend')} on {metrics.get('device')}, gpu={gpu}; run dir {metrics.get('run_dir') or '-'})",
        "measured: "
        + (f"{tps:.1f} tokens/s" if tps is not None else "no throughput")
        + (f", {step:.3g} s per step" if step is not None else "")
        + (f", peak memory {peak / GIB:.3f} GiB ({peak} B)" if peak is not None else ", no peak")
        + (f" of a {budget / GIB:.3g} GiB budget" if budget else "")
        + (f"; reward functions {reward_s:.3g} s per step" if reward_s is not None else "")
        + (f" ({100 * reward_s / step:.1f}% of the step)" if reward_s is not None and step else ""),
        f"trial status: {status}",
        concessions_line(held, metrics.get("recipe")),
    ]
    return lines


def first_line(text: Any) -> str:
    return (str(text).strip().splitlines() or ["no error recorded"])[0][:200] if text else "no error recorded"


def concessions_line(held: dict | None, trained: dict | None) -> str:
    """Which recipe settings the trial gave up against the recipe the sweep held (equal learning)."""
    if not held or not trained:
        return "recipe: as configured (no sweep recipe to compare with)"
    taken = [
        f"{k} {_show(held.get(k))} -> {_show(trained.get(k))}" for k in held if k in trained and held.get(k) != trained.get(k)
    ]
    return "recipe concessions taken: " + ", ".join(taken) if taken else "recipe: the sweep's held recipe, no concession taken"


def _show(value: Any) -> str:
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


def engine_notes(config: dict, settings: dict) -> list[str]:
    """backend.vllm_* engine settings the trial ran with, and how to pass them to stock TRL: only to a
    `trl vllm-serve` server (TRL forwards the flags it does not know to `vllm serve`); TRL's colocate mode
    has no pass-through (grpo-sweep set them over TRL's LLM(...) call: trial/backends/trl_vllm.py)."""
    backend = config.get("backend") or {}
    given = {arg: backend[key] for key, arg in VLLM_ENGINE_SETTINGS.items() if backend.get(key) is not None}
    server = backend.get("vllm_mode", "colocate") == "server"
    if not server:
        given.pop("model_impl", None)  # colocate: GRPOConfig.vllm_model_impl, written with the config
    if not given:
        return []
    # `trl vllm-serve` names model_impl itself (--vllm_model_impl) and passes the other flags on to `vllm serve`
    flags = " ".join(
        f"--{'vllm_model_impl' if arg == 'model_impl' else arg.replace('_', '-')} {str(v).lower() if isinstance(v, bool) else v}"
        for arg, v in given.items()
    )
    model = settings.get("model_name_or_path") or "<your model>"
    line = f"vLLM engine settings of this trial: serve them with `trl vllm-serve --model {model} {flags}`"
    if server:
        return [line + " (with vllm_mode: server, as it ran)"]
    return [
        line + " and vllm_mode: server; TRL's colocate mode cannot pass them "
        "(grpo-sweep set them over TRL's own LLM(...) call, trial/backends/trl_vllm.py)"
    ]


def _notes(metrics: dict, settings: dict, config: dict | None = None) -> list[str]:
    """What a user must know to run the exported settings as the sweep measured them, one note each.

    Args:
        metrics: The trial's metrics.json.
        settings: The trainer settings the trial ran with.
        config: The trial's config.yaml, as a dict; None: unknown.

    Returns:
        The notes.
    """
    notes = []
    levers_steps = metrics.get("steps")
    notes.append(f"max_steps / num_train_epochs: yours to set (the sweep measured {levers_steps} steps)")
    lengths = metrics.get("prompt_lengths") or {}
    cut = lengths.get("cut") or 0
    if cut:
        notes.append(
            f"{cut} of {lengths.get('count')} prompts were longer than max_prompt_length={lengths.get('max_prompt_length')} "
            f"tokens (the longest {lengths.get('max')}) and the sweep cut them to it; TRL does not truncate prompts, so "
            "`trl grpo` trains them whole and its steps are longer than the ones measured: cut your data to "
            "max_prompt_length, or sweep again with max_prompt_length at least the longest prompt"
        )
    if settings.get("worst_case_lengths"):
        notes.append(
            f"the sweep measured the worst case: prompts padded to {settings.get('max_prompt_length')} tokens, every completion "
            "forced to max_completion_length; "
            + ("real steps on prompts no longer than that are at most as long" if cut else "real steps are at most as long")
        )
    selection = sorted(
        set(settings.get("grpo_config", {}).get("gradient_checkpointing_kwargs") or {}) & {"every_n_layers", "offload"}
    )
    if selection:
        notes.append(
            f"gradient_checkpointing_kwargs {', '.join(selection)}: TRL 1.16 turns checkpointing back on after each "
            "generation with the whole dict, which torch's checkpoint refuses; grpo-sweep passed these keys as "
            "transformers' Trainer does (trial/backends/transformers_patches.py keep_checkpointing_settings): "
            "stock trl grpo needs the same"
        )
    if metrics.get("device") == "cpu":
        notes.append("measured on CPU (bf16 off, as it ran); on a GPU you may set bf16: true")
        if settings.get("grpo_config", {}).get("use_vllm"):
            notes.append("vLLM ran from its CPU build with grpo-sweep's patches (trl_vllm.py); stock trl grpo runs vLLM on CUDA")
    return notes + engine_notes(config or {}, settings)


def _model_name(settings: dict) -> tuple[str | None, str | None]:
    """(model_name_or_path, a note when there is none to point at)."""
    name = settings.get("model_name_or_path")
    if name:
        return name, None
    model = settings.get("model") or {}
    return None, (
        f"model_name_or_path: REQUIRED: model={model.get('name')} ran as random weights built in memory "
        "(nothing saved to point at); give your model's hub id or local folder"
    )


def trl_yaml(metrics: dict, config: dict, *, sweep: str | None = None, trial: int | None = None, held: dict | None = None) -> str:
    """`trl grpo --config` YAML: ModelConfig, script (dataset, rewards) and GRPOConfig fields.

    Args:
        metrics: The trial's metrics.json.
        config: The trial's config.yaml, as a dict.
        sweep: The sweep's name.
        trial: The trial's number.
        held: The recipe the sweep held.

    Returns:
        The YAML text.
    """
    import yaml

    settings = metrics["trainer_settings"]
    name, model_note = _model_name(settings)
    out: dict[str, Any] = {"model_name_or_path": name}
    if settings.get("dtype"):
        out["dtype"] = settings["dtype"]
    lora = settings.get("lora")
    if lora:
        out.update(
            use_peft=True,
            lora_r=lora["r"],
            lora_alpha=lora["lora_alpha"],
            lora_dropout=lora["lora_dropout"],
            lora_target_modules=list(lora["target_modules"]),
            lora_task_type=lora.get("task_type") or "CAUSAL_LM",
        )
    else:
        out["use_peft"] = False
    quant = settings.get("quantization")
    out["load_in_4bit"] = bool(quant)
    if quant:
        out.update(
            bnb_4bit_quant_type=quant.get("bnb_4bit_quant_type"),
            use_bnb_nested_quant=bool(quant.get("bnb_4bit_use_double_quant")),
        )
    comments = [*header(metrics, config, sweep=sweep, trial=trial, held=held), "", "Run: trl grpo --config <this file>"]
    dataset = settings.get("dataset")
    if dataset:
        entry = {k: v for k, v in dataset.items() if k in ("path", "data_files", "split") and v is not None}
        out["datasets"] = [entry]
        if dataset.get("prompt_column") not in (None, "prompt"):
            comments.append(f"your prompt column is {dataset['prompt_column']!r}: TRL reads 'prompt'; rename it in your data")
    else:
        comments.append(
            f"task={settings.get('task')} is grpo-sweep's built-in task: add your data (datasets: [{{path: ..., split: train}}] "
            "or dataset_name:) and reward_funcs: [your_module.your_reward] before running"
        )
    if settings.get("reward_funcs"):
        out["reward_funcs"] = list(settings["reward_funcs"])
        comments.append(
            f"run it from {settings.get('cwd')}: trl grpo imports reward_funcs with the current directory on sys.path"
        )
    grpo = dict(settings["grpo_config"])
    out["output_dir"] = _output_dir(config, sweep, trial)
    out.update(grpo)
    if model_note:
        comments.append(model_note)
    comments += _notes(metrics, settings, config)
    return comment_block(comments) + yaml.safe_dump(out, sort_keys=False, default_flow_style=None)


def one_line(text: Any) -> str:
    """`text` on one line: every line break Python or YAML knows (\\n, \\r, \\x85, \\u2028, ...) becomes a space."""
    return " ".join(str(text).splitlines())


def comment_block(lines: list[str]) -> str:
    """`lines` as `#` comments, each cut to one line, so nothing in them becomes code or a YAML key."""
    return "".join(f"# {one_line(line)}\n" if line else "#\n" for line in lines)


def _output_dir(config: dict, sweep: str | None, trial: int | None) -> str:
    """The output_dir the exported files name: one folder under the user's working directory.

    Args:
        config: The trial's config.yaml, as a dict.
        sweep: The sweep's name; None: the trial's study.
        trial: The trial's number; None: the config's.

    Returns:
        The folder's name.
    """
    trial_cfg = config.get("trial") or {}
    label = trial if trial is not None else trial_cfg.get("number")
    name = f"grpo-{sweep or trial_cfg.get('study') or 'run'}" + (f"-trial{label}" if label is not None else "")
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)  # one folder under the user's working directory


def _call(name: str, kwargs: dict, indent: str = "    ") -> str:
    """`name(k=v, ...)`: each value by repr (a _Code as written); a key that is not a plain identifier
    as `**{'key': value}`.

    Args:
        name: The callable's name.
        kwargs: Its arguments.
        indent: The indent of each argument's line.

    Returns:
        The call's source text.
    """

    def arg(k: str, v: Any) -> str:
        value = v if isinstance(v, _Code) else repr(v)
        plain = k.isidentifier() and not keyword.iskeyword(k)
        return f"{k}={value}" if plain else f"**{{{k!r}: {value}}}"

    body = "".join(f"{indent}{arg(str(k), v)},\n" for k, v in kwargs.items())
    return f"{name}(\n{body})"


class _Code(str):
    """A value written as code (torch.bfloat16), not as its repr."""


def grpo_config_py(
    metrics: dict, config: dict, *, sweep: str | None = None, trial: int | None = None, held: dict | None = None
) -> str:
    """A short script building the same GRPOConfig, LoraConfig and BitsAndBytesConfig.

    Args:
        metrics: The trial's metrics.json.
        config: The trial's config.yaml, as a dict.
        sweep: The sweep's name.
        trial: The trial's number.
        held: The recipe the sweep held.

    Returns:
        The script's text.
    """
    settings = metrics["trainer_settings"]
    name, model_note = _model_name(settings)
    doc = comment_block(header(metrics, config, sweep=sweep, trial=trial, held=held) + [""] + _notes(metrics, settings, config))
    quant = settings.get("quantization")
    lora = settings.get("lora")
    grpo = {"output_dir": _output_dir(config, sweep, trial), **settings["grpo_config"]}
    if settings.get("dtype"):
        grpo["model_init_kwargs"] = {"dtype": settings["dtype"]}
    imports = ["import torch"] if quant else []
    imports += ["from peft import LoraConfig"] if lora else []
    imports += ["from transformers import BitsAndBytesConfig"] if quant else []
    lines = [PY_DOC.format(what="GRPOConfig, LoraConfig and BitsAndBytesConfig"), doc, *imports, "from trl import GRPOConfig", ""]
    lines.append(f"MODEL = {name!r}" + (f"  # {one_line(model_note)}" if model_note else ""))
    dataset = settings.get("dataset")
    if dataset:
        fields = {k: v for k, v in dataset.items() if k in ("path", "data_files", "split")}
        lines.append(f"DATASET = {fields!r}  # datasets.load_dataset(**DATASET)")
    if settings.get("reward_funcs"):
        lines.append(f"REWARD_FUNCS = {list(settings['reward_funcs'])!r}  # import paths")
    lines += ["", "training_args = " + _call("GRPOConfig", grpo)]
    if lora:
        lora_kwargs = {
            "r": lora["r"],
            "lora_alpha": lora["lora_alpha"],
            "lora_dropout": lora["lora_dropout"],
            "target_modules": list(lora["target_modules"]),
            "bias": lora.get("bias", "none"),
            "task_type": lora.get("task_type") or "CAUSAL_LM",
        }
        lines.append("peft_config = " + _call("LoraConfig", lora_kwargs))
    else:
        lines.append("peft_config = None  # every weight trained (trial.full_finetune)")
    if quant:
        qkw = dict(quant)
        if qkw.get("bnb_4bit_compute_dtype"):
            qkw["bnb_4bit_compute_dtype"] = _Code(f"torch.{qkw['bnb_4bit_compute_dtype']}")
        lines.append("quantization_config = " + _call("BitsAndBytesConfig", qkw))
    else:
        lines.append("quantization_config = None  # full-precision weights (load_in_4bit=false)")
    lines += [
        "",
        "# trainer = trl.GRPOTrainer(model=MODEL, reward_funcs=[...your functions...], args=training_args,",
        "#                           train_dataset=..., peft_config=peft_config, quantization_config=quantization_config)",
    ]
    return "\n".join(lines) + "\n"


def unsloth_py(
    metrics: dict, config: dict, *, sweep: str | None = None, trial: int | None = None, held: dict | None = None
) -> str | None:
    """backend=unsloth: FastLanguageModel.from_pretrained / get_peft_model as the trial called them, and the GRPOConfig.

    Args:
        metrics: The trial's metrics.json.
        config: The trial's config.yaml, as a dict.
        sweep: The sweep's name.
        trial: The trial's number.
        held: The recipe the sweep held.

    Returns:
        The script's text, or None for another backend.
    """
    settings = metrics["trainer_settings"]
    calls = settings.get("unsloth")
    if not calls:
        return None
    doc = comment_block(header(metrics, config, sweep=sweep, trial=trial, held=held) + [""] + _notes(metrics, settings, config))
    loaded = dict(calls["from_pretrained"])
    name, model_note = _model_name(settings)
    loaded["model_name"] = name if name else loaded.get("model_name")
    if loaded.get("dtype"):
        loaded["dtype"] = _Code(f"torch.{loaded['dtype']}")
    grpo = {"output_dir": _output_dir(config, sweep, trial), **settings["grpo_config"]}
    grpo["gradient_checkpointing"] = False  # Unsloth checkpoints through get_peft_model(use_gradient_checkpointing=...)
    lines = [
        PY_DOC.format(what="Unsloth's model and LoRA calls and the GRPOConfig"),
        doc,
        "from unsloth import FastLanguageModel  # first: Unsloth patches transformers and TRL on import",
        "",
        "import torch",
        "from trl import GRPOConfig",
        "",
        "model, tokenizer = FastLanguageModel." + _call("from_pretrained", loaded),
        "model = FastLanguageModel." + _call("get_peft_model", {"model": _Code("model"), **calls["get_peft_model"]}),
        "training_args = " + _call("GRPOConfig", grpo),
        "",
        "# trainer = trl.GRPOTrainer(model=model, processing_class=tokenizer, reward_funcs=[...],",
        "#                           args=training_args, train_dataset=...)",
    ]
    return "\n".join(lines) + "\n"


def export_trial(
    run_dir: str | Path,
    out_dir: str | Path,
    *,
    prefix: str = "best",
    sweep: str | None = None,
    held: dict | None = None,
    force: bool = False,
) -> list[Path]:
    """Write the files for the trial in `run_dir` into `out_dir`.

    A trial that did not finish `ok` is refused (ExportError) unless `force`; then every file says
    so at its top.

    Args:
        run_dir: The trial's folder.
        out_dir: Where the files are written.
        prefix: The file names' start.
        sweep: The sweep's name.
        held: The recipe the sweep held (best.yaml `recipe`), so each file names the concessions the
            trial took.
        force: Export a trial that did not finish `ok`.

    Returns:
        The files' paths.
    """
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    metrics, config = _load(run_dir)
    status = metrics.get("status")
    if status != Status.OK and not force:
        raise ExportError(
            f"{run_dir}: the trial ended {status} ({first_line(metrics.get('error'))}), so its numbers are not a "
            "finished trial's; export it anyway with --force (the files then say so)"
        )
    trial = (config.get("trial") or {}).get("number")
    texts = {
        "trl": trl_yaml(metrics, config, sweep=sweep, trial=trial, held=held),
        "python": grpo_config_py(metrics, config, sweep=sweep, trial=trial, held=held),
        "unsloth": unsloth_py(metrics, config, sweep=sweep, trial=trial, held=held),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for kind, text in texts.items():
        path = out_dir / FILES[kind].format(prefix=prefix)
        if text is None:
            continue
        write_atomic(path, text)
        written.append(path)
    return written


def trial_run_dir(sweep_dir: str | Path, number: int) -> Path:
    """Trial `number`'s run directory: from trials.csv, else the run directory whose config says so."""
    import csv

    import yaml

    sweep_dir = Path(sweep_dir)
    table = sweep_dir / "trials.csv"
    if table.exists():
        with open(table, newline="") as fh:
            for row in csv.DictReader(fh):
                if row.get("number") != str(number):
                    continue
                if row.get("run_dir"):
                    return Path(row["run_dir"])
                raise ExportError(
                    f"trial {number} in {table} never ran ({row.get('state')}, status {row.get('status') or '-'}): "
                    "it has no run directory to export"
                )
    for path in sorted(sweep_dir.glob("*/config.yaml")):
        if ((yaml.safe_load(path.read_text()) or {}).get("trial") or {}).get("number") == number:
            return path.parent
    raise ExportError(f"trial {number}: not found in {sweep_dir} (trials.csv, */config.yaml)")


def _best_yaml(sweep_dir: str | Path) -> dict | None:
    """The sweep's best.yaml, or None when it has none (a single run's directory, a sweep still running)."""
    import yaml

    path = Path(sweep_dir) / "best.yaml"
    return yaml.safe_load(path.read_text()) if path.exists() else None


def best_trial_number(sweep_dir: str | Path) -> int:
    if not Path(sweep_dir).is_dir():
        raise ExportError(f"{sweep_dir}: no such directory")
    best = _best_yaml(sweep_dir)
    if not best or best.get("best_trial") is None:
        raise ExportError(f"{Path(sweep_dir) / 'best.yaml'}: no best trial yet; name one with --trial N")
    return int(best["best_trial"])


def held_recipe(sweep_dir: str | Path) -> dict | None:
    """The recipe a sweep held (its best.yaml `recipe`), or None for a single run's directory."""
    import yaml

    try:
        best = _best_yaml(sweep_dir)
    except (OSError, yaml.YAMLError):
        return None
    return (best or {}).get("recipe") or None


def trl_yaml_for(
    metrics: dict, config: dict, version: str, *, sweep: str | None = None, trial: int | None = None, held: dict | None = None
) -> str:
    """trl_yaml with the setting names TRL `version` takes (config/trl_fields.json): a renamed field
    under its old name, a field that version lacks dropped, max_prompt_length written where its
    GRPOConfig has it; a comment for each change.

    Args:
        metrics: The trial's metrics.json.
        config: The trial's config.yaml, as a dict.
        version: The TRL version the file is for.
        sweep: The sweep's name.
        trial: The trial's number.
        held: The recipe the sweep held.

    Returns:
        The YAML text.
    """
    import yaml

    from ..config.trl_config import adapt, fields, source

    text = trl_yaml(metrics, config, sweep=sweep, trial=trial, held=held)
    comments = [line[2:] if line.startswith("# ") else "" for line in text.splitlines() if line.startswith("#")]
    out = yaml.safe_load(text)
    prompt = metrics["trainer_settings"].get("max_prompt_length")
    if prompt is not None and "max_prompt_length" in fields(version, grpo_only=True):
        out["max_prompt_length"] = prompt  # the prompt budget the sweep measured (TRL cuts prompts to it)
    out, notes = adapt(out, version)
    comments += [f"written for TRL {version} (its names from {source(version)})", *notes]
    head = "".join(f"# {line}\n" if line else "#\n" for line in comments)
    return head + yaml.safe_dump(out, sort_keys=False, default_flow_style=None)


def export_trl_version(
    run_dir: str | Path,
    out_dir: str | Path,
    version: str,
    *,
    prefix: str = "best",
    sweep: str | None = None,
    held: dict | None = None,
) -> Path:
    """Write `<prefix>.trl-<version>.yaml` (trl_yaml_for) for the trial in `run_dir`; returns its path.

    Args:
        run_dir: The trial's folder.
        out_dir: Where the file is written.
        version: The TRL version the file is for.
        prefix: The file name's start.
        sweep: The sweep's name.
        held: The recipe the sweep held.

    Returns:
        The file's path.
    """
    metrics, config = _load(Path(run_dir))
    trial = (config.get("trial") or {}).get("number")
    path = Path(out_dir) / f"{prefix}.trl-{version}.yaml"
    path.write_text(trl_yaml_for(metrics, config, version, sweep=sweep, trial=trial, held=held))
    return path
