"""What the tests share, beside the fixtures (tests/conftest.py keeps those and the xdist groups).

- `runners`: one family of runners for `python train.py ARGS` and `grpo-sweep ARGS`, all taking
  train.py's arguments: `train_here` (in the test process), `run_train` (a subprocess, waited for),
  `start_train` (a subprocess left running), `cli`; `sweep_args` builds a sweep's arguments.
- `config`: `compose`, the config train.py would see, composed once per process.
- `studies`: the Optuna studies a test opens, creates or polls.
- `sweeper`: the sweeper's parts set up without launching anything (a plan through build_plan).
- `data`, `cards`, `wandb_runs`: the user's data, the simulated cards, an offline W&B run read back.

A test module imports from here, never from conftest.py or another test module
(tests/test_suite.py holds that).
"""
