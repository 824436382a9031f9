"""The model cache ($GRPO_SWEEP_CACHE): an entry is built by one process, visible only when complete,
and read only when whole, whatever uses it first: a 2-process trial, two trials at once, or an entry
left incomplete by an older version or a kill, or damaged after it was published (its manifest, a
header, the weights, a dangling link). A cache that cannot be written is one line naming
GRPO_SWEEP_CACHE. Every test starts from an empty cache of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers.config import compose
from helpers.runners import IN_PROCESS_TRIALS, ROOT, load_metrics, start_train, train_here

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
    assert sorted(missing(target)) == [f"no {ENTRY_FILE}"]
    assert Path(model_path(cfg, tok, on_cuda=False)) == target
    out = capsys.readouterr().out
    line = f"[cache] {target}: no {ENTRY_FILE}; moved aside to {target.name}.damaged-1, building it again"
    assert out.count(line) == 1, out
    assert out.count("[warmup] building") == 1
    assert missing(target) == [] and (target / "config.json").exists() and (target / "model.safetensors").exists()
    AutoModelForCausalLM.from_pretrained(target)  # a real checkpoint now
    assert Path(model_path(cfg, tok, on_cuda=False)) == target and capsys.readouterr().out == ""  # reused as it is

    (target / ENTRY_FILE).unlink()  # an older version's entry: every file, no manifest
    model_path(cfg, tok, on_cuda=False)
    assert f"no entry.json; moved aside to {target.name}.damaged-2" in capsys.readouterr().out and missing(target) == []

    weights = target / "model.safetensors"
    size = weights.stat().st_size
    weights.write_bytes(weights.read_bytes()[:100])  # cut short (a full disk, a kill mid-copy)
    assert missing(target) == [f"model.safetensors cut short (100 bytes, not {size})"]
    model_path(cfg, tok, on_cuda=False)
    assert (
        f": model.safetensors cut short (100 bytes, not {size}); moved aside to {target.name}.damaged-3"
        in capsys.readouterr().out
    )
    AutoModelForCausalLM.from_pretrained(target)
    assert not [p.name for p in target.parent.iterdir() if ".tmp-" in p.name]
    kept = sorted(p.name for p in target.parent.iterdir() if ".damaged-" in p.name)  # kept for inspection
    assert kept == [f"{target.name}.damaged-{n}" for n in (1, 2, 3)]
    assert (target.parent / kept[2] / "model.safetensors").stat().st_size == 100


def test_a_random_checkpoint_is_a_complete_entry_too(tmp_path, monkeypatch):
    from grpo_sweep.trial.cache_entry import missing
    from grpo_sweep.trial.models import materialize_random

    monkeypatch.setenv("GRPO_SWEEP_CACHE", str(tmp_path))
    cfg = compose([*SMALL, "model.init=random"])
    path = materialize_random(cfg, _tokenizer(cfg), on_cuda=False)
    assert path.is_relative_to(tmp_path / "random-models") and missing(path) == []
    manifest = json.loads((path / "entry.json").read_text())["files"]
    assert {"config.json", "model.safetensors", "tokenizer_config.json"} <= set(manifest)


def _random_entry(cache: Path, *extra: str):
    """A random-weight entry built in `cache` (GRPO_SWEEP_CACHE): (cfg, tokenizer, its path)."""
    from grpo_sweep.trial.models import materialize_random

    cfg = compose([*SMALL, "model.init=random", *extra])
    tok = _tokenizer(cfg)
    return cfg, tok, materialize_random(cfg, tok, on_cuda=False)


def _overwrite(path: Path, offset: int, data: bytes) -> None:
    """`data` written over `path` at `offset` in place: the size stays."""
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(data)


def _set_size(entry: Path, name: str, size) -> None:
    manifest = json.loads((entry / "entry.json").read_text())
    if isinstance(manifest["files"][name], dict):
        manifest["files"][name]["size"] = size
    else:  # a manifest of sizes only (before content hashes)
        manifest["files"][name] = size
    (entry / "entry.json").write_text(json.dumps(manifest))


def _sizes_only(entry: Path) -> None:
    manifest = json.loads((entry / "entry.json").read_text())
    manifest["files"] = {name: spec["size"] for name, spec in manifest["files"].items()}
    (entry / "entry.json").write_text(json.dumps(manifest))


def _dangle(entry: Path) -> None:
    import shutil

    shutil.rmtree(entry)
    entry.symlink_to(entry.parent / "gone")


# Each damage leaves every listed file at its size: only the content hash, the manifest's check or the
# link's tells it apart from a whole entry.
DAMAGE = {
    "header": (lambda e: _overwrite(e / "model.safetensors", 8, b"#" * 8), "model.safetensors changed"),
    "weights": (
        lambda e: _overwrite(e / "model.safetensors", (e / "model.safetensors").stat().st_size - 8, b"\x7f" * 8),
        "model.safetensors changed",
    ),
    "config": (lambda e: _overwrite(e / "config.json", 0, b" "), "config.json changed"),
    "manifest size": (
        lambda e: _set_size(e, "config.json", "abc"),
        "entry.json: config.json: size 'abc' is not a whole number of bytes",
    ),
    "sizes-only manifest": (_sizes_only, "entry.json: no content hashes (an older version's manifest)"),
    "dangling link": (_dangle, "a dangling link to"),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_entry_is_moved_aside_named_and_rebuilt(damage, tmp_path, monkeypatch, capsys):
    """A same-size overwrite of the weights' header or of their last bytes, a config file changed in
    place, a manifest whose size is not a number, an older version's manifest without hashes, an entry
    that is a dangling link: the next use says in one line which entry and what is wrong, keeps it as
    `<entry>.damaged-1`, and loads a rebuilt one with the very weights the first build had."""
    import torch
    from transformers import AutoModelForCausalLM

    from grpo_sweep.trial.cache_entry import missing
    from grpo_sweep.trial.models import materialize_random

    monkeypatch.setenv("GRPO_SWEEP_CACHE", str(tmp_path))
    cfg, tok, entry = _random_entry(tmp_path)
    # Copies: the loaded tensors map the file, which the damage below writes in place.
    first = {k: v.clone() for k, v in AutoModelForCausalLM.from_pretrained(entry).state_dict().items()}
    capsys.readouterr()
    harm, what = DAMAGE[damage]
    harm(entry)
    assert missing(entry) and what in missing(entry)[0]
    assert materialize_random(cfg, tok, on_cuda=False) == entry
    lines = capsys.readouterr().out.splitlines()
    said = [line for line in lines if line.startswith("[cache]")]
    assert len(said) == 1 and said[0].startswith(f"[cache] {entry}: {what}"), lines
    assert said[0].endswith(f"moved aside to {entry.name}.damaged-1, building it again")
    aside = entry.with_name(f"{entry.name}.damaged-1")
    assert aside.is_symlink() if damage == "dangling link" else (aside / "entry.json").is_file()
    assert missing(entry) == []
    again = AutoModelForCausalLM.from_pretrained(entry).state_dict()
    assert again.keys() == first.keys() and all(torch.equal(again[k], first[k]) for k in first)
    assert materialize_random(cfg, tok, on_cuda=False) == entry and "[cache]" not in capsys.readouterr().out


def test_users_racing_on_a_damaged_entry_move_it_aside_once_and_build_it_once(tmp_path, monkeypatch, capsys):
    """Four users of one damaged entry at once (threads: each takes the flock through its own open
    file, as processes do): one moves it aside and builds; the others wait and read that build."""
    from concurrent.futures import ThreadPoolExecutor

    from grpo_sweep.trial.cache_entry import missing
    from grpo_sweep.trial.models import materialize_random

    monkeypatch.setenv("GRPO_SWEEP_CACHE", str(tmp_path))
    cfg, tok, entry = _random_entry(tmp_path)
    _overwrite(entry / "model.safetensors", 8, b"#" * 8)
    capsys.readouterr()
    with ThreadPoolExecutor(4) as pool:
        paths = list(pool.map(lambda _: materialize_random(cfg, tok, on_cuda=False), range(4)))
    assert paths == [entry] * 4 and missing(entry) == []
    out = capsys.readouterr().out
    assert out.count("[cache]") == 1, out
    assert sorted(p.name for p in tmp_path.glob("random-models/*.damaged-*")) == [f"{entry.name}.damaged-1"]


def test_a_whole_entry_is_hashed_only_when_a_file_changed_since_its_last_check(tmp_path, monkeypatch):
    """The manifest holds each file's sha256; a use hashes only the files whose size, mtime or ctime
    moved since the hash last matched (recorded at publish and by each check that hashed)."""
    from grpo_sweep.trial import cache_entry

    monkeypatch.setenv("GRPO_SWEEP_CACHE", str(tmp_path))
    _, _, entry = _random_entry(tmp_path)
    files = json.loads((entry / "entry.json").read_text())["files"]
    assert all(len(spec["sha256"]) == 64 and spec["size"] >= 0 for spec in files.values())
    hashed: list[str] = []
    real = cache_entry._sha256
    monkeypatch.setattr(cache_entry, "_sha256", lambda p: hashed.append(Path(p).name) or real(p))
    assert cache_entry.missing(entry) == [] and hashed == []  # the build recorded what it hashed
    weights = entry / "model.safetensors"
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 1))  # content unchanged
    assert cache_entry.missing(entry) == [] and hashed == ["model.safetensors"]
    assert cache_entry.missing(entry) == [] and hashed == ["model.safetensors"]  # recorded again
    (entry / cache_entry.VERIFIED_FILE).unlink()
    assert cache_entry.missing(entry) == [] and sorted(hashed[1:]) == sorted(files)


@pytest.fixture
def tiny_fs(tmp_path):
    """`tiny_fs(size, ro=False)`: a tmpfs of `size` mounted in tmp_path, unmounted after the test.
    Skipped where this process may not mount (not root, no CAP_SYS_ADMIN)."""
    mounted = []

    def mount(size: str, ro: bool = False) -> Path:
        where = tmp_path / f"fs{len(mounted)}"
        where.mkdir()
        opts = f"size={size}" + (",ro" if ro else "")
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where)], capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", str(where)], check=False)


def _unwritable(cache: Path, *extra: str) -> str:
    with pytest.raises(Exception) as raised:
        _random_entry(cache, *extra)
    assert raised.type.__name__ == "CacheUnwritable", raised.getrepr()
    text = str(raised.value)
    assert "\n" not in text and text.startswith(f"GRPO_SWEEP_CACHE={cache} cannot be written (")
    assert "set GRPO_SWEEP_CACHE to a writable folder" in text
    return text


def test_a_cache_that_is_a_file_is_one_line_naming_GRPO_SWEEP_CACHE(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    cache.write_text("not a folder")
    monkeypatch.setenv("GRPO_SWEEP_CACHE", str(cache))
    assert f"(Not a directory: {cache}/random-models)" in _unwritable(cache)


def test_a_full_cache_is_one_line_and_leaves_nothing_behind(tiny_fs, monkeypatch):
    """A real full disk: a 64 KiB tmpfs takes the config and the tokenizer, not the weights."""
    cache = tiny_fs("64k")
    monkeypatch.setenv("GRPO_SWEEP_CACHE", str(cache))
    assert "(No space left on device" in _unwritable(cache)
    assert [p.name for p in (cache / "random-models").iterdir()] == [p.name for p in (cache / "random-models").glob("*.lock")]


def test_a_read_only_cache_reads_its_whole_entries_and_refuses_a_build_in_one_line(tiny_fs, monkeypatch):
    cache = tiny_fs("8m")
    monkeypatch.setenv("GRPO_SWEEP_CACHE", str(cache))
    _, _, entry = _random_entry(cache)
    subprocess.run(["mount", "-o", "remount,ro", str(cache)], check=True)
    assert _random_entry(cache)[2] == entry
    assert "(Read-only file system" in _unwritable(cache, "seed=1")


@IN_PROCESS_TRIALS
def test_a_trial_and_train_py_say_an_unwritable_cache_in_one_line(tmp_path, monkeypatch):
    """`python train.py` (one process) and a 2-process trial's leader, with GRPO_SWEEP_CACHE a file:
    the trial fails with the one line and no traceback, before any model loads."""
    from grpo_sweep.trial.parent import run_trial

    cache = tmp_path / "cache"
    cache.write_text("not a folder")
    run = tmp_path / "run"
    out = train_here(["trial.steps=1", f"hydra.run.dir={run}"], env={"GRPO_SWEEP_CACHE": str(cache)})
    assert out.returncode == 1, out.stdout[-3000:]
    said = f"[trial] GRPO_SWEEP_CACHE={cache} cannot be written (Not a directory: {cache}/warm-models)"
    assert said in out.stdout and "Traceback" not in out.stdout + out.stderr, out.stdout[-3000:] + out.stderr[-3000:]
    assert load_metrics(run)["error"].startswith(f"CacheUnwritable: GRPO_SWEEP_CACHE={cache} cannot be written")
    two = tmp_path / "two"
    monkeypatch.setenv("GRPO_SWEEP_CACHE", str(cache))
    record = run_trial(compose(["trial.steps=1", "trial.num_processes=2", "trial.strategy=ddp"]), two)
    assert record["status"] == "failed" and record["error"].startswith(f"CacheUnwritable: GRPO_SWEEP_CACHE={cache}")
    log = (two / "trial.log").read_text()
    assert said in log and "Traceback" not in log, log


RANK_BUILDS = textwrap.dedent(
    """
    import os, sys
    import torch.distributed as dist
    sys.path.insert(0, {tests!r})
    from helpers.config import compose
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
    env = {"GRPO_SWEEP_CACHE": str(tmp_path / "cache")}
    procs = [start_train([*SMALL, "trial.steps=1", f"hydra.run.dir={tmp_path / str(k)}"], env=env) for k in range(2)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert [load_metrics(tmp_path / str(k))["status"] for k in range(2)] == ["ok", "ok"], outs
    assert sum(o.count("[warmup] building") for o in outs) == 1, outs
    from grpo_sweep.trial.cache_entry import missing

    entries = [p for p in (tmp_path / "cache" / "warm-models").iterdir() if p.is_dir()]
    assert len(entries) == 1 and missing(entries[0]) == [], entries
