"""mkdocs hook: nav entries for pages that other branches add (mkdocs.yml `extra.pending_pages`).

Until such a page exists in docs/, its nav entry is dropped (logged at info) so `mkdocs build --strict`
still passes; every other nav entry that names a missing page fails the build as usual. Once the pages
are merged, delete `extra.pending_pages`: then a missing one fails too.
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger("mkdocs.hooks.pending_pages")


def _prune(nav, missing: set[str]):
    if isinstance(nav, list):
        kept = [_prune(item, missing) for item in nav]
        return [item for item in kept if item is not None]
    if isinstance(nav, dict):
        ((title, value),) = nav.items()
        value = _prune(value, missing)
        return None if value is None or value == [] else {title: value}
    return None if nav in missing else nav


def on_config(config):
    pending = (config.get("extra") or {}).get("pending_pages") or []
    missing = {page for page in pending if not (Path(config["docs_dir"]) / page).exists()}
    if missing and config.get("nav"):
        log.info("pending pages not in docs/ yet, left out of the nav: %s", ", ".join(sorted(missing)))
        config["nav"] = _prune(config["nav"], missing)
    return config
