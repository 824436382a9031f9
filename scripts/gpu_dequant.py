"""bitsandbytes' 4-bit stream on the device's card: the measurement a conf/gpu dequant_bandwidth_fraction can cite.

    scripts/gpu_wheels.sh bnb   # once, in the checkout the device tool sends: the bitsandbytes wheel into .whl/bnb
    device run, carry [".whl/bnb"]: python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/bnb/*.whl &&
        PYTHONPATH=/tmp/site python3 scripts/gpu_dequant.py
    (GPU_DEQUANT_CARD and GPU_DEQUANT_PEAK_GBS name another card than the H200 and its datasheet bandwidth.)

A GRPO decode step runs every projection as bitsandbytes.matmul_4bit over a few rows (one per live sequence):
it dequantises the NF4 weight to a 16-bit copy (read 0.5 byte, write 2 bytes per weight) and multiplies
(read the 2 bytes again): the 4.5 bytes per weight the throughput model charges
(memory.throughput.DEQUANT_BYTES_PER_WEIGHT). Timed here over LAYERS distinct Mistral-7B-sized MLP weights
(4096 x 14336, double-quantised NF4 as Unsloth's checkpoints are), cycled so that no copy stays in L2:
- matmul_4bit at 6 rows (a 6-completion wave's decode): weights/s and its 4.5-byte stream's share of peak;
- dequantize_4bit alone (2.5 bytes per weight);
- a 16-bit matmul at 6 rows over the same shapes (2 bytes per weight): decoding's weight-read share.
Each: the median of REPEATS timed passes (CUDA events) after a warm-up. Writes $OUT/gpu_dequant_<card>.json.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

import torch

LAYERS = 16
ROWS = 6
SHAPE = (14336, 4096)  # (out, in): Mistral-7B's gate/up projection
REPEATS = 7


def timed(fn, passes: int = 3) -> float:
    """Median seconds of one pass of fn over REPEATS timings of `passes` passes each."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(passes):
            fn()
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end) / 1e3 / passes)
    return statistics.median(out)


def main() -> dict:
    import bitsandbytes as bnb
    import bitsandbytes.functional as F

    torch.manual_seed(0)
    dtype = torch.bfloat16
    weights = [torch.randn(*SHAPE, dtype=dtype, device="cuda") for _ in range(LAYERS)]
    packed = [F.quantize_4bit(w, quant_type="nf4", compress_statistics=True) for w in weights]
    x = torch.randn(ROWS, SHAPE[1], dtype=dtype, device="cuda")
    n = LAYERS * SHAPE[0] * SHAPE[1]

    def four_bit():
        for q, state in packed:
            bnb.matmul_4bit(x, q.t(), quant_state=state)

    def dequant():
        for q, state in packed:
            F.dequantize_4bit(q, state)

    def sixteen():
        for w in weights:
            x @ w.t()

    props = torch.cuda.get_device_properties(0)
    card = os.environ.get("GPU_DEQUANT_CARD", "h200_141g")
    peak = float(os.environ.get("GPU_DEQUANT_PEAK_GBS", "4800")) * 1e9
    t4, td, t16 = timed(four_bit), timed(dequant), timed(sixteen)
    result = {
        "card": card,
        "device": props.name,
        "bitsandbytes": bnb.__version__,
        "torch": torch.__version__,
        "weights": n,
        "rows": ROWS,
        "shape": list(SHAPE),
        "peak_bandwidth_gbs": peak / 1e9,
        "matmul_4bit_s": t4,
        "matmul_4bit_gweights_per_s": n / t4 / 1e9,
        "dequant_bandwidth_fraction": 4.5 * n / t4 / peak,
        "dequantize_4bit_s": td,
        "dequantize_4bit_fraction": 2.5 * n / td / peak,
        "matmul_16bit_s": t16,
        "matmul_16bit_fraction": 2.0 * n / t16 / peak,
    }
    out = Path(os.environ.get("OUT", "outputs")) / f"gpu_dequant_{card}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    if not torch.cuda.is_available():
        sys.exit("gpu_dequant: no CUDA device")
    print(json.dumps(main(), indent=2))
