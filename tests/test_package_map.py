"""trial/package_map.py: the map of import packages to distributions that transformers and TRL each
build at import, answered from one cache file per install, and the same as the stock answer."""

from __future__ import annotations

import importlib.metadata
import inspect
import json
import os
import sys

from grpo_sweep.trial import package_map


def test_the_map_is_the_stock_one_from_the_cache_file_and_from_memory(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_SWEEP_CACHE", str(tmp_path))
    monkeypatch.setattr(package_map, "_memo", {})
    stock = package_map.STOCK()
    assert package_map.packages_distributions() == stock
    (entry,) = (tmp_path / package_map.SUBDIR).iterdir()
    assert entry.name == f"{package_map.key()}.json" and json.loads(entry.read_text()) == stock

    def not_again():
        raise AssertionError("computed again")

    monkeypatch.setattr(package_map, "STOCK", not_again)
    monkeypatch.setattr(package_map, "_memo", {})  # another process: the file answers
    first = package_map.packages_distributions()
    assert first == stock
    first[next(iter(first))].append("changed by a caller")
    assert package_map.packages_distributions() == stock  # each caller gets its own copy


def test_a_new_install_is_a_new_key_and_a_damaged_file_is_computed_again(tmp_path, monkeypatch):
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.setattr(sys, "path", [*sys.path, str(site)])
    before = package_map.key()
    (site / "new_dist-1.0.dist-info").mkdir()  # what an install does to the directory that holds it
    os.utime(site, ns=(0, os.stat(site).st_mtime_ns + 1_000_000))
    assert package_map.key() != before

    cache = tmp_path / "cache"
    monkeypatch.setenv("GRPO_SWEEP_CACHE", str(cache))
    monkeypatch.setattr(package_map, "_memo", {})
    path = cache / package_map.SUBDIR / f"{package_map.key()}.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"torch": ["torch"], "cut": [')  # torn by a kill mid-write
    assert package_map.packages_distributions() == package_map.STOCK()
    assert json.loads(path.read_text()) == package_map.STOCK()


def test_the_cache_keeps_only_its_newest_entries(tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_SWEEP_CACHE", str(tmp_path))
    monkeypatch.setattr(package_map, "_memo", {})
    folder = tmp_path / package_map.SUBDIR
    folder.mkdir()
    for i in range(package_map.KEEP + 3):
        (folder / f"old{i}.json").write_text("{}")
        os.utime(folder / f"old{i}.json", ns=(0, i))
    package_map.packages_distributions()
    kept = {p.name for p in folder.iterdir()}
    assert len(kept) == package_map.KEEP and f"{package_map.key()}.json" in kept and "old0.json" not in kept


def test_an_unwritable_cache_still_answers(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("GRPO_SWEEP_CACHE", str(blocker))  # its package-map/ can never be created
    monkeypatch.setattr(package_map, "_memo", {})
    assert package_map.packages_distributions() == package_map.STOCK()
    assert blocker.is_file()


def test_transformers_and_trl_map_every_distribution_at_import_through_the_patched_call():
    """The targets: both modules set PACKAGE_DISTRIBUTION_MAPPING from importlib.metadata's function
    looked up at call time, so an upgrade that stops doing so (the patch is then dead) fails here. (The
    map itself depends on sys.path, which tests extend after these imports: compared above, not here.)"""
    import transformers.utils.import_utils as transformers_imports
    import trl.import_utils as trl_imports

    assert importlib.metadata.packages_distributions is package_map.packages_distributions
    for module in (transformers_imports, trl_imports):
        assert "PACKAGE_DISTRIBUTION_MAPPING = importlib.metadata.packages_distributions()" in inspect.getsource(module)
        assert module.PACKAGE_DISTRIBUTION_MAPPING["trl"] == ["trl"]
