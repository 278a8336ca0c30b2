"""The dashboard's state and Prometheus metrics (node/app/dashboard/view.py, prom.py): history kept across polls,
bounds on what peers wrote, and the figures /metrics exports equal the summary's."""

import re

from prometheus_client.parser import text_string_to_metric_families

from pathswarm.node.app.dashboard.prom import metrics_text, registry_for
from pathswarm.node.app.dashboard.view import MAX_POINTS, MAX_TEXT, DashboardState, node_view
from pathswarm.node.peer.node_status import NodeStatus
from pathswarm.protocol.records import ModuleAnnouncement, NodeMetrics, PathClaim
from pathswarm.protocol.spec import SwarmSpec
from pathswarm.protocol.swarm_view import SwarmView, summarize

SPEC = SwarmSpec(name="<b>bold</b>" + "x" * 300, levels=(2, 2))
A, B = "QmPeerA", "QmPeerB"


def summary_at(r: int, loss: float, size: int = 2) -> dict:
    anns = {mid: [ModuleAnnouncement(module_id=mid, round=r, digest="ab", peer_id=p, numel=100) for p in (A, B)]
            for mid in ("shared", "L0M0")}
    metrics = [NodeMetrics(path=(0, 0), peer_id=p, round=r, loss=loss, tokens_per_s=50.0 * (i + 1),
                           bytes_sent=1000 * r, bytes_received=900 * r, history=((r, loss),), inner_steps=10 * r,
                           tokens_trained=640 * r, groups=(("shared", r, size),), rounds_missed=(("L0M0", 1, 0),))
               for i, p in enumerate((A, B))]
    claims = [PathClaim(path=(0, 0), peer_id=p, tokens_per_s=50.0, round=r, expires_at=1e9) for p in (A, B)]
    return summarize(SPEC, SwarmView(claims=claims, modules=anns, metrics=metrics))


def test_history_outlives_the_records_window_and_the_grid_follows_the_spec():
    state = DashboardState(SPEC, started=0.0)
    for r in range(1, 6):  # each poll's records carry only the newest round
        state.update(summary_at(r, 3.0 - 0.1 * r, size=2 if r < 5 else 1), now=float(r))
    snap = state.snapshot()
    path = next(p for p in snap["paths"] if p["path"] == "0.0")
    assert [r for r, _ in path["loss_by_round"]] == [1, 2, 3, 4, 5] and abs(path["loss_by_round"][-1][1] - 2.5) < 1e-12
    shared = next(m for m in snap["modules"] if m["module"] == "shared")
    assert shared["group_sizes"] == [[1, 2], [2, 2], [3, 2], [4, 2], [5, 1]]
    assert [[c["module"] for c in level] for level in snap["grid"]] == [["L0M0", "L0M1"], ["L1M0", "L1M1"]]
    assert snap["grid"][0][0]["round"] == 5 and snap["grid"][0][0]["holders"] == [A, B]
    assert snap["grid"][1][1]["round"] is None and snap["shared"]["replicas_agree"] is True
    assert snap["series"]["t"] == [1.0, 2.0, 3.0, 4.0, 5.0] and snap["series"]["tokens_per_s"][-1] == 150.0
    assert snap["totals"]["tokens_trained"] == 2 * 640 * 5 and snap["polls"] == 5
    # the spec's name is free text from whoever created the swarm: cut to a bound (the page writes it as text)
    assert len(snap["swarm"]["name"]) == MAX_TEXT and snap["swarm"]["name"].startswith("<b>bold</b>")


def test_series_are_bounded_and_a_failed_poll_keeps_the_last_figures():
    state = DashboardState(SPEC, started=0.0)
    s = summary_at(3, 2.0)
    for i in range(MAX_POINTS + 10):
        state.update(s, now=float(i))
    state.failed("TimeoutError: the DHT did not answer\n" + "y" * 1000)
    snap = state.snapshot()
    assert len(snap["series"]["t"]) == MAX_POINTS and snap["series"]["t"][0] == 10.0
    assert snap["error"].startswith("TimeoutError") and len(snap["error"]) == 300 and snap["poll_errors"] == 1
    assert snap["totals"] == {k: v for k, v in s["totals"].items()} and state.status() is s


def test_nothing_polled_yet_is_an_empty_page_not_an_error():
    snap = DashboardState(SPEC).snapshot()
    assert snap["paths"] == [] and snap["grid"] == [] and snap["shared"] is None and snap["totals"] == {}


def test_metrics_export_the_summarys_figures_under_conventional_names():
    state = DashboardState(SPEC, started=0.0)
    s = summary_at(4, 2.25)
    state.update(s, now=100.0)
    status = NodeStatus(peer_id=A, path="0.0", round=4, inner_step=40, loss=2.25, tokens_per_s=50.0,
                        tokens_trained=2560, bytes_sent=4000, bytes_received=3600, optimizer="adamw",
                        loss_history=[(3, 2.4), (4, 2.25)], groups={"shared": {"3": [A, B], "4": [A]}})
    text = metrics_text(registry_for(state, lambda: node_view(status))).decode()
    samples = {(smp.name, tuple(sorted(smp.labels.items()))): smp.value
               for fam in text_string_to_metric_families(text) for smp in fam.samples}
    t = s["totals"]
    assert samples[("pathswarm_swarm_nodes", ())] == t["nodes"]
    assert samples[("pathswarm_swarm_sent_bytes_total", ())] == t["bytes_sent"] == 8000
    assert samples[("pathswarm_swarm_ddp_fp32_bytes_total", ())] == t["ddp_fp32_bytes"] > 0
    assert samples[("pathswarm_swarm_tokens_per_second", ())] == 150.0
    assert samples[("pathswarm_path_loss", (("path", "0.0"),))] == 2.25
    assert samples[("pathswarm_module_round", (("module", "L0M0"),))] == 4
    assert samples[("pathswarm_module_replicas_agree", (("module", "shared"),))] == 1
    assert samples[("pathswarm_module_group_size", (("module", "shared"),))] == 2
    assert samples[("pathswarm_module_rounds_late_total", (("module", "L0M0"),))] == 2
    assert ("pathswarm_module_replicas_agree", (("module", "L1M1"),)) not in samples  # nothing to compare: absent
    assert samples[("pathswarm_module_holders_left_behind", (("module", "shared"),))] == 0
    assert samples[("pathswarm_module_splits_healed", (("module", "shared"),))] == 0
    assert samples[("pathswarm_node_round", ())] == 4 and samples[("pathswarm_node_inner_steps_total", ())] == 40
    assert samples[("pathswarm_node_info", (("optimizer", "adamw"), ("path", "0.0"), ("peer_id", A)))] == 1
    assert samples[("pathswarm_dashboard_last_poll_timestamp_seconds", ())] == 100.0
    view = node_view(status)
    assert view["last_groups"] == {"shared": {"round": 4, "peers": [A]}} and view["loss_by_round"][-1] == [4, 2.25]


def test_one_definition_of_the_loss_for_the_page_metrics_and_plots():
    """The loss's unit and meaning are stated once (view.py): the page gets them in /api/dashboard, /metrics' help
    repeats them, and the demo's and `swarm status --plot`'s axes name the same unit."""
    from pathlib import Path

    from pathswarm.node.app.dashboard.view import LOSS_DEFINITION, LOSS_LATEST, LOSS_PER_ROUND, LOSS_UNIT

    assert LOSS_UNIT == "nats/byte" and "bits per byte = loss / ln 2" in LOSS_DEFINITION
    state = DashboardState(SPEC, started=0.0)
    state.update(summary_at(2, 2.5), now=1.0)
    assert DashboardState(SPEC).snapshot()["loss"] == state.snapshot()["loss"] == {
        "unit": LOSS_UNIT, "definition": LOSS_DEFINITION, "latest": LOSS_LATEST, "per_round": LOSS_PER_ROUND}
    status = NodeStatus(peer_id=A, path="0.0", loss=2.5)
    helps = {fam.name: fam.documentation for fam in text_string_to_metric_families(
        metrics_text(registry_for(state, lambda: node_view(status))).decode())}
    assert LOSS_DEFINITION in helps["pathswarm_path_loss"] and LOSS_LATEST in helps["pathswarm_path_loss"]
    assert LOSS_DEFINITION in helps["pathswarm_node_loss"]
    assert "per token" not in " ".join(helps.values())
    app = Path(__file__).resolve().parents[2] / "node" / "app"
    for plot in ("demo.py", "fmt.py"):
        labels = re.findall(r'set_ylabel\("([^"]*loss[^"]*)"\)', (app / plot).read_text())
        assert labels and all(label.endswith(f"({LOSS_UNIT})") for label in labels), (plot, labels)
