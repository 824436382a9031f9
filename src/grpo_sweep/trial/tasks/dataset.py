"""task=dataset: the user's prompts, read with `datasets.load_dataset`, and the user's rewards.

The prompt column may hold text or a conversation (a list of {role, content} messages); either is
passed to GRPOTrainer as it is, so TRL formats conversations with the model's chat template and
hands the rewards conversational completions, exactly as under `trl grpo`. Every other column goes
to the reward functions as keyword arguments (TRL's convention). Worst-case lengths still apply:
a prompt longer than max_prompt_length is cut from the left of its text (the last user message of
a conversation, then the others when they alone are too long), and with trial.worst_case_lengths every prompt is padded to exactly
max_prompt_length tokens as TRL will tokenize it (template included). `prompt_lengths` records the
distribution before that (metrics.json).
"""

from __future__ import annotations

from typing import Any

from ...config.schema import ConfigError
from ...config.user_task import check_columns, load_args
from .base import FILLER, Task, fit_prompt, length_stats, prompt_tokens


def render(messages: list) -> str:
    """A conversation as the local tokenizer's chat template writes it (tokenizer.CHAT_TEMPLATE),
    for training that tokenizer before it exists."""
    return "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages) + "<|assistant|>\n"


def is_conversation(prompt: Any) -> bool:
    return isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt)


def fit_conversation(messages: list, tokenizer, max_len: int, pad: bool) -> list:
    """`fit_prompt` for a conversation: the last user message's text is cut or padded until the
    whole templated prompt is `max_len` tokens (or at most, without `pad`). When the other messages
    alone are over it (a long system message), they are cut from the left too, the first first: the
    prompt TRL tokenizes is then the length the estimate was made for.

    Args:
        messages: The conversation's {role, content} messages.
        tokenizer: The trial's tokenizer (its chat template).
        max_len: The templated prompt's length in tokens.
        pad: Pad up to exactly `max_len`.

    Returns:
        The messages.
    """
    messages = [dict(m) for m in messages]
    idx = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=len(messages) - 1)
    if not isinstance(messages[idx]["content"], str):
        return messages  # multimodal content: left as it is
    for _ in range(8):
        total = prompt_tokens(tokenizer, messages)
        if total == max_len or (total < max_len and not pad):
            break
        own = len(tokenizer(messages[idx]["content"], add_special_tokens=False)["input_ids"])
        target = own + (max_len - total)
        if target < 1:  # the other messages (a long system message) are over the budget on their own
            over = 1 - target  # tokens the others give up, so that the last user message keeps one
            for j, m in enumerate(messages):
                if over <= 0:
                    break
                if j == idx or not isinstance(m["content"], str) or not m["content"]:
                    continue
                n = len(tokenizer(m["content"], add_special_tokens=False)["input_ids"])
                keep = max(1, n - over)
                m["content"] = fit_prompt(m["content"], tokenizer, keep, False)  # cut from the left, the first first
                over -= n - keep
            if over > 0:  # the template alone is longer than max_prompt_length: keep one token of text
                messages[idx]["content"] = fit_prompt(messages[idx]["content"], tokenizer, 1, False)
                break
            continue
        messages[idx]["content"] = fit_prompt(messages[idx]["content"], tokenizer, target, pad)
    return messages


class DatasetTask(Task):
    reward_funcs = ()  # the user's: task.reward_funcs (required; config/user_task.py)

    def __init__(self, cfg: Any):
        super().__init__(cfg)
        self._rows = None

    def rows(self):
        """The first task.num_prompts rows, checked: the prompt column exists, there are rows."""
        if self._rows is not None:
            return self._rows
        from datasets import load_dataset

        task = self.cfg.task
        args = load_args(task)
        where = args.get("data_files") or args["path"]
        try:
            data = load_dataset(**args)
        except FileNotFoundError as err:
            raise ConfigError(f"task.path={task.path}: could not be loaded ({type(err).__name__}: {err})") from None
        except ConnectionError as err:
            raise ConfigError(
                f"task.path={task.path}: the Hub dataset could not be reached ({err}); run where huggingface.co is "
                "reachable, or save it locally and point task.path at the file or folder"
            ) from None
        except ValueError as err:
            if "split" in str(err).lower():
                raise ConfigError(f"task.split={task.split}: not a split of {where} ({err})") from None
            raise
        check_columns(where, data.column_names, len(data), task)
        self._rows = data.select(range(min(int(task.num_prompts), len(data))))
        return self._rows

    def _text(self, prompt: Any) -> str:
        return render(prompt) if is_conversation(prompt) else str(prompt)

    def answer_column(self) -> str | None:
        """The column the warm tiny model is warmed up to answer with (model.init=warm): `answer`,
        else `solution`, else the first other text column; None when there is none."""
        rows = self.rows()
        others = [c for c in rows.column_names if c != self.cfg.task.prompt_column]
        named = [c for c in ("answer", "solution") if c in others]
        text = [c for c in others if isinstance(rows[0][c], (str, int, float)) and not isinstance(rows[0][c], bool)]
        return (named or text or [None])[0]

    def examples(self) -> list[tuple[str, str]]:
        """(prompt text, answer) for the warm-up and the local tokenizer (answer_column, or empty)."""
        rows = self.rows()
        column, answer = str(self.cfg.task.prompt_column), self.answer_column()
        answers = rows[answer] if answer else [""] * len(rows)
        return [(self._text(p), str(a)) for p, a in zip(rows[column], answers)]

    def corpus(self) -> list[str]:
        rows = self.rows()
        texts = [q + " " + a + FILLER * 8 for q, a in self.examples()]  # the filler: worst-case padding
        for name in rows.column_names:  # the other text columns: what completions will be compared to
            if name != self.cfg.task.prompt_column and isinstance(rows[0][name], str):
                texts += [str(v) for v in rows[name]]
        return texts

    def dataset(self, tokenizer):
        max_len = self.cfg.max_prompt_length
        pad = self.cfg.trial.worst_case_lengths
        rows = self.rows()
        column = str(self.cfg.task.prompt_column)
        prompts = rows[column]
        self.prompt_lengths = length_stats([prompt_tokens(tokenizer, p) for p in prompts], max_len)
        fitted = [
            fit_conversation(p, tokenizer, max_len, pad) if is_conversation(p) else fit_prompt(str(p), tokenizer, max_len, pad)
            for p in prompts
        ]
        # TRL reads `prompt`: the prompt column becomes it (a different column of that name gives way)
        others = rows.remove_columns([c for c in dict.fromkeys((column, "prompt")) if c in rows.column_names])
        if not others.column_names:  # prompts only: no table is left to add the column to
            return type(rows).from_dict({"prompt": fitted})
        return others.add_column("prompt", fitted)
