"""The journal file: repaired when opened, appends cut back on a failed write, a dead holder's lock released.

A journal whose last record was cut short (a crash, a full disk mid-append) is repaired on open: a
timestamped backup is kept and only the torn tail is dropped (`repair_journal`). An append that
fails is cut back to the last whole record before the error is raised (`SafeJournalFileBackend`). A
lock left by a killed sweep of this host is released at once (`OwnedJournalFileLock`).
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import shutil
import socket
import uuid
from pathlib import Path
from typing import Any

from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock
from optuna.storages.journal._file import get_lock_file

from ..files import write_atomic

log = logging.getLogger(__name__)


def repair_journal(path: Path) -> str | None:
    """Repair a journal whose records were cut short; return the line printed, or None when intact.

    A record cut short is a last line without its newline (a crash or a full disk mid-append), or,
    once someone appended after it, a line that is not JSON. Torn bytes are dropped; where a whole
    record was appended right after a torn one (Optuna appends without repairing), that record is
    kept. The original is kept beside it as `<name>.torn-<UTC time>.bak`. Done under the journal's
    own lock file, so no worker appends meanwhile; dropping only the tail leaves what other workers
    already read where it was."""
    with get_lock_file(OwnedJournalFileLock(str(path))):
        data = path.read_bytes()
        kept, dropped, salvaged = [], 0, 0
        lines = data.splitlines(keepends=True)
        for line in lines:
            if line.endswith(b"\n") and _record(line):
                kept.append(line)
                continue
            rescued = _salvage(line)
            if rescued is not None:
                kept.append(rescued)
                salvaged += 1
                dropped += len(line) - len(rescued)
            else:
                dropped += len(line)
        if not dropped:
            return None
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S")
        backup = path.with_name(f"{path.name}.torn-{stamp}.bak")
        n = 1
        while backup.exists():
            n += 1
            backup = path.with_name(f"{path.name}.torn-{stamp}-{n}.bak")
        shutil.copy2(path, backup)
        write_atomic(path, b"".join(kept), durable=True)
    message = (
        f"Journal {path} repaired: dropped {dropped} torn bytes (a write cut short by a crash or a full disk), "
        f"kept {len(kept)} records{f' ({salvaged} recovered from behind the tear)' if salvaged else ''}; "
        f"the original is in {backup}"
    )
    log.warning("%s", message)
    return message


def _record(line: bytes) -> bool:
    try:
        return isinstance(json.loads(line), dict) and "op_code" in json.loads(line)
    except ValueError:
        return False


def _salvage(line: bytes) -> bytes | None:
    """The whole record appended right after a torn one on the same line, or None."""
    if not line.endswith(b"\n"):
        return None
    start = line.find(b'{"op_code"', 1)
    while start != -1:
        if _record(line[start:]):
            return line[start:]
        start = line.find(b'{"op_code"', start + 1)
    return None


class SafeJournalFileBackend(JournalFileBackend):
    """Optuna's file backend whose append never leaves half a record behind: a write that fails (a
    full disk, an I/O error) is cut back to where it started before the error is raised, so a retry
    (or the next run) appends onto whole records.

    Arguments as Optuna's `JournalFileBackend`: file_path, the journal file; lock_obj, its lock
    (`OwnedJournalFileLock` here)."""

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        with get_lock_file(self._lock):
            data = ("\n".join(json.dumps(entry, separators=(",", ":")) for entry in logs) + "\n").encode("utf-8")
            # Unbuffered: a buffered file would flush its leftover bytes again when closed.
            fd = os.open(self._file_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
            try:
                start = os.lseek(fd, 0, os.SEEK_END)
                try:
                    done = 0
                    while done < len(data):
                        done += os.write(fd, data[done:])
                    os.fsync(fd)
                except OSError:
                    try:
                        os.ftruncate(fd, start)  # freeing bytes works on a full disk too
                    except OSError:
                        pass  # repaired when the journal is next opened (repair_journal)
                    raise
            finally:
                os.close(fd)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True


class OwnedJournalFileLock(JournalFileOpenLock):
    """The journal's lock: Optuna's `open(O_EXCL)` lock file (NFS-safe), which also says who holds it.

    A sweep killed while it held the lock (SIGKILL, the OOM killer, mid-append) leaves the lock file
    behind, and Optuna's lock waits out its 30 s grace period before it takes the lock anyway: the
    resume stalled for 30 s. This lock writes `host pid` into the file it creates; a lock whose
    holder ran on this host and is gone is released at once, with a warning. A holder on another host,
    or one whose line is not written yet, keeps Optuna's grace period.

    Arguments as Optuna's `JournalFileOpenLock`: filepath, the journal file (the lock file is
    `<filepath>.lock`); grace_period, the seconds after which a lock whose holder is unknown is taken."""

    def acquire(self) -> bool:
        self._release_if_holder_gone()
        super().acquire()
        try:
            with open(self._lock_file, "w") as owner:
                owner.write(f"{socket.gethostname()} {os.getpid()}")
        except OSError:  # a full disk: the lock holds without its line (the grace period applies)
            pass
        return True

    def _release_if_holder_gone(self) -> None:
        try:
            held_by = Path(self._lock_file).read_text()
        except OSError:
            return  # free
        host, _, pid = held_by.partition(" ")
        if host != socket.gethostname() or not pid.isdigit() or _pid_alive(int(pid)):
            return
        taken = f"{self._lock_file}.{uuid.uuid4().hex}.gone"
        try:
            os.rename(self._lock_file, taken)  # atomic: one process takes it
        except OSError:
            return  # released or taken meanwhile
        try:
            if Path(taken).read_text() != held_by:  # a live holder's lock, taken since we read: give it back
                os.link(taken, self._lock_file)
                return
            log.warning("Journal lock %s was held by process %s of this host, which is gone: released", self._lock_file, pid)
        except OSError:
            pass
        finally:
            os.unlink(taken)
