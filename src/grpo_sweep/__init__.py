"""grpo-sweep: find the fastest GRPO configuration that does not run out of GPU memory.

The flow, one module per concept:
    conf/ (Hydra) -> validate.validate -> trial.run_trial (parent) -> worker (child process:
    backends build the trainer, tasks supply prompts and rewards, meter measures) -> metrics.json
    -> consumers (sweeper plugin, W&B, report, doctor).
"""

__version__ = "0.1.0"

_API = ("estimate", "plan", "sweep", "Best")


def __getattr__(name: str):
    """grpo_sweep.estimate, .plan, .sweep and .Best (grpo_sweep.api), imported on first use: `import grpo_sweep` stays light."""
    if name in _API:
        from . import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
