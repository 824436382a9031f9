"""A model cache entry ($GRPO_SWEEP_CACHE/random-models/<key>, warm-models/<key>): a checkpoint
directory that is complete or absent.

- **One builder.** An flock beside the entry: a process that finds it missing takes the lock,
  looks again, and builds only if it is still missing; the others wait for it, then read.
- **Visible only when complete.** The checkpoint is written into a temporary directory beside the
  entry; it must hold a checkpoint's parts (config.json, weights, tokenizer), and then its manifest
  (ENTRY_FILE: every file and its size) is written last and the directory renamed into place. A
  reader sees the whole entry or none of it.
- **Read only when complete.** `missing(entry)` checks the manifest and every file it lists at its
  size. An entry that fails (an older version's, without a manifest; one whose files were cut or
  removed) is moved aside with one log line and built again; it is never loaded.

`save_pretrained` writes nothing but on rank 0 once torch.distributed is initialised
(transformers' `should_save_on_this_rank`), so an entry built inside a rank other than 0 would lack
its config and weights. A multi-process trial's leader builds it before the ranks start
(models.prepare_checkpoint); the completeness check refuses what any other such build leaves.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

ENTRY_FILE = "entry.json"  # the manifest: written last, so its presence means the rest is there
WEIGHTS = ("model.safetensors", "model.safetensors.index.json")  # one of them (sharded: the index)
PARTS = ("config.json", "tokenizer_config.json")


class IncompleteCheckpoint(RuntimeError):
    """A build left a checkpoint without one of its parts; nothing was published."""


def missing(path: Path) -> list[str]:
    """What keeps `path` from being a complete entry: [] when it is one."""
    path = Path(path)
    try:
        manifest = json.loads((path / ENTRY_FILE).read_text())
        files = dict(manifest["files"])
    except FileNotFoundError:
        return [ENTRY_FILE]
    except (OSError, ValueError, KeyError, TypeError):
        return [f"{ENTRY_FILE} (unreadable)"]
    out = []
    for name, size in sorted(files.items()):
        try:
            if (path / name).stat().st_size != int(size):
                out.append(f"{name} (cut short)")
        except OSError:
            out.append(name)
    return out + _missing_parts(path)


def _missing_parts(path: Path) -> list[str]:
    out = [name for name in PARTS if not (path / name).is_file()]
    if not any((path / name).is_file() for name in WEIGHTS):
        out.append("the weights (model.safetensors)")
    return out


def _publish(tmp: Path, target: Path) -> None:
    """Check `tmp` holds a checkpoint, write its manifest (fsynced), rename it to `target`."""
    lacking = _missing_parts(tmp)
    if lacking:
        raise IncompleteCheckpoint(
            f"the checkpoint written for {target} lacks {', '.join(lacking)}: nothing was cached"
            " (transformers saves only on rank 0 of an initialised process group)"
        )
    files = {str(p.relative_to(tmp)): p.stat().st_size for p in sorted(tmp.rglob("*")) if p.is_file()}
    for name in files:
        with open(tmp / name, "rb") as handle:
            os.fsync(handle.fileno())
    manifest = tmp / ENTRY_FILE
    with open(manifest, "w") as handle:
        handle.write(json.dumps({"files": files}, indent=1, sort_keys=True) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    tmp.rename(target)


@contextlib.contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure(target: Path, write: Callable[[Path], None], *, log: Callable[[str], None] = print) -> Path:
    """`target`, complete: read as it is, or built once by `write(tmp_dir)` and published whole."""
    target = Path(target)
    if not missing(target):
        return target
    with _locked(target):
        lacking = missing(target)
        if not lacking:  # another process built it while this one waited
            return target
        for stale in target.parent.glob(f"{target.name}.tmp-*"):  # a build killed mid-write (we hold the lock)
            shutil.rmtree(stale, ignore_errors=True)
        if target.exists():
            aside = target.with_name(f"{target.name}.incomplete-{os.getpid()}")
            target.rename(aside)
            shutil.rmtree(aside, ignore_errors=True)
            log(f"[cache] {target} is incomplete (no {', '.join(lacking)}): building it again")
        tmp = Path(tempfile.mkdtemp(prefix=f"{target.name}.tmp-", dir=target.parent))
        try:
            write(tmp)
            _publish(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target
