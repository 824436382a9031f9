"""grpo_optuna: a Hydra sweeper that runs GRPO trials under Optuna 5 with no-OOM as a constraint.

Select it with `hydra/sweeper=grpo_optuna` (the sweeps in sweeps/*.yaml do). Hydra imports every
module under `hydra_plugins` whose name does not start with `_` on every start, `python train.py`
included; the sweeper's modules import optuna there. That costs 0.33-0.36 s of a start (optuna
itself 0.14 s; Hydra's plugin scan, 2-core x86_64), against several seconds for torch in a trial.

The modules follow the sweep's phases. ARCHITECTURE.md's plugin section holds the same table, with
what each module holds; tests/test_docs.py checks that the two agree.

| phase | modules |
|---|---|
| plan | sweeper, plan, config, space, concessions |
| plan only | preview |
| open | opening, identity |
| start | start, forecast, compose |
| search loop | loop, lead, neighbours, progress |
| prepare | prepare |
| prescreen | prescreen, calibration |
| run | launch_config, workers |
| tell | tell, outcome, failures |
| confirmation | confirm, standings |
| soak | soak |
| summary / report | report, summary, tables |
| every phase | handles |
"""
