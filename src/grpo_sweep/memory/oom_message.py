"""Parse out-of-memory messages into numbers (bytes), for metrics.json and `grpo-sweep doctor`.

Reads what users paste, wherever it came from (FORMS lists them, with the words each is found by):
- PyTorch 2.x (`torch.OutOfMemoryError` / `torch.cuda.OutOfMemoryError`): "Tried to allocate X. GPU 0
  has a total capacity of X of which X is free. Process N has X memory in use. Including non-PyTorch
  memory, this process has X memory in use. Of the allocated memory X is allocated by PyTorch, and X
  is reserved by PyTorch but unallocated." (torch 2.1 spelled it "capacty"); the CPU tracker's
  simulated-device message has the same shape;
- PyTorch 1.x: "Tried to allocate X (GPU 0; X total capacity; X already allocated; X free; X reserved
  in total by PyTorch)";
- vLLM 0.10-0.33 start-up errors (vllm/v1/core/kv_cache_utils.py `_check_enough_kv_cache_memory`,
  vllm/v1/worker/utils.py `request_memory`, vllm/v1/worker/gpu_worker.py, vllm/v1/worker/cpu_worker.py,
  and V0's vllm/worker/worker.py `raise_if_cache_size_invalid`):
  "No available memory for the cache blocks"; "To serve at least one request with the model's (or
  models's) max seq len (N), (X GiB KV cache is needed, which is larger than the available KV cache
  memory (Y GiB). Based on the available memory, the estimated maximum model length is M."; V0's "The
  model's max seq len (N) is larger than the maximum number of tokens that can be stored in KV cache
  (M)"; "Free memory on device [cuda:0] (X/Y GiB) on startup is less than desired GPU memory
  utilization (U, Z GiB)"; and the CPU build's "Available memory on node 0 (X/Y GiB) on startup is
  less than desired CPU memory utilization (U, Z GiB)" and "Available memory on node 0 (X/Y GiB) on kv
  cache allocation is less than requested memory for kv (K[/R] GiB)" (K is negative when the share
  is smaller than what the process already holds).
  vLLM prints GiB with two decimals (`format_gib`): a small model's KV figures read "0.0 GiB". A
  figure of zero is below the message's precision, so it is not taken as a size (the doctor
  computes the KV need itself); `kv_cache_too_small` says which error it was.
Log prefixes (`[rank0]:`, `(EngineCore_DP0 pid=1) ERROR 10-08 20:33:48 [core.py:708]`, `(VllmWorker
rank=0 pid=2)`, `[Stage-0]`, docker compose's `vllm-1  | `, CI timestamps) and line breaks anywhere
inside the message (terminal wrapping) are tolerated.
"""

from __future__ import annotations

import re

from ..units import GIB, KIB, MIB, TIB

_UNITS = {"B": 1, "bytes": 1, "KiB": KIB, "MiB": MIB, "GiB": GIB, "TiB": TIB, "KB": 10**3, "MB": 10**6, "GB": 10**9}
_NUM = r"([\d][\d,]*(?:\.\d+)?)"
_UNIT = r"(KiB|MiB|GiB|TiB|KB|MB|GB|bytes|B)"
_SIZE = _NUM + r"\s*" + _UNIT

# Per-line prefixes added by torchrun, vLLM's processes and logger, Ray, docker compose, CI logs and
# Python logging. Each alternative must not eat the start of a message line ("(5.62 GiB KV cache",
# "(40960),"): a process tag needs at least one key=value.
_PREFIXES = re.compile(
    r"^\s*(?:\[rank\d+\]:\s*"  # torchrun: [rank0]:
    r"|\([\w.-]+(?:,?\s+[\w-]+=[^\s,)]+)+\)\s*"  # (EngineCore_DP0 pid=1), (VllmWorker rank=0 pid=2), (Actor pid=3, ip=..)
    r"|\[\d{4}-\d\d-\d\d[ T][\d:.,]+Z?\]\s*"  # [2026-02-24T20:21:58Z] (CI)
    r"|\[[A-Za-z][\w-]*\]\s+"  # [Stage-0]
    r"|(?:INFO|WARNING|ERROR|DEBUG|CRITICAL)\s+\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?\s+\[?[\w./-]+:\d+\]\s*"  # vLLM's logger
    r"|\[[\w./-]+:\d+\]\s*"  # [multiproc_executor.py:492]
    r"|\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?Z?\s*(?:[-|]\s*[\w.]+\s+(?=[-|]))*[-|]?\s*"  # 2024-01-01 10:00:00,1 - ERROR -
    r"|[\w.-]+\s+\|\s"  # docker compose: vllm-1  |
    r"|\|\s+"  # a CI table's column
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
_ESTIMATED_LEN = _pattern("the estimated maximum model length is") + r"\s*(\d+)"
_WHERE = (
    r"(?:"
    + _pattern("Free memory on device")
    + r"(?:\s*[a-z]+:\d+)?|"
    + _pattern("Available memory on node")
    + r"\s*\d+)\s*\(\s*"
    + _NUM
    + r"\s*/\s*"
    + _SIZE
    + r"\s*\)\s*"
)
_STARTUP = (
    _WHERE
    + _pattern("on startup is less than desired")
    + r"\s*(?:GPU|CPU)\s*"
    + _pattern("memory utilization")
    + r"\s*\(\s*([\d.]+)\s*,\s*"
    + _SIZE
    + r"\s*\)"
)
_SIGNED = r"(-?[\d][\d,]*(?:\.\d+)?)"
_CPU_KV = (
    _WHERE
    + _pattern("on kv cache allocation is less than requested memory for kv")
    + r"\s*\(\s*"
    + _SIGNED
    + r"(?:\s*/\s*"
    + _SIGNED
    + r")?\s*"
    + _UNIT
    + r"\s*\)"
)
_TOO_SMALL = (
    _pattern("No available memory for the cache blocks")
    + "|"
    + _pattern("To serve at least one request with the")
    + "|"
    + _pattern("is larger than the maximum number of tokens that can be stored in KV cache")
)
_OOM_WORDS = r"out\s*of\s*memory|OutOfMemoryError"

# What the parser recognises: (name, the words it looks for). The doctor prints these when it reads
# nothing, so a user sees what a readable message looks like.
FORMS: tuple[tuple[str, str], ...] = (
    ("pytorch", "PyTorch: 'CUDA out of memory. Tried to allocate X GiB. GPU 0 has a total capacity of ...'"),
    ("vllm_kv_cache", "vLLM: 'To serve at least one request with the model's max seq len (N), (X GiB KV cache is needed ...'"),
    ("vllm_kv_tokens", "vLLM V0: 'The model's max seq len (N) is larger than the maximum number of tokens ... KV cache (M)'"),
    ("vllm_no_cache_blocks", "vLLM: 'No available memory for the cache blocks'"),
    ("vllm_startup", "vLLM: 'Free memory on device (X/Y GiB) on startup is less than desired GPU memory utilization (U, Z GiB)'"),
    (
        "vllm_cpu_startup",
        "vLLM CPU: 'Available memory on node 0 (X/Y GiB) on startup is less than desired CPU memory utilization'",
    ),
    (
        "vllm_cpu_kv",
        "vLLM CPU: 'Available memory on node 0 (X/Y GiB) on kv cache allocation is less than requested memory for kv'",
    ),
    ("out_of_memory", "any 'out of memory' / 'OutOfMemoryError' without sizes"),
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

    `form` names which of FORMS it is (absent: none, the parser read nothing). deficit: requested -
    free (PyTorch), KV needed - KV available (vLLM), desired - free at start-up (vLLM), the negative
    KV share (vLLM CPU). An unreadable message returns {}.
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
    form = "pytorch" if "requested_bytes" in out else None
    for key, pattern in (("max_seq_len", _MAX_SEQ), ("kv_cache_tokens", _KV_TOKENS), ("estimated_max_model_len", _ESTIMATED_LEN)):
        match = _search(pattern, flats)
        if match:
            out[key] = int(match.group(1))
    if "kv_cache_needed_bytes" in out or "kv_cache_available_bytes" in out:
        form = "vllm_kv_cache"
        # Two decimals of GiB: a zero is below the message's precision, not a size.
        if not out.get("kv_cache_needed_bytes"):
            out.pop("kv_cache_needed_bytes", None)
            out.pop("kv_cache_available_bytes", None)
    elif "kv_cache_tokens" in out:
        form = "vllm_kv_tokens"
    match = _search(_STARTUP, flats)
    if match:
        free_n, total_n, total_u, util, desired_n, desired_u = match.groups()
        out["free_bytes"] = to_bytes(free_n, total_u)
        out["total_bytes"] = to_bytes(total_n, total_u)
        out["gpu_memory_utilization"] = float(util)
        out["desired_bytes"] = to_bytes(desired_n, desired_u)
        form = "vllm_cpu_startup" if "node" in match.group(0).lower() else "vllm_startup"
    match = _search(_CPU_KV, flats)
    if match:
        free_n, total_n, total_u, kv_n, share_n, unit = match.groups()
        out["free_bytes"] = to_bytes(free_n, total_u)
        out["total_bytes"] = to_bytes(total_n, total_u)
        sign = -1 if kv_n.startswith("-") else 1
        out["kv_cache_requested_bytes"] = sign * to_bytes(kv_n.lstrip("-"), unit)
        if share_n is not None:  # auto-sized: the share (util x node total) the KV was cut from
            out["vllm_share_bytes"] = to_bytes(share_n.lstrip("-"), unit)
        if out["kv_cache_requested_bytes"] <= 0:  # the share leaves nothing for the KV cache
            out["kv_cache_too_small"] = True
        form = "vllm_cpu_kv"
    if re.search(_pattern("No available memory for the cache blocks"), flats[0], flags=re.IGNORECASE):
        out["kv_cache_available_bytes"] = out.get("kv_cache_available_bytes", 0)
        out["no_cache_blocks"] = True
        form = form or "vllm_no_cache_blocks"
    if _search(_TOO_SMALL, flats):
        out["kv_cache_too_small"] = True
    if form is None and out:
        form = "pytorch"  # sizes from PyTorch's wording without the "Tried to allocate" part
    if form is None and _search(_OOM_WORDS, flats):
        form = "out_of_memory"

    if "requested_bytes" in out and "free_bytes" in out:
        out["deficit_bytes"] = max(out["requested_bytes"] - out["free_bytes"], 0)
    elif "kv_cache_needed_bytes" in out and "kv_cache_available_bytes" in out:
        out["deficit_bytes"] = max(out["kv_cache_needed_bytes"] - out["kv_cache_available_bytes"], 0)
    elif "desired_bytes" in out and "free_bytes" in out:
        out["deficit_bytes"] = max(out["desired_bytes"] - out["free_bytes"], 0)
    elif "kv_cache_requested_bytes" in out:
        kv = out["kv_cache_requested_bytes"]
        # Negative: the share is that much below what the process holds already; too large: over free.
        out["deficit_bytes"] = -kv if kv <= 0 else max(kv - out["free_bytes"], 0)
    if form is not None:
        out["form"] = form
    return out


def forms_text() -> str:
    """What the parser looks for, one line each (for `grpo-sweep doctor` when it reads nothing)."""
    return "\n".join(f"  - {words}" for _, words in FORMS)
