"""The user's data for the tests: a jsonl of sums, a reward module, the tiny model saved as a Hub model."""

from __future__ import annotations

import json
import random
from pathlib import Path

from helpers.config import compose

REWARDS = '''
def contains_solution(completions, solution, **kwargs):
    """1.0 when the reference solution (a dataset column, passed by TRL as a keyword) appears."""
    out = []
    for completion, answer in zip(completions, solution):
        text = completion if isinstance(completion, str) else completion[-1]["content"]
        out.append(1.0 if str(answer) in text else 0.0)
    return out


def brevity(completions, **kwargs):
    return [-len(c if isinstance(c, str) else c[-1]["content"]) / 1000 for c in completions]


def broken(completions, **kwargs):
    raise ZeroDivisionError("the user's reward divided by zero")
'''


def write_data(folder: Path, *, chat: bool, rows: int = 48) -> Path:
    """`rows` sums to answer (a prompt, or a chat when `chat`) with their solution, in `folder`, and the
    reward module my_rewards.py beside them: the jsonl's path."""
    rng = random.Random(0)
    path = folder / ("chat.jsonl" if chat else "prompts.jsonl")
    with open(path, "w") as fh:
        for _ in range(rows):
            a, b = rng.randint(0, 9), rng.randint(0, 9)
            question = f"What is {a} + {b}?" + " Think." * rng.randint(0, 40)  # some longer than max_prompt_length
            prompt = (
                [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": question}] if chat else question
            )
            fh.write(json.dumps({"prompt": prompt, "solution": str(a + b)}) + "\n")
    (folder / "my_rewards.py").write_text(REWARDS)
    return path


def dataset_overrides(path: Path, *rewards: str) -> list[str]:
    """The overrides that train on the jsonl at `path` with these reward functions (module.name)."""
    return ["task=dataset", f"task.path={path}", f"task.reward_funcs=[{','.join(rewards)}]"]


def save_tiny_model(folder: Path, corpus: list[str]) -> Path:
    """The tiny architecture (conf/model/tiny.yaml) with its locally trained tokenizer, saved where
    both the sweep (model=hub model.hub_id=<folder>) and `trl grpo` load it from."""
    from grpo_sweep.trial.models import build_random
    from grpo_sweep.trial.tokenizer import train_local_tokenizer

    cfg = compose(["model=tiny", "model.init=random", "max_seq_length=256"])
    tokenizer = train_local_tokenizer(corpus, vocab_size=cfg.model.arch.vocab_size)
    model = build_random(cfg, tokenizer, on_cuda=False)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
