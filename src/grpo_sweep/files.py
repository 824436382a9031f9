"""Writing a file so that a reader never sees half of it: the one atomic write.

The text goes to a temporary file beside the target, unique to this process and call, and then
replaces the target in one rename. A crash or a full disk leaves the old file whole. Two processes
writing the same file never share a temporary file; the last rename wins.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path


def write_atomic(path: str | Path, data: str | bytes, *, durable: bool = False) -> Path:
    """Replace `path` with `data` in one rename.

    Args:
        path: the file to write; its folder must exist.
        data: text (written as UTF-8) or bytes.
        durable: also fsync the data before the rename, so that it survives a power cut.

    Returns:
        The path written.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    raw = data.encode("utf-8") if isinstance(data, str) else data
    try:
        with open(tmp, "wb") as f:
            f.write(raw)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
