"""grpo_optuna: a Hydra sweeper that runs GRPO trials under Optuna 5 with no-OOM as a constraint.

Select it with `hydra/sweeper=grpo_optuna` (the sweeps in sweeps/*.yaml do). Hydra imports every
module under `hydra_plugins` on every start, so nothing here imports optuna at module level.
"""
