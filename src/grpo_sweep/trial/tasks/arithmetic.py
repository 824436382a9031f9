"""The embedded default task: generated arithmetic with an exactly checkable answer."""

from __future__ import annotations

import random

from .base import Task


class ArithmeticTask(Task):
    def examples(self) -> list[tuple[str, str]]:
        rng = random.Random(self.cfg.seed)
        top = self.cfg.task.max_operand
        out = []
        for _ in range(self.cfg.task.num_prompts):
            a, b = rng.randint(0, top), rng.randint(0, top)
            op = rng.choice("+-*")
            value = a + b if op == "+" else a - b if op == "-" else a * b
            out.append((f"Question: what is {a} {op} {b}?\nAnswer:", str(value)))
        return out
