"""The warm embedded model (`model.init=warm`): a short supervised warm-up on the task's own text.

Random weights never write `<answer>N</answer>`: every reward is 0, every GRPO group has reward
std 0 and the policy gradient is zero. The warm-up teaches the format (and some answers) with
plain next-token training on `prompt + " <answer>N</answer>" + eos`, the loss on the completion
only; each example appears twice, once padded to `max_prompt_length` (worst-case trials) and once
unpadded. It is deterministic for a seed (seeded init, seeded data order, one thread) and cached
under $GRPO_SWEEP_CACHE/warm-models/, keyed by everything that changes the weights: architecture,
vocabulary, the examples, seed, prompt length and the recipe. A checkpoint directory, so loaders
that take a path (vLLM, Unsloth, 4-bit) get the same weights as `load_model` (models.model_path).
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any, Callable

RECIPE = 1  # bump when the warm-up code changes what it trains (old caches are then ignored)
INFO_FILE = "warmup.json"  # next to the weights: the recipe, steps, final loss, seconds


def training_rows(tokenizer, examples: list[tuple[str, str]], max_prompt_length: int) -> list[tuple[list[int], int]]:
    """(token ids, prompt length) per row: each example padded and unpadded, answer + eos after it.

    Args:
        tokenizer: The trial's tokenizer.
        examples: (question, answer) pairs.
        max_prompt_length: The prompt length rows are padded to.

    Returns:
        The rows.
    """
    from .tasks.base import INSTRUCTION, answer_text, fit_prompt

    rows = []
    for question, answer in examples:
        completion = tokenizer(answer_text(answer), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        for pad in (True, False):
            prompt = fit_prompt(INSTRUCTION + question, tokenizer, max_prompt_length, pad)
            ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            rows.append((ids + completion, len(ids)))
    return rows


def _batch(rows, pad_id: int):
    import torch

    width = max(len(ids) for ids, _ in rows)
    inputs = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)  # -100: no loss (prompt, padding)
    for i, (ids, n_prompt) in enumerate(rows):
        inputs[i, : len(ids)] = torch.tensor(ids)
        mask[i, : len(ids)] = 1
        labels[i, n_prompt : len(ids)] = torch.tensor(ids[n_prompt:])
    return inputs, mask, labels


def warm_up(model, tokenizer, examples, *, seed: int, steps: int, lr: float, batch_size: int, max_prompt_length: int) -> dict:
    """Train `model` (CPU, float32) in place; return steps, final loss, wall and CPU seconds.

    AdamW (betas 0.9/0.98) with linear decay to 10% of `lr`, gradient clipping at 1.0, one torch
    thread for the duration (deterministic, and fastest for a model this small).

    Args:
        model: The model, trained in place.
        tokenizer: The trial's tokenizer.
        examples: (question, answer) pairs.
        seed: The seed for the order and the initial state.
        steps: Optimiser steps.
        lr: The peak learning rate.
        batch_size: Rows per step.
        max_prompt_length: The prompt length rows are padded to.

    Returns:
        steps, final loss, wall and CPU seconds.
    """
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    try:
        torch.manual_seed(seed)
        order = torch.Generator().manual_seed(seed)
        rows = training_rows(tokenizer, examples, max_prompt_length)
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.0)
        model.train()
        perm, pos, loss = [], len(rows), float("nan")
        for step in range(steps):
            if pos + batch_size > len(rows):
                perm, pos = torch.randperm(len(rows), generator=order).tolist(), 0
            inputs, mask, labels = _batch([rows[i] for i in perm[pos : pos + batch_size]], tokenizer.pad_token_id)
            pos += batch_size
            for group in optimizer.param_groups:
                group["lr"] = lr * (1 - 0.9 * step / steps)
            out = model(input_ids=inputs, attention_mask=mask, labels=labels)
            optimizer.zero_grad(set_to_none=True)
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            loss = out.loss.item()
        model.eval()
    finally:
        torch.set_num_threads(threads)
    return {
        "steps": steps,
        "loss": loss,
        "rows": len(rows),
        "seconds": time.perf_counter() - wall0,
        "cpu_seconds": time.process_time() - cpu0,
    }


def warm_key(cfg: Any, tokenizer, examples) -> dict:
    """Everything that changes the warm weights.

    Args:
        cfg: The composed train config.
        tokenizer: The trial's tokenizer.
        examples: The warm-up's examples.

    Returns:
        The key, by field.
    """
    from omegaconf import OmegaConf

    def plain(node):
        return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else dict(node)

    arch = plain(cfg.model.arch)
    return {
        "recipe": RECIPE,
        "arch": arch,
        "positions": max(arch["max_position_embeddings"], cfg.max_seq_length),
        "vocab": sorted(tokenizer.get_vocab().items()),
        "special": [tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id],
        "examples": hashlib.sha256(json.dumps(examples).encode()).hexdigest(),
        "seed": cfg.seed,
        "max_prompt_length": cfg.max_prompt_length,
        "warmup": plain(cfg.model.warmup),
    }


def warm_model_dir(cfg: Any, tokenizer, examples, root: Path) -> Path:
    """The cache entry under `root` ($GRPO_SWEEP_CACHE, models.cache_root) for these weights.

    Args:
        cfg: The composed train config.
        tokenizer: The trial's tokenizer.
        examples: The warm-up's examples.
        root: The cache's root.

    Returns:
        The entry's folder.
    """
    key = json.dumps(warm_key(cfg, tokenizer, examples), sort_keys=True, default=str)
    return Path(root) / "warm-models" / f"{cfg.model.name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def materialize_warm(cfg: Any, tokenizer, *, build: Callable[[], Any], root: Path, log=print) -> Path:
    """The warm checkpoint for `cfg` (float32, with its tokenizer): built once, then reused
    (cache_entry.ensure: one builder, published only when complete).

    `build()` returns the seeded random-weight model in float32 on CPU (models.build_random) to
    start from, whatever model.dtype and the card say (loaders cast the saved float32 weights).

    Args:
        cfg: The composed train config.
        tokenizer: The trial's tokenizer.
        build: Returns the seeded random-weight model to start from.
        root: The cache's root.
        log: Prints a line about what happens.

    Returns:
        The checkpoint's folder.
    """
    from .cache_entry import ensure
    from .tasks import get_task

    examples = get_task(cfg).examples()
    target = warm_model_dir(cfg, tokenizer, examples, root)

    def write(tmp: Path) -> None:
        log(f"[warmup] building the warm {cfg.model.name} model ({cfg.model.warmup.steps} steps, once): {target}")
        model = build()
        w = cfg.model.warmup
        info = warm_up(
            model,
            tokenizer,
            examples,
            seed=cfg.seed,
            steps=int(w.steps),
            lr=float(w.lr),
            batch_size=int(w.batch_size),
            max_prompt_length=cfg.max_prompt_length,
        )
        info["recipe"] = RECIPE
        log(f"[warmup] done: loss {info['loss']:.3f} in {info['seconds']:.1f} s ({info['cpu_seconds']:.1f} s CPU)")
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / INFO_FILE).write_text(json.dumps(info, indent=2) + "\n")

    return ensure(target, write, log=log)


def warm_info(path: Path) -> dict:
    """The warm-up's record (steps, loss, seconds) saved beside a warm checkpoint."""
    return json.loads((Path(path) / INFO_FILE).read_text())
