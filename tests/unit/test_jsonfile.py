"""Atomic file writes: the new contents replace the old in one step, and nothing is left beside them."""

from __future__ import annotations

import json

import pytest

from pathswarm.jsonfile import write_json_atomic, write_text_atomic


def test_a_json_file_is_written_then_replaced_whole(tmp_path):
    path = tmp_path / "deep" / "status.json"
    write_json_atomic(path, {"b": 1, "a": [1.5, "x"]}, sort_keys=True)
    assert path.read_text() == '{\n "a": [\n  1.5,\n  "x"\n ],\n "b": 1\n}\n'
    write_json_atomic(path, {"round": 2}, durable=True)
    assert json.loads(path.read_text()) == {"round": 2}
    assert [p.name for p in path.parent.iterdir()] == ["status.json"]


def test_a_failed_write_keeps_the_old_contents_and_leaves_no_temporary_file(tmp_path):
    path = write_text_atomic(tmp_path / "LATEST", "round-000001\n")
    with pytest.raises(TypeError):
        write_json_atomic(path, {"not json": object()})
    assert path.read_text() == "round-000001\n"
    assert [p.name for p in tmp_path.iterdir()] == ["LATEST"]
    write_json_atomic(path, {"value": object()}, default=lambda o: "object")
    assert json.loads(path.read_text()) == {"value": "object"}
