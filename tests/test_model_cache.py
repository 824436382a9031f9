"""The model cache ($GRPO_SWEEP_CACHE): an entry is built by one process, visible only when complete,
and read only when complete, whatever uses it first: a 2-process trial, two trials at once, or an
entry left incomplete by an older version or a kill. Every test starts from an empty cache of its own."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT, compose, load_metrics, train_here

# A warm model of its own (5 warm-up steps): its key is built in each test's empty cache.
SMALL = ["task.num_prompts=32", "model.warmup.steps=5", "model.warmup.batch_size=8"]


def _tokenizer(cfg):
    from grpo_sweep.trial.models import load_tokenizer
    from grpo_sweep.trial.tasks import get_task

    return load_tokenizer(cfg, get_task(cfg).corpus())


def _warm_dir(cfg, tok, root: Path) -> Path:
    from grpo_sweep.trial.tasks import get_task
    from grpo_sweep.trial.warmup import warm_model_dir

    return warm_model_dir(cfg, tok, get_task(cfg).examples(), root)


def test_an_incomplete_entry_is_rebuilt_with_one_line_and_never_loaded(tmp_path, monkeypatch, capsys):
    """Three incomplete entries: the one a rank other than 0 used to leave (tokenizer and warmup.json,
    no config, no weights), an older version's complete-looking one (no manifest), and one whose
    weights were cut short after it was published. Each is rebuilt, once, and then loads."""
    from transformers import AutoModelForCausalLM

    from grpo_sweep.trial.cache_entry import ENTRY_FILE, missing
    from grpo_sweep.trial.models import model_path

    monkeypatch.setenv("GRPO_SWEEP_CACHE", str(tmp_path))
    cfg = compose(SMALL)
    tok = _tokenizer(cfg)
    target = _warm_dir(cfg, tok, tmp_path)
    target.mkdir(parents=True)
    tok.save_pretrained(target)
    (target / "warmup.json").write_text(json.dumps({"steps": 5, "loss": 1.0}))
    assert sorted(missing(target)) == [ENTRY_FILE]
    assert Path(model_path(cfg, tok, on_cuda=False)) == target
    out = capsys.readouterr().out
    assert out.count(f"[cache] {target} is incomplete (no {ENTRY_FILE}): building it again") == 1, out
    assert out.count("[warmup] building") == 1
    assert missing(target) == [] and (target / "config.json").exists() and (target / "model.safetensors").exists()
    AutoModelForCausalLM.from_pretrained(target)  # a real checkpoint now
    assert Path(model_path(cfg, tok, on_cuda=False)) == target and capsys.readouterr().out == ""  # reused as it is

    (target / ENTRY_FILE).unlink()  # an older version's entry: every file, no manifest
    model_path(cfg, tok, on_cuda=False)
    assert "is incomplete (no entry.json)" in capsys.readouterr().out and missing(target) == []

    weights = target / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # cut short (a full disk, a kill mid-copy)
    assert missing(target) == ["model.safetensors (cut short)"]
    model_path(cfg, tok, on_cuda=False)
    assert "(no model.safetensors (cut short))" in capsys.readouterr().out
    AutoModelForCausalLM.from_pretrained(target)
    assert not [p.name for p in target.parent.iterdir() if ".tmp-" in p.name or ".incomplete-" in p.name]


def test_a_random_checkpoint_is_a_complete_entry_too(tmp_path, monkeypatch):
    from grpo_sweep.trial.cache_entry import missing
    from grpo_sweep.trial.models import materialize_random

    monkeypatch.setenv("GRPO_SWEEP_CACHE", str(tmp_path))
    cfg = compose([*SMALL, "model.init=random"])
    path = materialize_random(cfg, _tokenizer(cfg), on_cuda=False)
    assert path.is_relative_to(tmp_path / "random-models") and missing(path) == []
    manifest = json.loads((path / "entry.json").read_text())["files"]
    assert {"config.json", "model.safetensors", "tokenizer_config.json"} <= set(manifest)


RANK_BUILDS = textwrap.dedent(
    """
    import os, sys
    import torch.distributed as dist
    sys.path.insert(0, {tests!r})
    from conftest import compose
    from grpo_sweep.trial.cache_entry import IncompleteCheckpoint
    from grpo_sweep.trial.models import load_tokenizer, materialize_random
    from grpo_sweep.trial.tasks import get_task

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    os.environ["GRPO_SWEEP_CACHE"] = os.path.join({root!r}, str(rank))
    cfg = compose({small!r} + ["model.init=random"])
    try:
        path = materialize_random(cfg, load_tokenizer(cfg, get_task(cfg).corpus()), on_cuda=False)
        print(f"rank {{rank}}: published {{path}}", flush=True)
    except IncompleteCheckpoint as exc:
        print(f"rank {{rank}}: refused: {{exc}}", flush=True)
    dist.destroy_process_group()
    """
)


@pytest.mark.slow
def test_a_build_inside_rank_1_of_a_process_group_publishes_nothing(tmp_path):
    """transformers' save_pretrained writes no config and no weights on a rank other than 0 once a
    process group is up: such a build is refused, not published as an entry every later trial trusts."""
    script = tmp_path / "ranks.py"
    script.write_text(RANK_BUILDS.format(tests=str(ROOT / "tests"), root=str(tmp_path / "cache"), small=SMALL))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "rank 0: published" in out.stdout, out.stdout
    assert "rank 1: refused: the checkpoint written for" in out.stdout and "lacks config.json" in out.stdout, out.stdout
    rank_1 = tmp_path / "cache" / "1" / "random-models"
    assert not [p for p in rank_1.iterdir() if p.is_dir()]  # no entry, no temporary left behind


@pytest.mark.slow
def test_a_two_process_trial_first_then_one_process_from_an_empty_cache(tmp_path):
    """Over 20 s: a two-process trial (two ranks import torch and TRL) and a one-process trial.
    The leader builds the warm model before torchrun; neither rank builds it; the one-process trial of
    the same key reads the same entry."""
    from grpo_sweep.trial.cache_entry import missing

    env = {"GRPO_SWEEP_CACHE": str(tmp_path / "cache")}
    two = tmp_path / "two"
    out = train_here([*SMALL, "trial.steps=1", "trial.num_processes=2", "trial.strategy=ddp", f"hydra.run.dir={two}"], env=env)
    assert out.returncode == 0 and load_metrics(two)["status"] == "ok", out.stdout[-3000:]
    assert out.stdout.count("[warmup] building") == 1 and "[trial] model checkpoint for the ranks:" in out.stdout
    for k in range(2):
        assert "[warmup]" not in (two / "ranks" / str(k) / "trial.log").read_text()
    entries = [p for p in (tmp_path / "cache" / "warm-models").iterdir() if p.is_dir()]
    assert len(entries) == 1 and missing(entries[0]) == []
    one = tmp_path / "one"
    out = train_here([*SMALL, "trial.steps=1", f"hydra.run.dir={one}"], env=env)
    assert out.returncode == 0 and load_metrics(one)["status"] == "ok", out.stdout[-3000:]
    assert "[warmup]" not in out.stdout and "[cache]" not in out.stdout


@pytest.mark.slow
def test_two_trials_started_at_once_build_one_entry(tmp_path):
    """Over 20 s: two `python train.py` started together on an empty cache, each a fresh interpreter.
    One builds the warm model; the other waits for it and reads the same entry."""
    import os

    env = {**os.environ, "PYTHONUNBUFFERED": "1", "GRPO_SWEEP_CACHE": str(tmp_path / "cache")}
    procs = [
        subprocess.Popen(
            [sys.executable, str(ROOT / "train.py"), *SMALL, "trial.steps=1", f"hydra.run.dir={tmp_path / str(k)}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=ROOT,
        )
        for k in range(2)
    ]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert [load_metrics(tmp_path / str(k))["status"] for k in range(2)] == ["ok", "ok"], outs
    assert sum(o.count("[warmup] building") for o in outs) == 1, outs
    from grpo_sweep.trial.cache_entry import missing

    entries = [p for p in (tmp_path / "cache" / "warm-models").iterdir() if p.is_dir()]
    assert len(entries) == 1 and missing(entries[0]) == [], entries
