"""What every task shares: answer extraction, the two rewards, and worst-case prompt padding."""

from __future__ import annotations

import re
from typing import Any

ANSWER_RE = re.compile(r"<answer>\s*(-?[\d,\.]+)\s*</answer>")
INSTRUCTION = "Think, then give the final number as <answer>N</answer>.\n"
FILLER = " ."  # one token in byte-level BPE vocabularies; pads prompts to their worst-case length


def answer_text(answer: str) -> str:
    """The well-formed completion for `answer` (the tokenizer corpus and the warm-up's target)."""
    return f" <answer>{answer}</answer>"


def extract_answer(text: str) -> str | None:
    match = ANSWER_RE.search(text)
    return match.group(1).replace(",", "") if match else None


def correctness_reward(completions: list[str], answer: list[str], **_: Any) -> list[float]:
    """1.0 when the number inside <answer>...</answer> equals the reference answer."""
    return [1.0 if extract_answer(c) == str(a) else 0.0 for c, a in zip(completions, answer)]


def format_reward(completions: list[str], **_: Any) -> list[float]:
    """0.2 for a well-formed <answer>N</answer>, regardless of correctness (shapes early training)."""
    return [0.2 if ANSWER_RE.search(c) else 0.0 for c in completions]


class Task:
    """Base task: subclasses provide `examples()` as (question, answer) pairs."""

    reward_funcs = (correctness_reward, format_reward)

    def __init__(self, cfg: Any):
        self.cfg = cfg
        self.prompt_lengths: dict | None = None  # set by dataset(): metrics.json prompt_lengths

    def rewards(self, clock) -> list:
        """The reward functions a trial trains with: task.reward_funcs (import paths) when given,
        else this task's own; each timed by `clock` (rewards.RewardClock)."""
        from .rewards import reward_functions

        return reward_functions([str(n) for n in self.cfg.task.get("reward_funcs") or []], self.reward_funcs, clock)

    def examples(self) -> list[tuple[str, str]]:
        raise NotImplementedError

    def corpus(self) -> list[str]:
        """Text for training a local tokenizer: prompts and well-formed answers."""
        return [INSTRUCTION + q + answer_text(a) + FILLER * 8 for q, a in self.examples()]

    def dataset(self, tokenizer):
        """Prompts for GRPOTrainer, padded to exactly max_prompt_length tokens when worst-case is on.

        Long prompts are cut from the left (keeping the question's end); TRL 1.16 no longer truncates.
        """
        from datasets import Dataset

        max_len = self.cfg.max_prompt_length
        pad = self.cfg.trial.worst_case_lengths
        rows = {"prompt": [], "answer": []}
        lengths = []
        for question, answer in self.examples():
            lengths.append(prompt_tokens(tokenizer, INSTRUCTION + question))
            rows["prompt"].append(fit_prompt(INSTRUCTION + question, tokenizer, max_len, pad))
            rows["answer"].append(answer)
        self.prompt_lengths = length_stats(lengths, max_len)
        return Dataset.from_dict(rows)


def prompt_tokens(tokenizer, prompt) -> int:
    """A prompt's length in tokens as TRL's GRPOTrainer tokenizes it: text as it is, a conversation
    (a list of {role, content}) through the chat template with the generation prompt."""
    if isinstance(prompt, str):
        return len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    text = tokenizer.apply_chat_template(list(prompt), tokenize=False, add_generation_prompt=True)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def length_stats(lengths: list[int], max_len: int) -> dict:
    """metrics.json prompt_lengths: the prompts' token counts before any cut or padding."""
    import statistics

    ordered = sorted(lengths)
    if not ordered:
        return {"count": 0}
    return {
        "count": len(ordered),
        "min": ordered[0],
        "median": statistics.median(ordered),
        "p95": ordered[min(len(ordered) - 1, max(0, -(-95 * len(ordered) // 100) - 1))],  # nearest rank
        "max": ordered[-1],
        "cut": sum(n > max_len for n in ordered),  # prompts cut to max_prompt_length
        "max_prompt_length": max_len,
    }


def fit_prompt(text: str, tokenizer, max_len: int, pad: bool) -> str:
    """Cut `text` to at most `max_len` tokens; with `pad`, prepend filler up to exactly `max_len`.

    Args:
        text: The prompt's text.
        tokenizer: The trial's tokenizer.
        max_len: The length in tokens.
        pad: Pad up to exactly `max_len`.

    Returns:
        The text.
    """
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) > max_len:
        return tokenizer.decode(ids[-max_len:])
    if not pad:
        return text
    padded = FILLER * (max_len - len(ids)) + text
    # Filler merges differently in some vocabularies: trim or extend until the count is exact.
    for _ in range(8):
        n = len(tokenizer(padded, add_special_tokens=False)["input_ids"])
        if n == max_len:
            break
        padded = padded[len(FILLER) :] if n > max_len else FILLER + padded
    return padded
