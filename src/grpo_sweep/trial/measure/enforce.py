"""The target card's memory budget (`gpu=<card>`, `gpu.memory_gib`), enforced where the trial runs.

WHY: a sweep promises "no OOM on the target GPU", so a trial must OOM exactly where the target
card would, whatever machine runs it.
- CUDA: the caching allocator is capped to the target (`set_per_process_memory_fraction`,
  `cap_cuda_process`) and vLLM's up-front share is rescaled to the same bytes
  (`backends.vllm_util.rescale_utilization`), so an L4 sweep on an H100 fails where an L4 would.
- CPU: there is no allocator limit that works (RLIMIT_AS kills the process outside torch), so the
  tensor tracker (tracker.py) raises `simulated_oom_error`: the real `torch.OutOfMemoryError`
  with CUDA's message shape, which `oom_message.parse_oom_message` reads like a real one, and
  metrics.json records `simulated_device: true`.
"""

from __future__ import annotations

from ...units import format_size

SIMULATED_NOTE = "simulated device"


def simulated_oom_error(requested: int, live: int, budget: int, phase: str, card: str = "cpu_sim"):
    """The error a CUDA card of `budget` bytes would raise for this allocation, labelled simulated.

    Args:
        requested: The allocation's bytes.
        live: Bytes in use.
        budget: The card's bytes.
        phase: The phase the allocation fell in.
        card: The card's name, for the message.

    Returns:
        A torch.OutOfMemoryError with CUDA's message shape.
    """
    import torch

    free = max(budget - live, 0)
    message = (
        f"CUDA out of memory. Tried to allocate {format_size(requested)}. GPU 0 has a total capacity of "
        f"{format_size(budget)} of which {format_size(free)} is free. Including non-PyTorch memory, this "
        f"process has {format_size(live)} memory in use. Of the allocated memory {format_size(live)} is "
        f"allocated by PyTorch, and 0.00 KiB is reserved by PyTorch but unallocated. "
        f"({SIMULATED_NOTE}: grpo-sweep's CPU tensor tracker enforcing gpu={card} budget "
        f"{format_size(budget)} during {phase}; no real GPU ran out of memory)"
    )
    return torch.OutOfMemoryError(message)


def cap_cuda_process(target: int, device: int = 0) -> dict:
    """Cap PyTorch's caching allocator on `device` to `target` bytes of the real card.

    `set_per_process_memory_fraction` limits what the allocator may reserve, so allocations
    past the target raise CUDA's own OutOfMemoryError. It does not cover the CUDA context or
    memory allocated outside PyTorch's allocator (NVML's peak in metrics.json shows those). A
    target larger than the real card cannot be emulated: the fraction stays 1.0 and
    `capped` is False.
    """
    import torch

    actual = int(torch.cuda.get_device_properties(device).total_memory)
    fraction = min(1.0, target / actual)
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    return {"actual_bytes": actual, "target_bytes": target, "fraction": fraction, "capped": target < actual}


def capped_free_bytes(text: str) -> int | None:
    """What was free *on the target card* in a CUDA OOM raised under `cap_cuda_process`.

    Under a memory fraction PyTorch's message names the real card's free memory ("of which
    100 GiB is free") and then the cap ("22.06 GiB allowed;"); the target card's free memory is
    the allowance minus what PyTorch holds (allocated + reserved but unallocated). None when the
    message has no "allowed" part (no cap was set).
    """
    import re

    from ...memory.oom_message import to_bytes

    flat = " ".join(text.split())
    size = r"([\d.]+)\s*(B|KiB|MiB|GiB|TiB)"
    allowed = re.search(size + r" allowed;", flat)
    allocated = re.search(r"Of the allocated memory " + size + r" is allocated by PyTorch", flat)
    reserved = re.search(r"and " + size + r" is reserved by PyTorch but unallocated", flat)
    if not (allowed and allocated):
        return None
    held = to_bytes(*allocated.groups()) + (to_bytes(*reserved.groups()) if reserved else 0)
    return max(to_bytes(*allowed.groups()) - held, 0)
