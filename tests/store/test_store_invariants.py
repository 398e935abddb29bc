"""The run key and atomic writes of :mod:`ccu.store.results`: each test kills a mutation that
survived the suite (a review's mutation testing, 2026-11-29)."""

import json
import os

import pytest

from ccu.store import results


def test_every_config_key_field_changes_the_key():  # R2
    base = {
        "dataset": "digits",
        "method": "Base",
        "profile": {},
        "settings": {},
        "seed": 0,
        "data_checksum": "a" * 64,
        "out_distribution": "x",
        "ccu_version": "1",
        "precision": "float32",
    }
    for k in (
        "dataset",
        "method",
        "seed",
        "data_checksum",
        "out_distribution",
        "ccu_version",
        "precision",
    ):
        other = dict(base, **{k: "b" * 64 if k == "data_checksum" else "other"})
        assert results.config_key(other) != results.config_key(base), k
        assert not results.same_config(other, base), k


def test_a_write_killed_before_the_rename_leaves_the_old_file(tmp_path, monkeypatch):  # R6
    p = tmp_path / "a.json"
    results.write_json(p, {"a": 1})

    def die(fd):
        raise OSError("killed")

    monkeypatch.setattr(os, "fsync", die)
    with pytest.raises(OSError):
        results.write_json(p, {"b": 2})
    assert json.loads(p.read_text()) == {"a": 1}
