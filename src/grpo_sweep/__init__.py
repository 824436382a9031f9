"""grpo-sweep: find the fastest GRPO configuration that does not run out of GPU memory.

The flow, one module per concept:
    conf/ (Hydra) -> schema.validate -> trial.run_trial (parent) -> worker (child process:
    backends build the trainer, tasks supply prompts and rewards, meter measures) -> metrics.json
    -> consumers (sweeper plugin, W&B, report, doctor).
"""

__version__ = "0.1.0"
