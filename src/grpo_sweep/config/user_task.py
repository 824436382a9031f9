"""The user's own data and reward functions (`task=dataset`, `task.reward_funcs`), checked before
anything loads, and the one mapping of `task.path` to `datasets.load_dataset` arguments.

Pure of torch: the sweep's parent runs these checks for every point. A local file is read with the
standard library (pyarrow for parquet) for its columns and row count; a reward function's module is
found without being imported (a module that imports TRL would import torch in the parent) and its
source is read for the name. A hub dataset, and a reward whose module is not plain Python source,
are checked again in the trial, still before the model loads (trial/tasks/dataset.py, rewards.py).
"""

from __future__ import annotations

import ast
import csv
import functools
import importlib.machinery
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any, cast

from ..units import MIB
from .schema import ConfigError

# task.path's file extension -> the `datasets` builder that reads it (as `trl grpo`'s `datasets:` takes).
BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
# `trl grpo --reward_funcs` names that are not import paths (trl/scripts/grpo.py reward_funcs_registry).
TRL_REWARDS = {
    "accuracy_reward": "trl.rewards.accuracy_reward",
    "reasoning_accuracy_reward": "trl.rewards.reasoning_accuracy_reward",
    "think_format_reward": "trl.rewards.think_format_reward",
}
DATASET_TARGET = "grpo_sweep.trial.tasks.dataset.DatasetTask"


def is_dataset_task(cfg: Any) -> bool:
    return str(cfg.task.get("_target_") or "") == DATASET_TARGET


def local_path(path: str) -> Path | None:
    """task.path as a local file or folder, or None for a hub id. A path that looks local (an
    extension we read, or starting with / . ~) but does not exist is an error, not a hub id."""
    candidate = Path(os.path.expanduser(path))
    if candidate.exists():
        return candidate.resolve()
    if candidate.suffix.lower() in BUILDERS or path.startswith(("/", ".", "~")):
        raise ConfigError(
            f"task.path={path}: no such file or folder (looked in {Path.cwd()}); "
            f"give a local {', '.join(BUILDERS)} file or folder, or a Hugging Face Hub dataset id"
        )
    return None


def load_args(task: Any) -> dict:
    """`datasets.load_dataset` keyword arguments for `task` (path, data_files, split): the one
    mapping, used by the trial and by the export's `datasets:` entry for `trl grpo`."""
    path = str(task.path)
    local = local_path(path)
    if local is not None and local.is_file():
        builder = BUILDERS.get(local.suffix.lower())
        if builder is None:
            raise ConfigError(f"task.path={path}: {local.suffix or 'no extension'}; allowed files: {', '.join(BUILDERS)}")
        return {"path": builder, "data_files": str(local), "split": str(task.split)}
    return {"path": str(local) if local is not None else path, "split": str(task.split)}


MAX_LINE = 16 * MIB  # a JSON line longer than this is refused: the check's memory is bounded by it
MAX_JSON_DOCUMENT = 256 * MIB  # a whole-file .json list is parsed at once: larger ones must be JSON lines


def _prompt_problem(value: Any) -> str | None:
    """What keeps `value` from being a prompt: text, or a conversation (a list of {role, content})."""
    if isinstance(value, str):
        return None
    if isinstance(value, list) and value and all(isinstance(m, dict) and {"role", "content"} <= set(m) for m in value):
        return None
    if isinstance(value, list):
        kinds = sorted({type(m).__name__ for m in value}) or ["nothing"]
        return f"a list of {', '.join(kinds)}"
    return f"a {type(value).__name__}"


def _check_prompt(where: str, row: int, record: Any, column: str) -> None:
    """Refuse a row that is not an object of columns, or whose prompt is neither text nor a conversation.

    Args:
        where: The file (and line), for the message.
        row: The row's number, from 1.
        record: The row as parsed.
        column: The prompt's column.
    """
    if not isinstance(record, dict):
        raise ConfigError(f"task.path={where}: row {row} is a JSON {type(record).__name__}, not an object of columns")
    if column in record:
        problem = _prompt_problem(record[column])
        if problem:
            raise ConfigError(
                f"task.prompt_column={column}: row {row} of {where} holds {problem}; a prompt is text or a "
                "conversation (a list of {role, content} messages)"
            )


def _json_lines(path: Path, column: str, check_rows: int) -> tuple[list[str], int]:
    """JSON lines, streamed: every line parsed (as datasets' json builder will), the first
    `check_rows` rows' prompts checked; a line over MAX_LINE bytes is refused, so memory stays bounded.

    Args:
        path: The JSON lines file.
        column: The prompt's column.
        check_rows: How many rows' prompts are checked.

    Returns:
        (the first row's column names, the number of rows).
    """
    columns: list[str] = []
    rows = 0
    with open(path, "rb") as fh:
        for number, line in enumerate(iter(lambda: fh.readline(MAX_LINE + 1), b""), start=1):
            if len(line) > MAX_LINE:
                raise ConfigError(f"task.path={path}: line {number} is longer than {MAX_LINE // MIB} MiB")
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError as err:
                raise ConfigError(f"task.path={path}: line {number} is not JSON ({err})") from None
            rows += 1
            if rows == 1:
                if not isinstance(record, dict):
                    raise ConfigError(
                        f"task.path={path}: line {number} is a JSON {type(record).__name__}, not an object of columns"
                    )
                columns = list(record)
            if rows <= check_rows:
                _check_prompt(f"{path} (line {number})", rows, record, column)
    return columns, rows


def _columns_and_rows(path: Path, column: str = "prompt", check_rows: int = 0) -> tuple[list[str], int]:
    """A local file's column names and number of rows, without `datasets` (no torch), read for real:
    a parse error names the file and its line, and the first `check_rows` prompts (the rows a trial
    uses) are checked for their type.

    Args:
        path: The data file (.parquet, .csv, .json or JSON lines).
        column: The prompt's column.
        check_rows: How many rows' prompts are checked.

    Returns:
        (the column names, the number of rows).
    """
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        meta = pq.ParquetFile(path)
        return list(meta.schema_arrow.names), meta.metadata.num_rows
    if suffix == ".csv":
        with open(path, newline="") as fh:
            reader = csv.reader(fh)
            try:
                header = next(reader, [])
                rows = sum(1 for row in reader if row)
            except csv.Error as err:
                raise ConfigError(f"task.path={path}: line {reader.line_num} is not CSV ({err})") from None
            return header, rows
    if suffix == ".json":
        with open(path, "rb") as fh:
            head = fh.read(64).lstrip()
        if head[:1] == b"[":  # one JSON list of records (else JSON lines, which datasets reads too)
            if path.stat().st_size > MAX_JSON_DOCUMENT:
                raise ConfigError(
                    f"task.path={path}: a single JSON list of {path.stat().st_size // MIB} MiB; "
                    f"give JSON lines (.jsonl, one object per line) above {MAX_JSON_DOCUMENT // MIB} MiB"
                )
            try:
                data = json.loads(path.read_bytes())
            except ValueError as err:
                raise ConfigError(f"task.path={path}: not JSON ({err})") from None
            if not isinstance(data, list) or (data and not isinstance(data[0], dict)):
                raise ConfigError(f"task.path={path}: a JSON list of objects (one per row) is needed")
            for row, record in enumerate(data[:check_rows], start=1):
                _check_prompt(str(path), row, record, column)
            return (list(data[0]) if data else []), len(data)
    return _json_lines(path, column, check_rows)


@functools.lru_cache(maxsize=16)
def _file_facts(path: str, mtime: float, size: int, column: str = "prompt", check_rows: int = 0) -> tuple[tuple[str, ...], int]:
    """`_columns_and_rows`, cached by the file's path, mtime and size; a read error is one ConfigError line.

    Args:
        path: The data file.
        mtime: Its modification time (part of the cache key).
        size: Its size in bytes (part of the cache key).
        column: The prompt's column.
        check_rows: How many rows' prompts are checked.

    Returns:
        (the column names, the number of rows).
    """
    try:
        columns, rows = _columns_and_rows(Path(path), column, check_rows)
    except ConfigError:
        raise
    except (ValueError, OSError, StopIteration) as err:  # UnicodeDecodeError is a ValueError
        raise ConfigError(f"task.path={path}: cannot be read ({type(err).__name__}: {err})") from None
    return tuple(columns), rows


def check_readable(path: Path, given: str) -> None:
    """A regular file with bytes in it, or a folder holding data files: never a special file
    (/dev/zero would be read forever, /dev/null is empty), an empty file or an empty folder."""
    import stat

    mode = path.stat().st_mode
    if stat.S_ISDIR(mode):
        if not any(p.suffix.lower() in BUILDERS for p in path.rglob("*") if p.is_file()):
            raise ConfigError(f"task.path={given}: the folder {path} holds no {', '.join(BUILDERS)} file")
        return
    if not stat.S_ISREG(mode):
        raise ConfigError(f"task.path={given}: {path} is not a regular file or folder (a device, pipe or socket)")
    if path.stat().st_size == 0:
        raise ConfigError(f"task.path={given}: {path} is empty (0 bytes)")
    if not os.access(path, os.R_OK):
        raise ConfigError(f"task.path={given}: {path} cannot be read (permission denied)")


def check_columns(where: str, columns: list[str] | tuple[str, ...], rows: int, task: Any) -> None:
    """The two dataset errors, one wording for the parent's check and the trial's.

    Args:
        where: The data's name, for the message.
        columns: The data's column names.
        rows: Its number of rows.
        task: The `task` config (its `prompt_column`).
    """
    column = str(task.prompt_column)
    if column not in columns:
        raise ConfigError(
            f"task.prompt_column={column}: no column {column!r} in {where} (its columns: {', '.join(columns) or 'none'})"
        )
    if rows == 0:
        raise ConfigError(f"task.path={task.path}: {where} is empty (0 rows, split {task.split})")


def check_dataset(cfg: Any) -> None:
    """task=dataset: a path is given; a local file exists, has the prompt column and rows."""
    task = cfg.task
    if not task.get("path"):
        raise ConfigError(
            "task.path=null: task=dataset needs your data: a local .jsonl/.json/.parquet/.csv file or folder, "
            "or a Hub dataset id (task.path=data/prompts.jsonl)"
        )
    if not task.get("reward_funcs"):
        raise ConfigError(
            "task.reward_funcs=[]: task=dataset needs your reward functions as import paths, the strings "
            "`trl grpo --reward_funcs` takes (task.reward_funcs=[my_rewards.accuracy])"
        )
    local = local_path(str(task.path))
    if local is not None:
        check_readable(local, str(task.path))
    args = load_args(task)
    data_file = args.get("data_files")
    if data_file is not None:
        stat = os.stat(data_file)
        column, check_rows = str(task.prompt_column), int(task.get("num_prompts") or 0)
        columns, rows = _file_facts(data_file, stat.st_mtime, stat.st_size, column, check_rows)
        check_columns(data_file, columns, rows, task)


def reward_path(name: str) -> str:
    """A `trl grpo --reward_funcs` string as an import path (TRL's built-in names mapped)."""
    return TRL_REWARDS.get(name, name)


def _find_module(module: str):
    """The module's spec without executing it or its parent packages; None when it does not exist.
    Searches the current directory first, as `trl grpo` does (it puts os.getcwd() on sys.path)."""
    parts = module.split(".")
    search = [os.getcwd(), *sys.path]
    spec = None
    for i, part in enumerate(parts):
        spec = importlib.machinery.PathFinder.find_spec(part if i == 0 else ".".join(parts[: i + 1]), search)
        if spec is None:
            already = sys.modules.get(".".join(parts[: i + 1]))
            return getattr(already, "__spec__", None)
        search = list(spec.submodule_search_locations or [])
        if i < len(parts) - 1 and not search:
            return None
    return spec


def _top_level_names(source: str) -> tuple[set[str], bool]:
    """Names a module defines at top level (inside top-level if/try blocks too), and whether they
    cannot be known from the source: a star import, a module `__getattr__`, or a module that
    replaces itself in sys.modules (lazy modules such as trl.rewards)."""
    names, unknown = set(), False
    body = list(ast.parse(source).body)
    while body:
        node = body.pop(0)
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            body += [*node.body, *getattr(node, "orelse", []), *getattr(node, "finalbody", [])]
            body += [stmt for handler in getattr(node, "handlers", []) for stmt in handler.body]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            unknown |= node.name == "__getattr__"
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
            unknown |= any(isinstance(t, ast.Subscript) for t in targets)  # sys.modules[__name__] = ...
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                unknown |= alias.name == "*"
                names.add((alias.asname or alias.name).split(".")[0])
    return names, unknown


def check_reward_funcs(cfg: Any) -> None:
    """Each task.reward_funcs entry names a module that exists and a function it defines; the
    weights, when given, one number per function."""
    funcs = [str(f) for f in (cfg.task.get("reward_funcs") or [])]
    for name in funcs:
        path = reward_path(name)
        module, _, attr = path.rpartition(".")
        if not module or not attr:
            raise ConfigError(
                f"task.reward_funcs: {name!r} is not an import path (module.function) nor one of TRL's "
                f"built-in rewards ({', '.join(TRL_REWARDS)})"
            )
        try:
            spec = _find_module(module)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            raise ConfigError(
                f"task.reward_funcs: {name!r}: no module named {module!r} (searched the current directory "
                f"{os.getcwd()} and sys.path, as `trl grpo` does)"
            )
        origin = getattr(spec, "origin", None)
        if origin and origin.endswith(".py") and os.path.exists(origin):
            try:
                names, star = _top_level_names(Path(origin).read_text())
            except SyntaxError as err:
                raise ConfigError(f"task.reward_funcs: {name!r}: {origin} does not parse: {err}") from None
            if attr not in names and not star:
                defined = sorted(n for n in names if not n.startswith("_"))
                raise ConfigError(
                    f"task.reward_funcs: {name!r}: {origin} defines no {attr!r} (it defines: {', '.join(defined) or 'nothing'})"
                )
    weights = cfg.task.get("reward_weights")
    if weights is not None:
        count = len(funcs) if funcs else None
        if any(isinstance(w, bool) or not isinstance(w, (int, float)) for w in weights):
            raise ConfigError(f"task.reward_weights={list(weights)}: must be numbers, one per reward function")
        if count is not None and len(weights) != count:
            raise ConfigError(
                f"task.reward_weights={list(weights)}: {len(weights)} weights for {count} reward functions "
                f"({', '.join(funcs)}); give one per function, or null for equal weights"
            )


def check_user_task(cfg: Any) -> None:
    """Everything about the user's data and rewards that can be checked here, before any model loads."""
    if is_dataset_task(cfg) or cfg.task.get("path"):
        check_dataset(cfg)
    check_reward_funcs(cfg)


@functools.lru_cache(maxsize=16)
def _fingerprint(path: str, stamp: tuple) -> str:
    """sha256 over a local file's bytes, or over a folder's files (relative name, then bytes, in name
    order), streamed in 1 MiB blocks: bounded memory whatever the size. `stamp` lists the files (name,
    mtime, size) and keys the cache, so a file edited in place is hashed again."""
    import hashlib

    root = Path(path)
    digest = hashlib.sha256()
    for name, _mtime, _size in stamp:
        file = Path(name)
        if file != root:
            digest.update(str(file.relative_to(root)).encode() + b"\0")
        with open(file, "rb") as handle:
            for block in iter(lambda: handle.read(MIB), b""):
                digest.update(block)
    return digest.hexdigest()


def task_identity(task: Any) -> dict:
    """What a study's trials learn from (the study's `task` identity, hydra_plugins identity.py): every
    task setting (its data, columns, reward functions and weights, how many prompts), and for a local
    file or folder its resolved path and a content fingerprint, so that other data under the same name,
    or the same file edited in place, is another study. A Hub dataset id is compared by its id."""
    from omegaconf import OmegaConf

    settings = cast(dict, OmegaConf.to_container(task, resolve=True)) if OmegaConf.is_config(task) else dict(task)
    out = {key: value for key, value in sorted(settings.items()) if key != "_target_"}
    out["target"] = settings.get("_target_")
    path = settings.get("path")
    if path:
        try:
            local = local_path(str(path))
        except ConfigError:  # the trial's pre-check names it; the identity keeps the path as given
            local = None
        if local is not None:
            files = [local] if local.is_file() else sorted(p for p in local.rglob("*") if p.is_file())
            stamp = tuple((str(f), (st := f.stat()).st_mtime_ns, st.st_size) for f in files)
            out["path"] = str(local)
            out["fingerprint"] = "sha256:" + _fingerprint(str(local), stamp)
    return out
