"""One owner for the node's status record (node/peer/node_status.py `NodeStatus`) and for its re-sync requests
(node/peer/resyncs.py `Resyncs`): every change goes through their methods, so "who writes field X" has one answer.

The status check reads the product source: outside NodeStatus's own methods, no assignment, augmented assignment,
`del` or mutating call (append, setdefault, …) may reach a field of a status object (`<anything>.status`, a name
bound to one, a parameter named `status`, or a name bound to one of its fields)."""

from __future__ import annotations

import ast
import dataclasses
import json
from pathlib import Path

from pathswarm.node.peer.node_status import LOSS_POINTS_KEPT, ROUNDS_KEPT, NodeStatus
from pathswarm.node.peer.resyncs import Resyncs
from pathswarm.node.peer.status import write_status
from pathswarm.node.peer.vouch import Vouched

ROOT = Path(__file__).resolve().parents[2]
FIELDS = {f.name for f in dataclasses.fields(NodeStatus)}
MUTATORS = {"append", "extend", "insert", "pop", "popitem", "clear", "update", "setdefault", "remove", "add",
            "discard", "sort", "reverse", "__setitem__", "__delitem__"}
STATUS_FILE_FIELDS = [
    "peer_id", "path", "round", "inner_step", "loss", "tokens_per_s", "tokens_trained", "tokens_merged",
    "tokens_unmerged", "tokens_reduced", "digest_mismatches", "splits_healed", "tokens_reduced_discarded",
    "tokens_resumed", "tokens_discarded", "tokens_lost", "counters_id", "last_group", "reachable", "client",
    "optimizer", "micro_batch", "checkpointing", "bytes_sent", "bytes_received", "val_loss_before", "val_loss_after",
    "rounds_failed", "rounds_retried", "rounds_missed", "training_since", "train_wall_s", "digests", "module_rounds",
    "reducers", "loss_curve", "loss_history", "chunks_trained", "round_wire_s", "groups", "history", "checkpoint_round",
    "claims_read_late", "wait_max_s", "round_work_s", "audits", "audits_gathered", "distrusted", "state",
    "rounds_undone", "anchor_max_abs", "chains", "split_discarded", "heals"]


class _Scope:
    """One function's names for a status object (`st = self.status`, a parameter `status`) and for its fields
    (`work = self.status.round_work_s`)."""

    def __init__(self, fn):
        self.aliases = {a.arg for a in fn.args.args + fn.args.kwonlyargs if a.arg == "status"}
        self.field_aliases: set[str] = set()
        assigns = [n for n in ast.walk(fn) if isinstance(n, ast.Assign) and len(n.targets) == 1
                   and isinstance(n.targets[0], ast.Name)]
        self.aliases |= {n.targets[0].id for n in assigns if self.is_status(n.value)}
        self.field_aliases = {n.targets[0].id for n in assigns if isinstance(n.value, ast.Attribute)
                              and self.is_status(n.value.value) and n.value.attr in FIELDS}

    def is_status(self, e) -> bool:
        return (isinstance(e, ast.Name) and e.id in self.aliases) or (isinstance(e, ast.Attribute)
                                                                      and e.attr == "status")

    def field_of(self, e) -> str | None:
        """The status field `e` reaches through subscripts, attributes and method calls, if any."""
        while True:
            if isinstance(e, ast.Attribute) and self.is_status(e.value) and e.attr in FIELDS:
                return e.attr
            if isinstance(e, ast.Name):
                return e.id if e.id in self.field_aliases else None
            if isinstance(e, ast.Subscript):
                e = e.value
            elif isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute):
                e = e.func.value
            elif isinstance(e, ast.Attribute):
                e = e.value
            else:
                return None


def _status_writes(source: str) -> list[int]:
    """Lines that change a NodeStatus field other than through its methods."""
    found = set()
    for fn in ast.walk(ast.parse(source)):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        scope = _Scope(fn)
        for node in ast.walk(fn):
            targets = []
            if isinstance(node, (ast.Assign, ast.Delete)):
                targets = node.targets
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            for t in targets:
                for el in t.elts if isinstance(t, ast.Tuple) else [t]:
                    if not isinstance(el, ast.Name) and scope.field_of(el) is not None:
                        found.add(node.lineno)
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS
                    and scope.field_of(node.func.value) is not None):
                found.add(node.lineno)
    return sorted(found)


def test_the_check_sees_each_kind_of_write():
    source = '''
def f(self, status):
    self.status.loss = 1.0
    status.round += 1
    self.status.history[mid][r] = d
    self.status.rounds_missed.setdefault(mid, [0, 0])[0] += 1
    self.status.loss_curve.append(x)
    st = self.status
    st.tokens_trained, other = 3, 4
    work = self.status.round_work_s
    work[kind] = 1.0
    del status.digests[mid]
    n = self.status.round + len(self.status.groups.get(mid, {}))
    self.status.round_complete(1, 2)
    result.status = "failed"
'''
    assert _status_writes(source) == [3, 4, 5, 6, 7, 9, 11, 12]


def test_only_the_status_record_writes_its_fields():
    offenders = {}
    for path in sorted((ROOT / "node").rglob("*.py")):
        lines = _status_writes(path.read_text(encoding="utf-8"))
        if lines:
            offenders[str(path.relative_to(ROOT))] = lines
    assert offenders == {}, f"write the status through NodeStatus's methods (node/peer/node_status.py): {offenders}"


def test_the_status_file_keeps_its_fields(tmp_path):
    """Tests and the dashboard read the status file's JSON: its fields stay what they were."""
    status = NodeStatus()
    status.started_as("me")
    status.round_settled("shared", 30, 0)
    status.round_applied("shared", 1, "d1", ["me", "a"], late=False, diverged=False)
    write_status(str(tmp_path / "s.json"), status, durable={"shared": 1})
    got = json.loads((tmp_path / "s.json").read_text())
    assert list(got) == STATUS_FILE_FIELDS
    assert got["history"] == {"shared": {"1": "d1"}} and got["groups"] == {"shared": {"1": ["me", "a"]}}
    assert got["tokens_merged"] == 30 and got["last_group"] == 2
    write_status(str(tmp_path / "s.json"), status, durable={"shared": 0})  # a round not checkpointed yet
    assert json.loads((tmp_path / "s.json").read_text())["history"] == {"shared": {}}


def test_status_methods_count_as_the_fields_say():
    st = NodeStatus()
    st.round_settled("L0M0", 10, 5)  # only the shared module's tokens are counted (every node holds it)
    st.round_failed("L0M0")
    st.round_applied("L0M0", 3, "d3", ["a"], late=True, diverged=True)
    assert (st.tokens_merged, st.rounds_failed, st.digest_mismatches) == (0, 1, 1)
    assert st.rounds_missed == {"L0M0": [1, 1]} and st.history == {"L0M0": {}}  # a diverged round is not recorded
    st.round_settled("shared", 100, 0)
    st.split_healed("shared", 60, 20)
    assert (st.tokens_merged, st.tokens_discarded, st.tokens_reduced_discarded, st.splits_healed) == (40, 60, 20, 1)
    st.stepped(1, 4.0, 200)  # a step's tokens count as trained when it ends, not when its chunk does
    st.stepped(2, 2.0, 300)
    assert st.tokens_trained == 500
    st.chunk_trained([4.0, 2.0], 500, 2.0, first_round=7)
    assert (st.loss, st.tokens_trained, st.tokens_per_s, st.loss_history) == (3.0, 500, 250.0, [(8, 3.0)])
    st.waited(0.5)
    st.waited(0.25)
    st.spent_on("send", 0.1)
    # bounded over a long run: the newest rounds of each module, numbered on
    for r in range(1, ROUNDS_KEPT + 41):
        st.round_applied("L0M0", r, f"d{r}", ["a", "b"], late=False, diverged=False)
    assert sorted(map(int, st.history["L0M0"])) == list(range(41, ROUNDS_KEPT + 41)) == sorted(map(int,
                                                                                                st.groups["L0M0"]))
    for _ in range(LOSS_POINTS_KEPT + 9):
        st.chunk_trained([1.0], 10, 1.0, first_round=7)
    assert len(st.loss_curve) == len(st.loss_history) == LOSS_POINTS_KEPT
    assert st.loss_history[-1] == (7 + LOSS_POINTS_KEPT + 10, 1.0) and st.chunks_trained == LOSS_POINTS_KEPT + 10
    st.spent_on("send", 0.2)
    assert st.wait_max_s == 0.5 and st.round_work_s == {"send": 0.3}


def test_resync_requests_have_one_owner():
    r = Resyncs()
    vouched = Vouched(7, "d7", ("a", "b"))
    r.request_check("m", "reducer")
    assert r.pending("m") and r.checks() == [("m", "reducer")] and r.take() == []
    r.close_check("m")
    assert not r.pending("m")
    r.request_from("m", "a", vouched)
    r.request_from("m", "b")  # a later request without a vouched state keeps the earlier one's
    r.request_from("n", "c")
    got = r.take()
    assert [(x.module, x.peer, x.expect) for x in got] == [("m", "b", vouched), ("n", "c", None)]
    assert r.take() == [] and not r.pending("m") and not r.pending("n")
