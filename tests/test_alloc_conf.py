"""The expandable_segments lever: set in the trial before CUDA starts, recorded, suggested by the doctor."""

from __future__ import annotations

import os

import pytest
from helpers.config import compose
from helpers.runners import FAST, IN_PROCESS_TRIALS, cli, load_metrics

from grpo_sweep.memory.doctor import fragmentation_advice
from grpo_sweep.memory.oom_message import parse_oom_message
from grpo_sweep.metrics import KEYS

FRAGMENTED = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of 22.05 GiB "
    "of which 1.10 GiB is free. Including non-PyTorch memory, this process has 20.94 GiB memory in use. Of the "
    "allocated memory 16.20 GiB is allocated by PyTorch, and 4.30 GiB is reserved by PyTorch but unallocated. If "
    "reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation."
)
TIGHT = FRAGMENTED.replace("4.30 GiB is reserved", "120.00 MiB is reserved")


def test_doctor_suggests_expandable_segments_for_a_fragmented_oom():
    cfg = compose(["model=gemma3_1b", "gpu=l4_24g"])
    advice = fragmentation_advice(parse_oom_message(FRAGMENTED), cfg)
    assert advice["overrides"] == {"expandable_segments": True}
    assert advice["reserved_unallocated_bytes"] == int(4.30 * 2**30)
    assert advice["share"] == pytest.approx(4.30 / (4.30 + 16.20), rel=1e-3)
    assert fragmentation_advice(parse_oom_message(TIGHT), cfg) is None  # 0.7 % spare, smaller than the request
    on = compose(["model=gemma3_1b", "gpu=l4_24g", "expandable_segments=true"])
    assert fragmentation_advice(parse_oom_message(FRAGMENTED), on) is None  # already on
    assert fragmentation_advice(parse_oom_message("RuntimeError: something else"), cfg) is None


def test_doctor_report_says_it(tmp_path):
    """`grpo-sweep doctor` shows the allocator advice beside the levers (text and --json)."""
    import json

    message = tmp_path / "oom.txt"
    message.write_text(FRAGMENTED)
    args = ["doctor", "--message", str(message), "model=gemma3_1b", "gpu=l4_24g"]
    text = cli(*args)
    assert text.returncode == 0, text.stderr
    assert "allocator: 4.30 GiB (21 % of PyTorch's reserved memory) was reserved but unallocated" in text.stdout
    data = json.loads(cli(*args, "--json").stdout)
    assert data["fragmentation"]["overrides"] == {"expandable_segments": True}
    tight = tmp_path / "tight.txt"
    tight.write_text(TIGHT)
    args[args.index(str(message))] = str(tight)
    assert "allocator:" not in cli(*args).stdout


def test_alloc_conf_keeps_the_users_other_settings(monkeypatch):
    from grpo_sweep.trial.process import set_alloc_conf

    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128,expandable_segments:False")
    assert set_alloc_conf(True) == "max_split_size_mb:128,expandable_segments:True"
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128,expandable_segments:True"
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    assert set_alloc_conf(False) == "expandable_segments:False"


@IN_PROCESS_TRIALS
def test_the_trial_runs_with_the_lever_and_records_it(tmp_path):
    from grpo_sweep.trial.parent import run_trial

    record = run_trial(compose([*FAST, "expandable_segments=true"]), tmp_path)
    assert record["status"] == "ok", record["error"]
    m = load_metrics(tmp_path)
    assert m["cuda_alloc_conf"].endswith("expandable_segments:True") and set(m) <= KEYS
    assert "PYTORCH_CUDA_ALLOC_CONF" not in os.environ or "expandable_segments:True" not in os.environ["PYTORCH_CUDA_ALLOC_CONF"]
