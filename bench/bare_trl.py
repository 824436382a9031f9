"""The same GRPO run as `python train.py ...`, written as a bare TRL script: no child process, no meter.

Inputs are identical (same model config, tokenizer, prompts, GRPOConfig arguments); only a
minimal callback records step boundaries, so bench/overhead.py can compare step times.
Prints one JSON line: {"step_times": [...]}.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def main(overrides: list[str]) -> None:
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from grpo_sweep.config.compose import compose_train_config
    from grpo_sweep.trial.backends.trl import grpo_args, lora_config
    from grpo_sweep.trial.models import load_model, load_tokenizer
    from grpo_sweep.trial.tasks import get_task

    cfg = compose_train_config(overrides)
    task = get_task(cfg)
    tokenizer = load_tokenizer(cfg, task.corpus())
    times: list[float] = []

    class StepClock(TrainerCallback):
        def on_step_begin(self, *args, **kwargs):
            self.t0 = time.perf_counter()

        def on_step_end(self, *args, **kwargs):
            times.append(time.perf_counter() - self.t0)

    with TemporaryDirectory() as out:
        trainer = GRPOTrainer(
            model=load_model(cfg, tokenizer, on_cuda=False),
            reward_funcs=list(task.reward_funcs),
            args=GRPOConfig(**grpo_args(cfg, on_cuda=False, output_dir=out)),
            train_dataset=task.dataset(tokenizer),
            processing_class=tokenizer,
            peft_config=lora_config(cfg),
            callbacks=[StepClock()],
        )
        trainer.remove_callback(PrinterCallback)
        trainer.train()
    print(json.dumps({"step_times": times}))


if __name__ == "__main__":
    main(sys.argv[1:])
