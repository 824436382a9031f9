"""A model cache entry ($GRPO_SWEEP_CACHE/random-models/<key>, warm-models/<key>): a checkpoint
directory that is complete or absent.

- **One builder.** An flock beside the entry: a process that finds it missing takes the lock,
  looks again, and builds only if it is still missing; the others wait for it, then read.
- **Visible only when complete.** The checkpoint is written into a temporary directory beside the
  entry; it must hold a checkpoint's parts (config.json, weights, tokenizer), and then its manifest
  (ENTRY_FILE: every file's size and sha256) is written last and the directory renamed into place.
  A reader sees the whole entry or none of it.
- **Read only when whole.** `missing(entry)` checks the manifest and every file it lists: its size,
  and its sha256 whenever the file's size, mtime or ctime differ from those recorded when its hash
  last matched (VERIFIED_FILE, written at publish and after each check that hashed), so an
  unchanged entry costs a stat per file. An entry that fails (an older version's, without a
  manifest or its hashes; one whose files were cut, overwritten or removed; a dangling link; an
  unreadable manifest) is moved aside to `<entry>.damaged-<n>`, kept for inspection, with one log
  line naming it and what was wrong, and built again; it is never loaded.
- **An unwritable cache is one line.** A cache that cannot be written (read-only, not a directory,
  full) ends the build with CacheUnwritable, whose message names GRPO_SWEEP_CACHE, its path and
  what to do. A complete entry in a read-only cache is still read.

`save_pretrained` writes nothing but on rank 0 once torch.distributed is initialised
(transformers' `should_save_on_this_rank`), so an entry built inside a rank other than 0 would lack
its config and weights. A multi-process trial's leader builds it before the ranks start
(models.prepare_checkpoint); the completeness check refuses what any other such build leaves.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable

ENTRY_FILE = "entry.json"  # the manifest: written last, so its presence means the rest is there
VERIFIED_FILE = "verified.json"  # per file: [size, mtime_ns, ctime_ns] when its sha256 last matched
WEIGHTS = ("model.safetensors", "model.safetensors.index.json")  # one of them (sharded: the index)
PARTS = ("config.json", "tokenizer_config.json")
# A write that fails with one of these failed for the cache's disk, not for the model being built.
_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS)


class IncompleteCheckpoint(RuntimeError):
    """A build left a checkpoint without one of its parts; nothing was published."""


class CacheUnwritable(RuntimeError):
    """The model cache cannot be written (read-only, not a directory, full): nothing was published."""


def _sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _stamp(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _manifest(path: Path) -> dict[str, tuple[int, str]]:
    """The manifest's files: name -> (size, sha256). ValueError says what is wrong with it."""
    try:
        files = json.loads((path / ENTRY_FILE).read_text())["files"]
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg})") from None
    except (KeyError, TypeError):
        raise ValueError("lists no files") from None
    if not isinstance(files, dict) or not files:
        raise ValueError("lists no files")
    out = {}
    for name, spec in files.items():
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise ValueError(f"a file outside the entry: {name!r}")
        if isinstance(spec, int) and not isinstance(spec, bool):
            raise ValueError("no content hashes (an older version's manifest)")
        if not isinstance(spec, dict):
            raise ValueError(f"{name}: {spec!r} is not a size and a sha256")
        size, digest = spec.get("size"), spec.get("sha256")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ValueError(f"{name}: size {size!r} is not a whole number of bytes")
        if not isinstance(digest, str) or len(digest) != 64:
            raise ValueError(f"{name}: sha256 {digest!r} is not a sha256")
        out[name] = (size, digest)
    return out


def _verified(path: Path) -> dict:
    try:
        verified = json.loads((path / VERIFIED_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return verified if isinstance(verified, dict) else {}


def _record_verified(path: Path, stamps: dict[str, list[int]]) -> None:
    """Write VERIFIED_FILE whole (a new file renamed over the old); a read-only entry keeps none."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{VERIFIED_FILE}.", dir=path)
    except OSError:
        return
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(json.dumps(stamps, sort_keys=True) + "\n")
        os.replace(tmp, path / VERIFIED_FILE)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def missing(path: Path) -> list[str]:
    """What keeps `path` from being a whole entry, one phrase per fault: [] when it is one."""
    path = Path(path)
    if not os.path.lexists(path):
        return [f"no {ENTRY_FILE}"]
    if not path.exists():
        return [f"a dangling link to {os.readlink(path)}"]
    if not path.is_dir():
        return ["not a directory"]
    try:
        files = _manifest(path)
    except FileNotFoundError:
        return [f"no {ENTRY_FILE}"]
    except OSError as exc:
        return [f"{ENTRY_FILE} unreadable ({exc.strerror})"]
    except ValueError as exc:
        return [f"{ENTRY_FILE}: {exc}"]
    verified, stamps, out = _verified(path), {}, []
    for name, (size, digest) in sorted(files.items()):
        try:
            st = (path / name).stat()
        except OSError:
            out.append(f"{name} missing")
            continue
        if st.st_size != size:
            out.append(f"{name} {'cut short' if st.st_size < size else 'grown'} ({st.st_size} bytes, not {size})")
            continue
        stamps[name] = _stamp(st)
        if verified.get(name) == stamps[name]:
            continue
        try:
            same = _sha256(path / name) == digest
        except OSError as exc:
            out.append(f"{name} unreadable ({exc.strerror})")
            continue
        if not same:
            out.append(f"{name} changed (its sha256 is not the one in {ENTRY_FILE})")
    out += _missing_parts(path)
    if not out and stamps != verified:
        _record_verified(path, stamps)
    return out


def _missing_parts(path: Path) -> list[str]:
    out = [f"no {name}" for name in PARTS if not (path / name).is_file()]
    if not any((path / name).is_file() for name in WEIGHTS):
        out.append("no weights (model.safetensors)")
    return out


def _publish(tmp: Path, target: Path) -> None:
    """Check `tmp` holds a checkpoint, write its manifest (fsynced) and what it verified, rename
    it to `target`."""
    lacking = _missing_parts(tmp)
    if lacking:
        raise IncompleteCheckpoint(
            f"the checkpoint written for {target} lacks {', '.join(n.removeprefix('no ') for n in lacking)}:"
            " nothing was cached (transformers saves only on rank 0 of an initialised process group)"
        )
    files, stamps = {}, {}
    for p in sorted(tmp.rglob("*")):
        if p.is_file():
            with open(p, "rb") as handle:
                os.fsync(handle.fileno())
            name = str(p.relative_to(tmp))
            files[name] = {"size": p.stat().st_size, "sha256": _sha256(p)}
            stamps[name] = _stamp(p.stat())
    manifest = tmp / ENTRY_FILE
    with open(manifest, "w") as handle:
        handle.write(json.dumps({"files": files}, indent=1, sort_keys=True) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    _record_verified(tmp, stamps)
    tmp.rename(target)


def _os_reason(exc: OSError) -> str:
    return f"{exc.strerror}: {exc.filename}" if exc.strerror and exc.filename else str(exc)


def _unwritable(target: Path, reason: str) -> CacheUnwritable:
    """The one-line error for a cache that cannot hold `target` (`<cache>/<kind>/<key>`)."""
    target = Path(target)
    return CacheUnwritable(
        f"GRPO_SWEEP_CACHE={target.parent.parent} cannot be written ({reason}): free space or make it"
        f" writable there, or set GRPO_SWEEP_CACHE to a writable folder (building {target.parent.name}/{target.name})"
    )


@contextlib.contextmanager
def _locked(path: Path):
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path.with_name(path.name + ".lock"), "w")
    except OSError as exc:
        raise _unwritable(path, _os_reason(exc)) from None
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _aside(target: Path) -> Path:
    """The first free `<entry>.damaged-<n>` (under the entry's lock: no other process picks it)."""
    n = 1
    while os.path.lexists(target.with_name(f"{target.name}.damaged-{n}")):
        n += 1
    return target.with_name(f"{target.name}.damaged-{n}")


def _disk_error(exc: BaseException | None) -> str | None:
    """The disk's reason when `exc` (or what caused it) is a full or read-only disk, else None.

    safetensors reports a failed write as SafetensorError with the OS's text, not as OSError."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in _DISK_ERRNOS:
            return _os_reason(exc)
        for code in _DISK_ERRNOS:
            if os.strerror(code) in str(exc):
                return os.strerror(code)
        exc = exc.__cause__ or exc.__context__
    return None


def ensure(target: Path, write: Callable[[Path], None], *, log: Callable[[str], None] = print) -> Path:
    """`target`, whole: read as it is, or built once by `write(tmp_dir)` and published whole.

    Args:
        target: The entry's folder.
        write: Builds the entry into the temporary folder it is given.
        log: Prints a line about what happens.

    Returns:
        `target`.
    """
    target = Path(target)
    if not missing(target):
        return target
    with _locked(target):
        lacking = missing(target)
        if not lacking:  # another process built it while this one waited
            return target
        try:
            for stale in target.parent.glob(f"{target.name}.tmp-*"):  # a build killed mid-write (we hold the lock)
                shutil.rmtree(stale, ignore_errors=True)
            if os.path.lexists(target):
                aside = _aside(target)
                target.rename(aside)
                log(f"[cache] {target}: {'; '.join(lacking)}; moved aside to {aside.name}, building it again")
            tmp = Path(tempfile.mkdtemp(prefix=f"{target.name}.tmp-", dir=target.parent))
        except OSError as exc:
            raise _unwritable(target, _os_reason(exc)) from None
        try:
            write(tmp)
            _publish(tmp, target)
        except Exception as exc:
            reason = _disk_error(exc)
            if reason is None:
                raise
            raise _unwritable(target, reason) from None
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target
