"""Prometheus' `/metrics`: the swarm's and the node's figures in its text format, through prometheus_client.

A collector reads the dashboard's state at every scrape (nothing is copied into global metric objects), and each
server has a registry of its own, so two dashboards in one process never mix. Names follow Prometheus' conventions:
`pathswarm_` prefix, base units (bytes, seconds), `_total` for counters. Counters come from the nodes' own running
totals, so a node that restarts makes them fall: `rate()` reads that as a reset, as it should.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from pathswarm.node.app.dashboard.view import LOSS_DEFINITION, LOSS_LATEST, DashboardState


class _Families:
    """Metric families by name, each filled with one sample per label set."""

    def __init__(self) -> None:
        self.families: dict[str, Metric] = {}
        """Every family, in the order of /metrics."""
        self._numeric: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}

    def add(self, kind: type[GaugeMetricFamily | CounterMetricFamily], name: str, doc: str, value,
            **labels: str) -> None:
        if value is None:
            return
        family = self._numeric.get(name)
        if family is None:
            family = self.families[name] = self._numeric[name] = kind(name, doc, labels=sorted(labels))
        family.add_metric([labels[k] for k in sorted(labels)], float(value))


G, C = GaugeMetricFamily, CounterMetricFamily


class DashboardCollector(Collector):
    def __init__(self, state: DashboardState, node: Callable[[], dict | None] = lambda: None):
        self.state, self.node = state, node

    def collect(self) -> Iterator[Metric]:
        snap = self.state.snapshot(self.node())
        f = _Families()
        _add_dashboard(f, snap)
        if snap["totals"]:
            _add_swarm(f, snap["totals"], snap["swarm"]["n_paths"])
        for p in snap["paths"]:
            _add_path(f, p)
        for m in snap["modules"]:
            _add_module(f, m)
        if snap["node"] is not None:
            _add_node(f, snap["node"])
        yield from f.families.values()


def _add_dashboard(f: _Families, snap: dict) -> None:
    f.add(C, "pathswarm_dashboard_polls", "Polls of the swarm's DHT records by this dashboard.", snap["polls"])
    f.add(C, "pathswarm_dashboard_poll_errors", "Polls that got no answer.", snap["poll_errors"])
    if snap["updated"]:
        f.add(G, "pathswarm_dashboard_last_poll_timestamp_seconds", "Unix time of the last good poll.",
              snap["updated"])


def _add_swarm(f: _Families, t: dict, n_paths: int) -> None:
    f.add(G, "pathswarm_swarm_nodes", "Nodes with a live path claim.", t["nodes"])
    f.add(G, "pathswarm_swarm_paths_served", "Paths with at least one node.", t["paths_served"])
    f.add(G, "pathswarm_swarm_paths", "Paths of the swarm's grid.", n_paths)
    f.add(G, "pathswarm_swarm_tokens_per_second", "Training throughput of all nodes.", t["tokens_per_s"])
    f.add(C, "pathswarm_swarm_tokens_trained", "Tokens trained by the reporting nodes.", t["tokens_trained"])
    f.add(C, "pathswarm_swarm_sent_bytes", "Bytes the reporting nodes sent.", t["bytes_sent"])
    f.add(C, "pathswarm_swarm_received_bytes", "Bytes the reporting nodes received.", t["bytes_received"])
    f.add(C, "pathswarm_swarm_ddp_fp32_bytes", "Bytes fp32 data-parallel would have sent for the same "
          "inner steps (ring all-reduce every step).", t["ddp_fp32_bytes"])
    f.add(G, "pathswarm_swarm_nodes_reachable", "Reporting nodes peers can dial.", t["nodes_reachable"])
    f.add(G, "pathswarm_swarm_nodes_behind_nat", "Reporting nodes peers cannot dial.", t["nodes_behind_nat"])


def _add_path(f: _Families, p: dict) -> None:
    f.add(G, "pathswarm_path_nodes", "Nodes training the path.", p["n_nodes"], path=p["path"])
    f.add(G, "pathswarm_path_tokens_per_second", "Throughput of the path's nodes.", p["tokens_per_s"],
          path=p["path"])
    f.add(G, "pathswarm_path_round", "Newest outer round a node of the path completed.", p["round"],
          path=p["path"])
    # the page's definition, word for word (view.py): one unit and one meaning for every loss shown
    f.add(G, "pathswarm_path_loss", f"The path's {LOSS_DEFINITION}; {LOSS_LATEST}.", p["loss"], path=p["path"])


def _add_module(f: _Families, m: dict) -> None:
    mid = m["module"]
    f.add(G, "pathswarm_module_round", "Newest outer round announced for the module.", m["round"], module=mid)
    f.add(G, "pathswarm_module_holders", "Peers announcing the module.", m["holders"], module=mid)
    agree = m["replicas_agree"]
    f.add(G, "pathswarm_module_replicas_agree", "1 when every round announced by two or more holders has "
          "one digest, 0 when a round has two.", None if agree is None else int(agree), module=mid)
    f.add(G, "pathswarm_module_split_rounds", "Rounds announced with two digests.", len(m["split_rounds"]),
          module=mid)
    f.add(C, "pathswarm_module_rounds_late", "Rounds the reporting nodes got late.", m["rounds_late"],
          module=mid)
    f.add(C, "pathswarm_module_rounds_failed", "Rounds that failed for the reporting nodes.",
          m["rounds_failed"], module=mid)
    f.add(G, "pathswarm_module_holders_left_behind", "Holders rounds behind the newest, or stalled by their own "
          "report.", len({p for p, _ in m["left_behind"]}), module=mid)
    f.add(G, "pathswarm_module_splits_healed", "Healed splits the holders' metrics name.", m["splits_healed"],
          module=mid)
    if m["group_sizes"]:
        f.add(G, "pathswarm_module_group_size", "Members merged in the module's newest reported round.",
              m["group_sizes"][-1][1], module=mid)


def _add_node(f: _Families, node: dict) -> None:
    info = InfoMetricFamily("pathswarm_node", "This node.", labels=["peer_id", "path", "optimizer"])
    info.add_metric(["peer_id", "path", "optimizer"], {"peer_id": node["peer_id"], "path": node["path"],
                                                      "optimizer": node["optimizer"]})
    f.families["pathswarm_node"] = info
    f.add(G, "pathswarm_node_round", "Outer rounds this node completed.", node["round"])
    f.add(C, "pathswarm_node_inner_steps", "Inner steps this node took.", node["inner_step"])
    f.add(G, "pathswarm_node_loss", f"This node's newest {LOSS_DEFINITION}.", node["loss"])
    f.add(G, "pathswarm_node_tokens_per_second", "This node's training throughput.", node["tokens_per_s"])
    f.add(C, "pathswarm_node_tokens_trained", "Tokens this node trained.", node["tokens_trained"])
    f.add(C, "pathswarm_node_sent_bytes", "Bytes this node sent.", node["bytes_sent"])
    f.add(C, "pathswarm_node_received_bytes", "Bytes this node received.", node["bytes_received"])
    f.add(C, "pathswarm_node_rounds_failed", "Module rounds that failed for this node.", node["rounds_failed"])


def registry_for(state: DashboardState, node: Callable[[], dict | None] = lambda: None) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DashboardCollector(state, node))
    return registry


def metrics_text(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
