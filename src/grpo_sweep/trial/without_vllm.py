"""Imported first by the forkserver (trial.parent.PRELOAD), so that TRL loads there without vLLM;
and by any trial process of a backend without vLLM before TRL loads (backends.prepare_imports:
spawned trials, the ranks of a multi-process trial).

TRL imports vLLM whenever it is installed, even for `use_vllm=False` (trl/import_utils.py
`is_vllm_available` -> `importlib.util.find_spec("vllm")`): +3.7 s on every cold start of a plain
`trl` trial on a 2-core machine, and most of TRL's import time. A `None` entry in sys.modules makes
find_spec answer None and `import vllm` fail in this process and its forks only. The forkserver
serves `trl` trials; `trl_vllm` trials always start in a fresh interpreter (config/backends.py
`start_method="spawn"`), where vLLM loads normally.

Targets: TRL 1.16 `trl.import_utils.is_vllm_available`, which asks `importlib.util.find_spec`
(`_is_package_available`). Remove once TRL imports vLLM only when `use_vllm` is set.
"""

from __future__ import annotations

import sys

if "vllm" not in sys.modules:
    sys.modules["vllm"] = None  # type: ignore[assignment]
