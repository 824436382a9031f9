"""`grpo-sweep doctor`: explain an OOM message and print the smallest set of overrides that fits.

Input: the message users paste (a file, `-` for stdin) or a trial's metrics.json (its `error`, and
the config.yaml beside it), plus the config it ran with (Hydra overrides, as for train.py).

How it decides:
1. `parse_oom_message` gives what the message states (requested, free, total, KV cache, ...).
2. The estimator predicts the config's peak. When the message proves the run needed more than
   predicted (in use + requested > estimate), the gap is kept as *unexplained overhead* and added
   to every candidate, so a fix is never judged on a smaller need than the one observed.
3. If the failed allocation is a vocabulary-sized tensor (tokens x vocab x 2/4/8 bytes), the run
   materialised full logits (an older stack): the estimate uses logits_mode=full and the doctor
   reports whether upgrading to TRL >= 1.16's chunked head alone fixes it.
4. Each lever move (checkpointing, smaller micro-batch at the same generation batch, 4-bit, lower
   vLLM share, smaller rank, shorter sequences) is scored by GiB freed and the throughput it costs
   (throughput.relative_step_time, one rank's: N cards are never counted N times faster, so the
   fewest cards that fit win), and ranked by GiB per % of speed lost.
5. The smallest change set that fits with >= 5 % headroom (the fastest among equally small ones)
   is printed as Hydra overrides, and a faster larger set when there is one. Shorter sequences
   change the experiment, so they are used only when nothing else fits. `--verify` runs a real trial with them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, fields
from typing import Any

from ..config.model_arch import arch_of
from ..units import GIB as GiB
from . import estimator as est_mod
from . import throughput
from .moves import Move, candidate_moves, with_overrides

HEADROOM = 0.05


def infer_logits_mode(parsed: dict, cfg: Any) -> str | None:
    """'full' when the failed allocation is a whole (tokens x vocab) tensor of 2, 4 or 8 bytes per
    element for this config's batch and lengths: only a materialised logits tensor has that size."""
    req = parsed.get("requested_bytes")
    if not req:
        return None
    B, S, P = cfg.per_device_train_batch_size, cfg.max_seq_length, cfg.max_prompt_length
    C = S - P
    V = arch_of(cfg).vocab_size  # conf/model, or the model's config.json
    for tokens in (B * S, B * (S - 1), B * C, B * (C + 1)):
        for nbytes in (2, 4, 8):
            if abs(req / (tokens * V * nbytes) - 1) < 0.01:
                return "full"
    return None


def vllm_limits(cfg: Any, parsed: dict, base) -> tuple[float, float]:
    """Bounds on gpu_memory_utilization that a vLLM start-up error proves, whatever the estimate says.

    KV cache too small (any of vLLM's wordings): the share must grow, by at least 0.05, and by the KV
    shortfall where the message states sizes (vLLM counts one max-length request, and one is all it
    needs to start: holding the whole generation batch is a speed question, `speed_advice`). On
    vLLM's CPU build a negative KV share says the share is that much below what the process already
    holds, plus one sequence's KV. Free memory below the desired share: the share must fit in what
    was free at start-up. Both rounded to 0.05 (inwards).

    Args:
        cfg: The composed train config.
        parsed: The parsed error message (oom_message.parse_oom_message).
        base: The estimate at the config as it ran.

    Returns:
        (the least, the greatest) gpu_memory_utilization the message allows.
    """
    import math

    budget = base.budget_bytes or parsed.get("total_bytes")
    lo, hi = 0.0, 1.0
    if not budget:
        return lo, hi
    util = cfg.gpu_memory_utilization
    one_sequence = base.assumptions.get("kv_cache_needed_bytes") or 0  # vLLM's start-up minimum (estimator)
    needed, available = parsed.get("kv_cache_needed_bytes"), parsed.get("kv_cache_available_bytes")
    if parsed.get("kv_cache_too_small") or (needed is not None and available is not None):
        extra, scale = 0, budget
        if needed is not None and available is not None:
            extra = max(needed - available, 0) + max(one_sequence - needed, 0)
        elif (parsed.get("kv_cache_requested_bytes") or 0) < 0:
            extra = -parsed["kv_cache_requested_bytes"] + one_sequence
            scale = parsed.get("total_bytes") or budget  # the share is of what vLLM sees (the node)
        lo = min(math.ceil((util + extra / scale) * 20 - 1e-9) / 20, 0.95)
        lo = max(lo, round(util + 0.05, 2))
    if parsed.get("desired_bytes") is not None and parsed.get("free_bytes") is not None:
        hi = math.floor(parsed["free_bytes"] / (parsed.get("total_bytes") or budget) * 20) / 20
    return lo, hi


def _valid(cfg: Any, device: str) -> bool:
    from ..config.schema import ConfigError
    from ..config.validate import validate

    try:
        validate(cfg, cuda=device == "cuda")  # advice for the target machine: no local package check
        return True
    except ConfigError:
        return False


@dataclass
class Scored:
    """One set of overrides judged: its estimate, its need (the estimate + what the message proves
    beyond it), whether it fits, what it costs in throughput and what it frees."""

    estimate: est_mod.Estimate
    need: int
    fits: bool
    speed_cost_pct: float
    saving: int


@dataclass
class _Judge:
    """Scores overrides against the OOM's config: what each needs and costs, and whether it fits.

    cfg: the config that ran out of memory; base: its estimate; mode: the logits mode every
    estimate uses; unexplained: bytes the message proves beyond the estimate, added to every need;
    limit: the card with HEADROOM kept free (None: no budget known); util_min, util_max: the
    gpu_memory_utilization a vLLM error allows (`vllm_limits`)."""

    cfg: Any
    base: est_mod.Estimate
    mode: str
    unexplained: int
    limit: int | None
    util_min: float
    util_max: float

    device: str = field(init=False)  # the estimate's: the card the advice is for
    base_speed: float = field(init=False)  # one rank's tokens/s as the config stands

    def __post_init__(self) -> None:
        self.device = self.base.assumptions["device"]
        self.base_speed = throughput.relative_step_time(self.cfg, self.mode)["rank_tokens_per_s"]

    def score(self, overrides: dict) -> Scored | None:
        """None when the overrides make a config `validate` refuses."""
        new = with_overrides(self.cfg, overrides)
        if not _valid(new, self.device):
            return None
        e = est_mod.estimate(new, self.mode)
        speed = throughput.relative_step_time(new, self.mode)["rank_tokens_per_s"]
        need = e.total_bytes + self.unexplained
        ok = self.limit is not None and need <= self.limit and e.kv_cache_ok is not False and e.fits
        ok = ok and self.util_min - 1e-9 <= new.gpu_memory_utilization <= self.util_max + 1e-9
        return Scored(
            estimate=e,
            need=need,
            fits=ok,
            speed_cost_pct=100 * (1 - speed / self.base_speed),
            saving=self.base.total_bytes - e.total_bytes,
        )


@dataclass
class Diagnosis:
    """The doctor's answer as data (`to_dict` is `grpo-sweep doctor --json`'s shape).

    parsed: what the message states; deficit_bytes: how far short the run was (None: unknown);
    overrides: the smallest change set that fits, as Hydra overrides ([] when none fits or none is
    needed); fits_after: a change set (possibly empty) fits; fits_as_is: the config fits unchanged;
    estimate: the config's estimate (`Estimate.to_dict`); logits_mode and its source;
    observed_need_bytes: in use + requested, what the message proves (None: not stated);
    unexplained_bytes: what that proves beyond the estimate; limit_bytes: the card less HEADROOM;
    levers: one row per move, ranked; stack_upgrade: what TRL's chunked head would free (full logits
    only); fragmentation: `fragmentation_advice`; speed: `speed_advice`; after: the chosen set's
    need and cost; fastest: a faster, larger set, when there is one; verify: the CLI's real trial."""

    parsed: dict
    deficit_bytes: int | None
    overrides: list[str]
    fits_after: bool
    fits_as_is: bool
    estimate: dict
    logits_mode: str
    logits_mode_source: str
    observed_need_bytes: int | None
    unexplained_bytes: int
    limit_bytes: int | None
    levers: list[dict]
    stack_upgrade: dict | None
    fragmentation: dict | None
    speed: dict | None
    after: dict | None = None
    fastest: dict | None = None
    verify: dict | None = None

    def to_dict(self) -> dict:
        """Every field; after, fastest and verify only when set."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for key in ("after", "fastest", "verify"):
            if out[key] is None:
                del out[key]
        return out


def diagnose(cfg: Any, parsed: dict, logits_mode: str | None = None) -> Diagnosis:
    """The doctor's answer: parsed message, deficit, ranked levers, chosen overrides (module
    docstring: how it decides).

    Args:
        cfg: The composed train config the message came from.
        parsed: The parsed error message (oom_message.parse_oom_message).
        logits_mode: The estimator's logits mode; None: what the backend does.

    Returns:
        The Diagnosis.
    """
    if cfg.gpu.get("memory_gib") is None and parsed.get("total_bytes"):
        cfg = with_overrides(cfg, {"gpu.memory_gib": parsed["total_bytes"] / GiB})
    mode_source = "given" if logits_mode else None
    if logits_mode is None:
        logits_mode = infer_logits_mode(parsed, cfg)
        mode_source = "inferred from the failed allocation (a tokens x vocab tensor)" if logits_mode else None
    base = est_mod.estimate(cfg, logits_mode)
    mode = base.assumptions["logits_mode"]
    observed = observed_need(parsed)
    unexplained = unexplained_bytes(parsed, base, observed)
    budget = base.budget_bytes
    limit = None if budget is None else int(budget * (1 - HEADROOM))
    deficit = parsed.get("deficit_bytes")
    if deficit is None and budget is not None:
        deficit = max(0, base.total_bytes + unexplained - budget)
    util_min, util_max = vllm_limits(cfg, parsed, base)
    judge = _Judge(cfg, base, mode, unexplained, limit, util_min, util_max)
    moves = candidate_moves(cfg, base.assumptions["backend"], judge.device)
    if util_min > cfg.gpu_memory_utilization or util_max < cfg.gpu_memory_utilization:
        moves = [m for m in moves if m.group != "vllm_share"] + allowed_shares(cfg, util_min, util_max)
    chosen, fastest = smallest_fix(moves, judge) if limit is not None else (None, None)
    return Diagnosis(
        parsed=parsed,
        deficit_bytes=deficit,
        overrides=_fmt(chosen[0]) if chosen else [],
        fits_after=chosen is not None,
        # The estimate (with what the message proves beyond it) fits as the config stands: no change.
        fits_as_is=chosen is not None and not chosen[0],
        estimate=base.to_dict(),
        logits_mode=mode,
        logits_mode_source=mode_source or base.assumptions["logits_mode_source"],
        observed_need_bytes=observed,
        unexplained_bytes=unexplained,
        limit_bytes=limit,
        levers=lever_rows(moves, judge),
        stack_upgrade=stack_upgrade(cfg, base, mode, unexplained, limit),
        fragmentation=fragmentation_advice(parsed, cfg),
        speed=speed_advice(cfg, base, mode),
        after=None if not chosen else _after(chosen[1]),
        fastest=None if not (chosen and fastest) else _faster(chosen[1], fastest),
    )


def observed_need(parsed: dict) -> int | None:
    """What the message proves the run needed: in use + requested (None: the message lacks them).
    In use is the process's own figure, else the card's total less what was free."""
    if parsed.get("requested_bytes") is None:
        return None
    in_use = parsed.get("process_in_use_bytes")
    if in_use is None and parsed.get("total_bytes") is not None and parsed.get("free_bytes") is not None:
        in_use = parsed["total_bytes"] - parsed["free_bytes"]
    return None if in_use is None else in_use + parsed["requested_bytes"]


def unexplained_bytes(parsed: dict, base: est_mod.Estimate, observed: int | None) -> int:
    """Bytes the message proves beyond the estimate, kept in every candidate: the observed need
    over the estimate, and at a vLLM start-up whatever was in use beyond the trainer's weights and
    CUDA context (often another process), which stays in use.

    Args:
        parsed: The parsed error message.
        base: The estimate at the config as it ran.
        observed: The need the message states, in bytes, or None.

    Returns:
        The bytes every candidate keeps on top of its estimate.
    """
    unexplained = max(0, observed - base.total_bytes) if observed is not None else 0
    if parsed.get("desired_bytes") is not None and parsed.get("free_bytes") is not None and parsed.get("total_bytes"):
        before_vllm = base.components["weights"] + base.components["cuda_context"]
        unexplained = max(unexplained, parsed["total_bytes"] - parsed["free_bytes"] - before_vllm)
    return unexplained


def allowed_shares(cfg: Any, util_min: float, util_max: float) -> list[Move]:
    """When a vLLM error bounds gpu_memory_utilization: every allowed value in 0.05 steps, nearest
    to the current one first (equal cost: the search keeps the first, i.e. the least change).

    Args:
        cfg: The composed train config.
        util_min: The least share the message allows.
        util_max: The greatest share the message allows.

    Returns:
        One move per allowed share.
    """
    # The steps are counted with round(), not int(): (0.95 - 0.75) / 0.05 is 3.9999999999999996.
    if util_min > cfg.gpu_memory_utilization:
        utils = [round(util_min + 0.05 * i, 2) for i in range(round((0.95 - util_min) / 0.05) + 1)]
    else:
        utils = [round(util_max - 0.05 * i, 2) for i in range(round((util_max - 0.1) / 0.05) + 1)]
    return [
        Move(
            "vllm_share",
            {"gpu_memory_utilization": util},
            f"vLLM share {cfg.gpu_memory_utilization} -> {util} (within what the vLLM error allows)",
        )
        for util in utils
    ]


def lever_rows(moves: list[Move], judge: _Judge) -> list[dict]:
    """One row per move the config allows, ranked: knobs on one card first, then more hardware,
    then recipe changes; within each, by GiB freed per % of throughput lost (a free move first).
    Of the vLLM shares only the nearest and the farthest are listed, not every 0.05 step."""
    rows: list[dict[str, Any]] = []
    shares = [m for m in moves if m.group == "vllm_share"]
    for move in moves:
        if move.group == "vllm_share" and move not in (shares[0], shares[-1]):
            continue
        scored = judge.score(move.overrides)
        if scored is None:
            continue
        cost = scored.speed_cost_pct
        rows.append(
            {
                "lever": move.label,
                "overrides": _fmt(move.overrides),
                "saving_bytes": int(scored.saving),
                "speed_cost_pct": round(cost, 1),
                "gib_per_pct": None if cost <= 0.05 else scored.saving / GiB / cost,
                "changes_experiment": move.changes_experiment,
                "needs_hardware": move.needs_hardware,
            }
        )
    rows.sort(
        key=lambda r: (
            r["changes_experiment"],
            r["needs_hardware"],
            -(r["gib_per_pct"] if r["gib_per_pct"] is not None else 1e9 * (r["saving_bytes"] > 0)),
            r["lever"],
        )
    )
    return rows


Fix = tuple[dict, Scored]  # a change set that fits (overrides by key) and its score


def smallest_fix(moves: list[Move], judge: _Judge) -> tuple[Fix | None, Fix | None]:
    """The smallest set of moves (one per group) that fits, the fastest among equally small ones,
    and the fastest set of any size; (None, None) when nothing fits. One card with the recipe as
    it is first; then more hardware (GPUs, vLLM's own GPU); then recipe changes (shorter sequences)."""
    groups: dict[str, list[Move]] = {}
    for move in moves:
        groups.setdefault(move.group, []).append(move)
    for allow_experiment, allow_hardware in ((False, False), (False, True), (True, True)):
        usable = [
            g
            for g in groups
            if (allow_experiment or not groups[g][0].changes_experiment) and (allow_hardware or not groups[g][0].needs_hardware)
        ]
        by_size: dict[int, Fix] = {}
        for size in range(len(usable) + 1):
            for combo in itertools.combinations(usable, size):
                for picks in itertools.product(*(groups[g] for g in combo)):
                    overrides: dict = {}
                    for move in picks:
                        overrides.update(move.overrides)
                    scored = judge.score(overrides)
                    if not (scored and scored.fits):
                        continue
                    best = by_size.get(size)
                    if best is None or scored.speed_cost_pct < best[1].speed_cost_pct:
                        by_size[size] = (overrides, scored)
        if by_size:
            return by_size[min(by_size)], min(by_size.values(), key=lambda c: c[1].speed_cost_pct)
    return None, None


def _after(scored: Scored) -> dict:
    return {
        "total_bytes": scored.estimate.total_bytes,
        "need_bytes": scored.need,
        "speed_cost_pct": round(scored.speed_cost_pct, 1),
    }


def _faster(chosen: Scored, fastest: Fix) -> dict | None:
    """The fastest set, when it is more than half a percent faster than the smallest one."""
    overrides, scored = fastest
    if scored.speed_cost_pct >= chosen.speed_cost_pct - 0.5:
        return None
    return {"overrides": _fmt(overrides), "need_bytes": scored.need, "speed_cost_pct": round(scored.speed_cost_pct, 1)}


def stack_upgrade(cfg: Any, base: est_mod.Estimate, mode: str, unexplained: int, limit: int | None) -> dict | None:
    """With full logits (an older stack): what TRL >= 1.16's chunked LM head would free, and whether
    that alone fits. None when the chunked head is what runs already.

    Args:
        cfg: The composed train config.
        base: The estimate at the config as it ran.
        mode: The logits mode that ran ("full" or "chunked").
        unexplained: Bytes the message proves beyond the estimate.
        limit: The card's usable bytes, or None.

    Returns:
        What the chunked head frees and whether it fits, or None.
    """
    if mode != "full":
        return None
    chunked = est_mod.estimate(cfg, "chunked")
    return {
        "saving_bytes": base.total_bytes - chunked.total_bytes,
        "fits": limit is not None and chunked.total_bytes + unexplained <= limit,
        "what": "upgrade to TRL >= 1.16 (chunked fused LM head) or Unsloth: no throughput cost",
    }


def speed_advice(cfg: Any, base, mode: str) -> dict | None:
    """A SPEED suggestion, never a memory fix: when vLLM's KV cache holds fewer sequences than the
    generation batch (the estimator's `generation_waves` > 1), the least 0.05 step up of
    gpu_memory_utilization whose cache holds the whole batch and whose memory still fits, with the
    throughput it would gain (memory/throughput.py charges the waves). None when generation already
    runs in one wave or no share up to 0.95 gives both.

    Args:
        cfg: The composed train config.
        base: The estimate at the config as it ran.
        mode: The logits mode.

    Returns:
        The share that holds the whole batch and its gain, or None.
    """
    waves = base.assumptions.get("generation_waves") or 1
    if waves <= 1 or not base.kv_cache_ok:
        return None
    before = throughput.relative_step_time(cfg, mode)["rank_tokens_per_s"]
    util = round(cfg.gpu_memory_utilization + 0.05, 2)
    while util <= 0.95:
        new = with_overrides(cfg, {"gpu_memory_utilization": util})
        e = est_mod.estimate(new, mode)
        if (e.assumptions.get("generation_waves") or 1) <= 1:
            if not e.fits:
                return None
            after = throughput.relative_step_time(new, mode)["rank_tokens_per_s"]
            return {
                "overrides": _fmt({"gpu_memory_utilization": util}),
                "waves": waves,
                "speedup_pct": round(100 * (after / before - 1), 1),
                "what": (
                    f"speed, not memory: vLLM's KV cache holds {base.assumptions['kv_cache_sequences']} of "
                    f"{base.assumptions['generation_batch']} sequences, so generation runs in about {waves} waves; "
                    f"gpu_memory_utilization={util} holds the whole batch (not needed to fit)"
                ),
            }
        util = round(util + 0.05, 2)
    return None


def _fmt(overrides: dict) -> list[str]:
    def value(v):
        return str(v).lower() if isinstance(v, bool) else str(v)

    return [f"{k}={value(v)}" for k, v in overrides.items()]


# ----------------------------------------------------------------------------- fragmentation

FRAGMENTATION_SHARE = 0.10  # reserved-but-unallocated over this share of PyTorch's reserved memory


def fragmentation_advice(parsed: dict, cfg: Any) -> dict | None:
    """The lever `expandable_segments=true` when a PyTorch OOM shows fragmentation: memory PyTorch
    reserved but could not use for the failed allocation (`reserved_unallocated_bytes`, parsed from
    "... is reserved by PyTorch but unallocated") is a large share of what it reserved, or alone
    would have held the request. None when the message lacks those numbers or the lever is on."""
    spare = parsed.get("reserved_unallocated_bytes")
    used = parsed.get("allocated_by_pytorch_bytes")
    if not spare or used is None or cfg.get("expandable_segments"):
        return None
    share = spare / (spare + used)
    requested = parsed.get("requested_bytes") or 0
    if share < FRAGMENTATION_SHARE and spare < requested:
        return None
    return {
        "overrides": {"expandable_segments": True},
        "reserved_unallocated_bytes": spare,
        "share": share,
        "why": (
            f"{spare / GiB:.2f} GiB ({100 * share:.0f} % of PyTorch's reserved memory) was reserved but "
            "unallocated: fragmentation. expandable_segments=true (PYTORCH_CUDA_ALLOC_CONF="
            "expandable_segments:True in the trial) lets the allocator grow segments instead"
        ),
    }
