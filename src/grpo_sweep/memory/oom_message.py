"""Parse out-of-memory messages into numbers (bytes), for metrics.json and `grpo-sweep doctor`.

Reads what users paste, wherever it came from:
- PyTorch 2.x (`torch.OutOfMemoryError` / `torch.cuda.OutOfMemoryError`): "Tried to allocate X. GPU 0
  has a total capacity of X of which X is free. Process N has X memory in use. Including non-PyTorch
  memory, this process has X memory in use. Of the allocated memory X is allocated by PyTorch, and X
  is reserved by PyTorch but unallocated." (torch 2.1 spelled it "capacty"); the CPU tracker's
  simulated-device message has the same shape;
- PyTorch 1.x: "Tried to allocate X (GPU 0; X total capacity; X already allocated; X free; X reserved
  in total by PyTorch)";
- vLLM start-up errors: "No available memory for the cache blocks", "To serve at least one request
  with the models's max seq len (N), (X GiB KV cache is needed, which is larger than the available KV
  cache memory (Y GiB)", the older "The model's max seq len (N) is larger than the maximum number of
  tokens that can be stored in KV cache (M)", and "Free memory on device (X/Y GiB) on startup is less
  than desired GPU memory utilization (U, Z GiB)" (wordings from vllm/v1/core/kv_cache_utils.py,
  vllm/worker/worker.py and vllm/v1/worker/utils.py).
Log prefixes (`[rank0]:`, `(EngineCore_DP0 pid=1) ERROR 10-08 20:33:48 [core.py:708]`, timestamps)
and line breaks anywhere inside the message (terminal wrapping) are tolerated.
"""

from __future__ import annotations

import re

_UNITS = {"B": 1, "bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "KB": 10**3, "MB": 10**6, "GB": 10**9}
_NUM = r"([\d][\d,]*(?:\.\d+)?)"
_UNIT = r"(KiB|MiB|GiB|TiB|KB|MB|GB|bytes|B)"
_SIZE = _NUM + r"\s*" + _UNIT

# Per-line prefixes added by torchrun, vLLM's engine process, Python logging and timestamps.
_PREFIXES = re.compile(
    r"^\s*(?:\[rank\d+\]:\s*"
    r"|\([\w.-]+ pid=\d+\)\s*"
    r"|(?:INFO|WARNING|ERROR|DEBUG|CRITICAL)\s+\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s+\[[^\]]*\]\s*"
    r"|\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?\s*(?:-\s*\w+\s*-\s*)?"
    r"|(?:INFO|WARNING|ERROR|DEBUG|CRITICAL)\s*[:|-]\s*)+"
)


def to_bytes(number: str, unit: str) -> int:
    return int(float(number.replace(",", "")) * _UNITS[unit])


def _pattern(text: str) -> str:
    """Literal words with any whitespace (or none: a wrapped line) between them."""
    return r"\s*".join(text.split(" "))


def _clean_lines(text: str) -> list[str]:
    lines = []
    for line in text.splitlines():
        previous = None
        while previous != line:  # prefixes can stack: "[rank0]: (EngineCore pid=1) ERROR ..."
            previous, line = line, _PREFIXES.sub("", line)
        lines.append(line.strip())
    return [line for line in lines if line]


# key -> regex over the flattened message; sizes are (number, unit) pairs.
_SIZES = {
    "requested_bytes": _pattern("Tried to allocate") + r"\s*" + _SIZE,
    "total_bytes": r"(?:"
    + _pattern("total capac")
    + r"i?ty\s*of\s*"
    + _SIZE
    + r"|"
    + _SIZE
    + r"\s*"
    + _pattern("total capacity")
    + r")",
    "free_bytes": r"(?:"
    + _pattern("of which")
    + r"\s*"
    + _SIZE
    + r"\s*"
    + _pattern("is free")
    + r"|already\s*allocated;\s*"
    + _SIZE
    + r"\s*free)",
    "process_in_use_bytes": _pattern("this process has") + r"\s*" + _SIZE + r"\s*" + _pattern("memory in use"),
    "allocated_by_pytorch_bytes": r"(?:"
    + _pattern("Of the allocated memory")
    + r"\s*"
    + _SIZE
    + r"\s*"
    + _pattern("is allocated by PyTorch")
    + r"|"
    + _SIZE
    + r"\s*"
    + _pattern("already allocated")
    + r")",
    "reserved_unallocated_bytes": r"(?:and\s*" + _SIZE + r"\s*" + _pattern("is reserved by PyTorch but unallocated") + r")",
    "kv_cache_needed_bytes": r"\(\s*" + _SIZE + r"\s*" + _pattern("KV cache is needed"),
    "kv_cache_available_bytes": _pattern("available KV cache memory") + r"\s*\(\s*" + _SIZE,
}
_RESERVED_TOTAL = _SIZE + r"\s*" + _pattern("reserved in total by PyTorch")
_PROCESS = _pattern("Process") + r"\s*\d+\s*has\s*" + _SIZE + r"\s*" + _pattern("memory in use")
_MAX_SEQ = r"max\s*seq\s*len\s*\(\s*(\d+)\s*\)"
_KV_TOKENS = _pattern("can be stored in KV cache") + r"\s*\(\s*(\d+)\s*\)"
_STARTUP = (
    _pattern("Free memory on device")
    + r"\s*\(\s*"
    + _NUM
    + r"\s*/\s*"
    + _SIZE
    + r"\s*\)\s*"
    + _pattern("on startup is less than desired GPU memory utilization")
    + r"\s*\(\s*"
    + r"([\d.]+)\s*,\s*"
    + _SIZE
    + r"\s*\)"
)


def _search(pattern: str, flats: tuple[str, ...]):
    for flat in flats:
        match = re.search(pattern, flat, flags=re.IGNORECASE)
        if match:
            return match
    return None


def _size(match) -> int:
    groups = [g for g in match.groups() if g is not None]
    return to_bytes(groups[0], groups[1])


def parse_oom_message(text: str) -> dict:
    """Extract whatever the message states (sizes in bytes) and `deficit_bytes` where it follows.

    deficit: requested - free (PyTorch), KV needed - KV available (vLLM), desired - free at start-up
    (vLLM). An unparseable message returns {}.
    """
    lines = _clean_lines(text)
    flats = (" ".join(lines), "".join(lines))
    out: dict = {}
    for key, pattern in _SIZES.items():
        match = _search(pattern, flats)
        if match:
            out[key] = _size(match)
    reserved = _search(_RESERVED_TOTAL, flats)
    if reserved and "allocated_by_pytorch_bytes" in out and "reserved_unallocated_bytes" not in out:
        out["reserved_unallocated_bytes"] = max(_size(reserved) - out["allocated_by_pytorch_bytes"], 0)
        out["reserved_by_pytorch_bytes"] = _size(reserved)
    if "process_in_use_bytes" not in out:
        processes = re.findall(_PROCESS, flats[0], flags=re.IGNORECASE)
        if processes:
            out["process_in_use_bytes"] = sum(to_bytes(n, u) for n, u in processes)
    match = _search(_MAX_SEQ, flats)
    if match:
        out["max_seq_len"] = int(match.group(1))
    match = _search(_KV_TOKENS, flats)
    if match:
        out["kv_cache_tokens"] = int(match.group(1))
    match = _search(_STARTUP, flats)
    if match:
        free_n, total_n, total_u, util, desired_n, desired_u = match.groups()
        out["free_bytes"] = to_bytes(free_n, total_u)
        out["total_bytes"] = to_bytes(total_n, total_u)
        out["gpu_memory_utilization"] = float(util)
        out["desired_bytes"] = to_bytes(desired_n, desired_u)
    if re.search(_pattern("No available memory for the cache blocks"), flats[0], flags=re.IGNORECASE):
        out["kv_cache_available_bytes"] = out.get("kv_cache_available_bytes", 0)
        out["no_cache_blocks"] = True

    if "requested_bytes" in out and "free_bytes" in out:
        out["deficit_bytes"] = max(out["requested_bytes"] - out["free_bytes"], 0)
    elif "kv_cache_needed_bytes" in out and "kv_cache_available_bytes" in out:
        out["deficit_bytes"] = max(out["kv_cache_needed_bytes"] - out["kv_cache_available_bytes"], 0)
    elif "desired_bytes" in out and "free_bytes" in out:
        out["deficit_bytes"] = max(out["desired_bytes"] - out["free_bytes"], 0)
    return out
