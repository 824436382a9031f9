"""Secrets never leave the process in clear, and W&B's online/offline choice (bottom layer).

One copy of each rule, used by the sweeper (storage URLs in logs, best.yaml, Hydra's saved
configs), the trial's W&B logger (its error lines) and the report (saving a W&B Report):
- `mask_url`: `postgresql://user:secret@host/db` -> `postgresql://user:***@host/db` (and
  `password=` query parameters);
- `redact`: the W&B API key and any storage password inside free text;
- `wandb_mode`: `logger.mode=auto` goes online only when an API key is configured.
"""

from __future__ import annotations

import netrc
import os
import re
from typing import overload
from urllib.parse import urlparse

_SECRET = re.compile(r"(://[^:/@\s]+:)([^@\s]*)(@)")
_SECRET_QUERY = re.compile(r"((?:password|passwd|pwd)=)([^&\s]*)", re.IGNORECASE)


@overload
def mask_url(url: str) -> str: ...
@overload
def mask_url(url: None) -> None: ...
@overload
def mask_url(url: str | None) -> str | None: ...
def mask_url(url: str | None) -> str | None:
    """A URL with its password replaced by `***` (userinfo and `password=` parameters)."""
    if url is None:
        return None
    return _SECRET_QUERY.sub(r"\1***", _SECRET.sub(r"\1***\3", str(url)))


def redact(text: str) -> str:
    """Free text (an error, a log line) with the W&B API key and any URL password masked."""
    key = os.environ.get("WANDB_API_KEY")
    text = text.replace(key, "***") if key else text
    return mask_url(text)


def wandb_key_configured() -> bool:
    """Whether W&B credentials exist (env or netrc), without reading the key into anything we log."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or ""
    path = os.environ.get("NETRC") or os.path.expanduser("~/.netrc")
    try:
        return bool(os.path.exists(path) and netrc.netrc(path).authenticators(host))
    except (OSError, netrc.NetrcParseError):
        return False


def wandb_mode(requested: str) -> tuple[str, str]:
    """(mode, why). `auto` honours WANDB_MODE, then goes online only when a key is configured."""
    if requested != "auto":
        return requested, f"logger.mode={requested}"
    env = (os.environ.get("WANDB_MODE") or "").lower()
    if env in ("online", "offline", "disabled"):
        return env, f"WANDB_MODE={env}"
    if env == "dryrun":
        return "offline", "WANDB_MODE=dryrun"
    if wandb_key_configured():
        return "online", "an API key is configured"
    return "offline", "no W&B API key configured (WANDB_API_KEY or ~/.netrc)"
