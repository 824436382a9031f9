"""The study's schema (grpo_sweep.study.attrs): one spelling of every key and status, and studies
written with plain strings still load, resume and report."""

from __future__ import annotations

import ast
import logging

import yaml
from helpers.runners import ROOT

from grpo_sweep.study.attrs import ConfirmationState, Key, Status

SRC = ROOT / "src"
ATTRS = SRC / "grpo_sweep" / "study" / "attrs.py"
# Strings equal to a status that mean something else, by module: a fault's kind (trial.fault), the
# torch._dynamo counter, vLLM's scheduler attribute, metrics.json's `oom` details, the pre-screen's count.
NOT_A_STATUS = {
    "grpo_sweep/config/schema.py": {"oom", "slow"},
    "grpo_sweep/trial/faults.py": {"oom", "slow"},
    "grpo_sweep/trial/backends/trl.py": {"ok"},
    "grpo_sweep/trial/backends/vllm_patches.py": {"running"},
    "hydra_plugins/grpo_optuna_sweeper/outcome.py": {"oom"},
    "hydra_plugins/grpo_optuna_sweeper/preview.py": {"pruned"},
}
ATTR_READS = {"user_attrs", "system_attrs"}
ATTR_WRITES = {"set_user_attr", "set_system_attr"}


def _docstrings(tree: ast.AST) -> set[int]:
    nodes = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, nodes) and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)
    }


def _key_literal(node: ast.AST) -> str | None:
    """The string literal a study attribute is looked up or written by, if any:
    x.user_attrs["k"], x.user_attrs.get("k"), x.set_user_attr("k", v) (and the system_attrs forms)."""
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr in ATTR_READS:
        key = node.slice
    elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id in ATTR_READS:
        key = node.slice
    elif isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Attribute):
        called, owner = node.func.attr, node.func.value
        is_get = called == "get" and isinstance(owner, ast.Attribute) and owner.attr in ATTR_READS
        if not (is_get or called in ATTR_WRITES):
            return None
        key = node.args[0]
    else:
        return None
    return key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else None


def _declared_key_literal(node: ast.AST, declared: set[str]) -> str | None:
    """A declared key spelled as a literal where a trial's attributes are built or read under another
    name: attrs["k"], attrs.get("k"), attrs.setdefault("k", v), attrs={"k": v}, user_attrs={"k": v}."""
    if isinstance(node, ast.Subscript) and _named_attrs(node.value):
        keys = [node.slice]
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("get", "setdefault"):
        keys = node.args[:1] if _named_attrs(node.func.value) else []
        keys += [
            k
            for kw in node.keywords
            if kw.arg in ("attrs", "user_attrs") and isinstance(kw.value, ast.Dict)
            for k in kw.value.keys
        ]
    elif isinstance(node, ast.Call):
        keys = [
            k
            for kw in node.keywords
            if kw.arg in ("attrs", "user_attrs") and isinstance(kw.value, ast.Dict)
            for k in kw.value.keys
        ]
    else:
        return None
    spelled = [k.value for k in keys if isinstance(k, ast.Constant) and k.value in declared]
    return spelled[0] if spelled else None


def _named_attrs(node: ast.AST) -> bool:
    return (isinstance(node, ast.Name) and node.id == "attrs") or (isinstance(node, ast.Attribute) and node.attr == "attrs")


def test_no_module_spells_a_status_or_a_study_key():
    """Outside attrs.py no module writes a status as a string literal, nor reads or writes a study
    attribute by a literal key: each is Status.X or Key.X, so a renamed one is renamed once."""
    statuses = {s.value for s in Status}
    declared = {k.value for k in Key}
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        if path == ATTRS:
            continue
        rel = path.relative_to(SRC).as_posix()
        tree = ast.parse(path.read_text(), str(path))
        docs = _docstrings(tree)
        allowed = NOT_A_STATUS.get(rel, set())
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in statuses and node.value not in allowed and id(node) not in docs:
                bad.append(f"{rel}:{node.lineno}: status {node.value!r} (use Status)")
            key = _key_literal(node) or _declared_key_literal(node, declared)
            if key is not None:
                bad.append(f"{rel}:{node.lineno}: study attribute {key!r} by a literal (use Key)")
    assert not bad, "\n".join(bad)


def test_the_scan_sees_a_literal_status_and_key():
    """The scan above finds what it forbids (so its silence means something)."""
    tree = ast.parse('t.set_user_attr("status", "ok")\nx = t.user_attrs.get("worker")\ny = s.system_attrs["fixed_params"]')
    keys = [k for n in ast.walk(tree) if (k := _key_literal(n))]
    assert keys == ["status", "worker", "fixed_params"]
    built = ast.parse('Outcome("FAIL", attrs={"error": e})\nattrs["levers"] = x\nq.enqueue_trial(p, user_attrs={"preset": n})')
    declared = {k.value for k in Key}
    assert [k for n in ast.walk(built) if (k := _declared_key_literal(n, declared))] == ["error", "levers", "preset"]
    assert "ok" in {s.value for s in Status}


def test_keys_and_statuses_are_their_strings():
    """A member equals its stored string and serialises as it, so nothing stored changes."""
    import json

    assert Status.OK == "ok" and Key.CONFIRMATION == "confirmation" and f"{Status.WORKER_DIED}" == "worker_died"
    assert json.dumps({Key.STATUS: Status.SURPLUS}) == '{"status": "surplus"}'
    assert len({s.value for s in Status}) == len(Status) and len({k.value for k in Key}) == len(Key)


def test_confirmation_state_reads_and_writes_the_stored_dict():
    """from_dict reads each shape confirmation has stored; to_dict writes the same keys in the same order."""
    chosen = {"finalists": [], "runs": [], "rounds": 0, "spent_s": 0.0, "stopped": "one config", "why": "fewer"}
    round_one = {
        "finalists": [1, 0],
        "runs": [{"confirms": 1, "params": {"b": 2}, "preset": None}],
        "rounds": 1,
        "spent_s": 10.0,
        "sweep_s": 60.0,
        "budget": 1.0,
        "sigma": None,
        "leader": 1,
    }
    given = {**round_one, "runs": [], "finalists": [], "chosen": [1, 0], "given_back": True, "stopped": "budget", "why": "w"}
    for stored in (chosen, round_one, given):
        state = ConfirmationState.from_dict(stored)
        assert state is not None and state.to_dict() == stored and list(state.to_dict()) == list(stored)
    assert ConfirmationState.from_dict(None) is None and ConfirmationState.from_dict({}) is None


def _old_study(path):
    """A study as the sweeper wrote it before attrs.py: plain-string keys and statuses, the confirmation
    state a plain dict one round in. b=2 (trial 1) was confirmed once by trial 4; trial 5 is surplus."""
    import optuna
    from optuna.distributions import CategoricalDistribution
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    storage = JournalStorage(JournalFileBackend(str(path)))
    study = optuna.create_study(study_name="old", storage=storage, direction="maximize")
    space = {"b": CategoricalDistribution([1, 2, 3])}
    rows = [(1, 100.0, {}), (2, 180.0, {}), (1, 104.0, {"repeats": 0}), (3, 90.0, {}), (2, 176.0, {"confirms": 1})]
    for b, value, extra in rows:
        study.enqueue_trial({"b": b}, user_attrs=extra)
        trial = study.ask(space)
        for key, attr in {"overrides": [f"b={b}"], "status": "ok", "peak_memory_bytes": 500, "budget_bytes": 1000}.items():
            trial.set_user_attr(key, attr)
        trial.set_user_attr("worker", "host:1")
        study.tell(trial, value)
    surplus = study.ask(space)
    surplus.set_user_attr("status", "surplus")
    study.tell(surplus, state=optuna.trial.TrialState.FAIL)
    study.set_user_attr("objective", "tokens_per_s")
    study.set_user_attr(
        "confirmation",
        {
            "finalists": [1, 0],
            "runs": [{"confirms": 1, "params": {"b": 2}, "preset": None}],
            "rounds": 1,
            "spent_s": 10.0,
            "sweep_s": 50.0,
            "budget": 1.0,
            "sigma": 0.02,
            "leader": 1,
        },
    )


def test_a_study_written_with_plain_strings_loads_resumes_and_reports(tmp_path):
    """A journal written with plain strings (the sweeper before attrs.py) loads through the storage
    opener, resumes confirmation where it stood (its finalists, its queued runs, its round; the
    surplus trial's seconds left out), and its summary and report read its statuses and state."""
    from grpo_sweep.report.build import build_for_study
    from grpo_sweep.study import best as best_rule
    from grpo_sweep.study.storage import load_study
    from hydra_plugins.grpo_optuna_sweeper import confirm
    from hydra_plugins.grpo_optuna_sweeper.standings import best_trial
    from hydra_plugins.grpo_optuna_sweeper.summary import write_summary

    journal = tmp_path / "study.journal"
    _old_study(journal)
    study = load_study(f"journal:{journal}")
    log = logging.getLogger("test")
    assert ConfirmationState.from_dict(study.user_attrs[Key.CONFIRMATION]).rounds == 1
    assert confirm.choose(study, 3, log) == [1, 0] and confirm.planned(study) == 1 and not confirm.given_back(study)
    assert best_rule.competing(study.user_attrs) == [1, 0] and best_trial(study).number == 1
    assert confirm.seconds_so_far(study, lambda t: 10.0) == (50.0, 10.0)
    # b=2 (180, 176) against b=1 (100, 104): separated at any noise, so confirmation stops here.
    assert confirm.next_round(study, 1.0, log, seconds_of=lambda t: 10.0) is False
    state = load_study(f"journal:{journal}").user_attrs["confirmation"]
    assert (state["stopped"], state["rounds"], state["finalists"], len(state["runs"])) == ("separated", 1, [1, 0], 1)
    write_summary(
        study,
        tmp_path,
        storage_url=f"journal:{journal}",
        objective="tokens_per_s",
        top_k=3,
        headroom=None,
        quiet=True,
    )
    best = yaml.safe_load((tmp_path / "best.yaml").read_text())
    assert best["best_trial"] == 1 and best["confirmation"]["stopped"] == "separated" and best["confirmation"]["runs"] == 1
    out, trials = build_for_study(study, tmp_path / "report.html")
    assert sorted(t.status for t in trials) == ["ok"] * 5 + ["surplus"]
    assert "id=confirmation-note" in out.read_text()


def test_best_yaml_writes_a_status_as_its_string():
    """An in-memory study hands back the members themselves; best.yaml still holds plain strings."""
    from hydra_plugins.grpo_optuna_sweeper.summary import _plain_dumper

    assert yaml.dump({Key.STATUS: Status.OK}, Dumper=_plain_dumper()) == "status: ok\n"
