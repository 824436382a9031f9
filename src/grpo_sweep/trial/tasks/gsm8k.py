"""GSM8K from the hub (real loading code; used on machines with hub access, not in CI)."""

from __future__ import annotations

from .base import Task


class Gsm8kTask(Task):
    def examples(self) -> list[tuple[str, str]]:
        from datasets import load_dataset

        name = self.cfg.task.dataset or "openai/gsm8k"
        data = load_dataset(name, "main", split=self.cfg.task.split)
        n = min(self.cfg.task.num_prompts, len(data))
        out = []
        for row in data.select(range(n)):
            answer = row["answer"].split("####")[-1].strip().replace(",", "")
            out.append((f"Question: {row['question']}\nAnswer:", answer))
        return out
