"""Your data and rewards, wrong in every way a user met: each is one line naming the key, the value and
what is allowed, before any model loads (the data), or the trial's failure naming the function and
what it returned (the rewards)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.config import compose
from helpers.data import dataset_overrides, write_data
from helpers.runners import ROOT, load_metrics, train_here

from grpo_sweep.config.local import validate_here
from grpo_sweep.config.schema import ConfigError

BAD_REWARDS = """
def none(completions, **kwargs):
    return None


def nan(completions, **kwargs):
    return [float("nan")] * len(completions)


def strings(completions, **kwargs):
    return ["good"] * len(completions)


def short(completions, **kwargs):
    return [1.0]
"""


def _error(overrides: list[str]) -> str:
    with pytest.raises(ConfigError) as err:
        validate_here(compose(overrides), cuda=False)
    text = str(err.value)
    assert "\n" not in text
    return text


def _data(tmp_path: Path, path: Path) -> list[str]:
    write_data(tmp_path, chat=False)
    return dataset_overrides(path, "my_rewards.contains_solution")


def test_a_malformed_line_is_named_by_file_and_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = write_data(tmp_path, chat=False)
    lines = data.read_text().splitlines()
    lines[16] = lines[16][:-3]  # line 17 cut short
    data.write_text("\n".join(lines) + "\n")
    text = _error(dataset_overrides(data, "my_rewards.contains_solution"))
    assert text.startswith(f"task.path={data}: line 17 is not JSON (")


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda tmp: tmp / "empty", "holds no .jsonl, .json, .parquet, .csv file"),
        (lambda tmp: Path("/dev/zero"), "/dev/zero is not a regular file or folder"),
        (lambda tmp: Path("/dev/null"), "/dev/null is not a regular file or folder"),
        (lambda tmp: tmp / "empty.jsonl", "is empty (0 bytes)"),
    ],
    ids=["empty folder", "/dev/zero", "/dev/null", "empty file"],
)
def test_empty_unreadable_and_special_inputs_are_refused(tmp_path, monkeypatch, make, words):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty.jsonl").write_text("")
    path = make(tmp_path)
    text = _error(_data(tmp_path, path))
    assert text.startswith(f"task.path={path}: ") and words in text, text


def test_a_prompt_column_of_the_wrong_type_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "lists.jsonl"
    rows = [{"prompt": "What is 1 + 1?", "solution": "2"}, {"prompt": ["What is", "2 + 2?"], "solution": "4"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = _error(_data(tmp_path, path))
    assert text.startswith("task.prompt_column=prompt: row 2 of ") and "holds a list of str" in text
    assert "a prompt is text or a conversation" in text


def test_a_huge_line_is_refused_with_bounded_memory(tmp_path):
    """A 40 MiB one-line file: refused at the line limit; the check's process grows by far less
    than the file (it reads at most MAX_LINE bytes of a line)."""
    write_data(tmp_path, chat=False)
    path = tmp_path / "huge.jsonl"
    with open(path, "w") as fh:
        fh.write('{"prompt": "' + "x" * (40 << 20) + '"}\n')
    code = (
        "import resource, sys; sys.path.insert(0, sys.argv[1]); from helpers.config import compose\n"
        "from grpo_sweep.config.local import validate_here\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "try:\n    validate_here(compose(sys.argv[2:]), cuda=False)\nexcept Exception as err:\n    print('ERROR', err)\n"
        "print('GREW_KIB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)\n"
    )
    args = [sys.executable, "-c", code, str(ROOT / "tests"), *dataset_overrides(path, "my_rewards.contains_solution")]
    out = subprocess.run(args, capture_output=True, text=True, cwd=tmp_path, timeout=120).stdout
    assert f"ERROR task.path={path}: line 1 is longer than 16 MiB" in out, out
    grew = int(out.split("GREW_KIB")[1])
    assert grew < 36 * 1024, grew  # under the file's 40 MiB: the line was never held whole


@pytest.mark.slow
def test_bad_data_is_one_line_before_any_model_loads(tmp_path):
    """`python train.py` on a malformed file: exit 1, one line, no trial started."""
    data = write_data(tmp_path, chat=False)
    data.write_text(data.read_text() + "{not json\n")
    run_dir = tmp_path / "run"
    out = train_here([*dataset_overrides(data, "my_rewards.contains_solution"), f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-2000:]
    assert f"task.path={data}: line 49 is not JSON" in out.stderr and "Traceback" not in out.stderr
    assert not (run_dir / "metrics.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    "reward, words",
    [
        ("none", "returned NoneType None (a list with one number per completion is needed)"),
        ("nan", "returned nan at index 0 (each value must be finite)"),
        ("strings", "returned str 'good' at index 0 (each value must be a number)"),
        ("short", "returned 1 values for 4 completions"),  # a micro-batch of 4 (per_device_train_batch_size)
    ],
)
def test_a_bad_reward_return_fails_the_trial_naming_the_function(tmp_path, reward, words):
    data = write_data(tmp_path, chat=False)
    (tmp_path / "bad_rewards.py").write_text(BAD_REWARDS)
    run_dir = tmp_path / "run"
    train_here(
        [*dataset_overrides(data, f"bad_rewards.{reward}"), "model.init=random", "trial.steps=1", f"hydra.run.dir={run_dir}"],
        cwd=tmp_path,
    )
    record = load_metrics(run_dir)
    assert record["status"] == "failed"
    assert record["error"] == f"RewardFunctionError: reward function bad_rewards.{reward} {words}", record["error"]


def test_export_errors_name_their_cause(tmp_path):
    """A pruned trial is in trials.csv but never ran; a folder that does not exist is no sweep."""
    from grpo_sweep.report.export import ExportError, best_trial_number, trial_run_dir

    (tmp_path / "trials.csv").write_text("number,state,status,run_dir\n3,PRUNED,pruned,\n")
    with pytest.raises(ExportError) as err:
        trial_run_dir(tmp_path, 3)
    assert (
        str(err.value)
        == f"trial 3 in {tmp_path / 'trials.csv'} never ran (PRUNED, status pruned): it has no run directory to export"
    )
    with pytest.raises(ExportError) as err:
        best_trial_number(tmp_path / "nowhere")
    assert str(err.value) == f"{tmp_path / 'nowhere'}: no such directory"
