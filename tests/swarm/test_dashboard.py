"""The dashboard end to end, in a real browser: a local swarm of real CLI processes on 127.0.0.1, `pathswarm swarm
dashboard` and `node run --dashboard`, their pages opened in headless Chromium (tests/browser.py; skipped with the
reason where none is installed).

The swarm's name is markup (`<img onerror=…>`, `<script>`): whoever creates a swarm chooses it, and every dashboard
shows it. The page must show it as text and run none of it.
"""

import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pathswarm.node.app.dashboard.view import LOSS_DEFINITION, LOSS_UNIT
from pathswarm.node.app.local_swarm import LocalSwarm
from pathswarm.protocol.spec import AveragingSpec, InnerOptSpec

from ..browser import browser
from ..conftest import cli, tiny_spec, wait_until
from ..dashboard_page import empty_charts, legend_values, losses_side_by_side, save_screenshot, unexplained

pytestmark = pytest.mark.timeout(300)

DOCS = Path(__file__).resolve().parents[2] / "docs"
HOSTILE_NAME = ('<img src=x onerror="document.body.dataset.pwned=1"><script>document.body.dataset.pwned=2</script>'
                '&amp;"\'')


def get(url: str, timeout: float = 10.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def url_in(path, what: str) -> str:
    """The first http://127.0.0.1:PORT/ URL a process printed in its log."""
    def found():
        m = re.search(r"http://127\.0\.0\.1:\d+/", path.read_text(errors="replace")) if path.exists() else None
        return m.group(0) if m else None
    return wait_until(found, 90, what)


def text_of(driver, css: str) -> str:
    """The text of the first element `css` selects ("" when none), read in one script: the page replaces its rows at
    every refresh, so an element found first and read after may be gone."""
    return driver.execute_script("const e = document.querySelector(arguments[0]); return e ? e.textContent : '';",
                                 css)


def page_numbers(driver) -> dict:
    """What the swarm page shows: each module's round and holders, each path's nodes, round and loss, totals."""
    return driver.execute_script("""
        const cell = (row, f) => row.querySelector(`[data-field="${f}"]`).textContent;
        const modules = {}, paths = {};
        for (const tr of document.querySelectorAll("#modules tbody tr")) {
          modules[tr.firstChild.textContent] = {round: cell(tr, "round"), holders: cell(tr, "holders"),
                                                agree: cell(tr, "replicas-agree")};
        }
        for (const tr of document.querySelectorAll("#paths tbody tr")) {
          paths[tr.firstChild.textContent] = {nodes: cell(tr, "nodes"), round: cell(tr, "round"),
                                              loss: cell(tr, "loss")};
        }
        return {modules, paths, nodes: document.getElementById("total-nodes").textContent,
                tokens: document.getElementById("total-tokens-trained").textContent,
                polls: document.body.dataset.polls || "0"};
    """)


def expected_numbers(status: dict) -> dict:
    """The same figures from `swarm status --json`'s summary, formatted as the page formats them."""
    def fmt(v):
        return "–" if v is None else str(v)
    agree = {True: "yes", False: "NO", None: "–"}
    return {
        "modules": {m["module"]: {"round": fmt(m["round"]), "holders": str(m["holders"]),
                                  "agree": agree[m["replicas_agree"]]} for m in status["modules"]},
        "paths": {p["path"]: {"nodes": str(len(p["nodes"])), "round": fmt(p["last_round"]),
                              "loss": "–" if p["loss"] is None else f"{p['loss']:.4f}"} for p in status["paths"]},
        "nodes": f"{status['totals']['nodes']:,}", "tokens": f"{status['totals']['tokens_trained']:,}",
    }


def test_the_dashboard_shows_the_swarm_live_in_a_browser(tmp_path, monkeypatch):
    monkeypatch.setenv("PATHSWARM_HOME", str(tmp_path / "home"))
    spec = tiny_spec().replace(name=HOSTILE_NAME, inner=InnerOptSpec(steps=10, batch_size=4, warmup_steps=2),
                               averaging=AveragingSpec(grace_s=4.0, timeout_s=20.0, claim_ttl_s=20.0))
    spec_path = tmp_path / "swarm.toml"
    spec_path.write_text(spec.to_toml())
    driver = browser()  # skips here, before any process starts, where no browser is installed
    board_log = tmp_path / "dashboard.log"
    board = None
    try:
        with LocalSwarm(spec_path, tmp_path / "run") as swarm:
            maddr = swarm.start_bootstrap()
            swarm.start_node("a", seed=0, extra=["--wait-peers", "2", "--dashboard", "0"])
            swarm.start_node("b", seed=1, extra=["--wait-peers", "2"])
            with open(board_log, "wb") as log:
                board = subprocess.Popen([sys.executable, "-m", "pathswarm", "swarm", "dashboard", "--join",
                                          spec.swarm_id, "--initial-peer", maddr, "--port", "0", "--poll-s", "1"],
                                         stdout=log, stderr=subprocess.STDOUT)
            url = url_in(board_log, "the swarm dashboard's URL")
            node_url = url_in(tmp_path / "run" / "a.log", "node a's dashboard URL")
            peer_a = swarm.wait_ready("a")["peer_id"]

            # The swarm's page: live, it follows the rounds without a reload.
            driver.get(url)
            # Caught as early as the page is: no curve yet comes with the empty state, a curve without it
            wait_until(lambda: driver.execute_script("return document.body.dataset.polls"), 60, "the first draw")
            early = driver.execute_script("""
                const empty = document.querySelector("#loss-chart .empty");
                return {curves: document.querySelectorAll("#loss-chart canvas").length,
                        empty: empty && empty.textContent,
                        reach: document.getElementById("total-reachability").textContent};""")
            assert (early["curves"] == 0 and "no round finished yet" in early["empty"]) or (
                early["curves"] == 1 and early["empty"] is None), early
            assert "/" not in early["reach"], early  # words, never "0 / 0 / 0"
            shared_round = lambda: text_of(driver, '#modules tr td[data-module="shared"] + td')  # noqa: E731
            first = int(wait_until(lambda: shared_round().isdigit() and int(shared_round()) >= 1 and shared_round(),
                                   120, "the page to show the shared module's first round"))
            wait_until(lambda: shared_round().isdigit() and int(shared_round()) > first, 120,
                       f"the page to move past round {first} by itself")
            polls = int(driver.execute_script("return document.body.dataset.polls"))
            assert polls >= 2  # the page fetched again and again: no reload did this

            # One loss, one unit: the page says what it is, as /metrics' help does; the legends show the newest
            # values without a hover, and the table's "last round" column is the loss chart's last point
            assert text_of(driver, "#loss-text") == LOSS_DEFINITION + "."
            assert text_of(driver, "#th-loss-latest") == f"latest loss ({LOSS_UNIT})"
            assert text_of(driver, "#th-loss-round") == f"last round's loss ({LOSS_UNIT})"

            def same_loss():  # a path nobody trains has no curve and "–" in its row
                side = losses_side_by_side(driver)
                return (any(len(v) == 2 for v in side.values())
                        and all(v == ["–"] or (len(v) == 2 and v[1].split(" (round")[0] == v[0] != "–")
                                for v in side.values()))
            wait_until(same_loss, 30, "each path's legend value to equal its table row")
            for chart in ("loss-chart", "group-chart", "rate-chart"):
                values = legend_values(driver, chart)
                assert values and "--" not in values.values(), (chart, values)
            assert unexplained(driver) == []

            # the screenshot, a few rounds in: into docs/ (what docs/OPERATING.md shows) with
            # PATHSWARM_UPDATE_SCREENSHOT=1, else beside the test's files (a test run leaves the tree as it was)
            wait_until(lambda: shared_round().isdigit() and int(shared_round()) >= first + 5, 120, "a few more rounds")
            shot = DOCS / "dashboard.png" if os.environ.get("PATHSWARM_UPDATE_SCREENSHOT") else tmp_path / "page.png"
            save_screenshot(driver, shot)
            assert 10_000 < shot.stat().st_size < 300_000

            # The name is markup: shown as text, none of it run
            assert text_of(driver, "#swarm-name") == HOSTILE_NAME
            assert driver.execute_script("return document.body.dataset.pwned === undefined "
                                         "&& document.querySelectorAll('header img, header script').length === 0")
            assert driver.title == f"pathswarm · {HOSTILE_NAME}"

            # The node's own page: its peer id, its round moving, peers of its last groups
            driver.get(node_url)
            wait_until(lambda: text_of(driver, "#node-peer") == peer_a and text_of(driver, "#node-round").isdigit()
                       and int(text_of(driver, "#node-round")) >= 1, 90, "node a's page to show its round")
            r = int(text_of(driver, "#node-round"))
            wait_until(lambda: (t := text_of(driver, "#node-round")).isdigit() and int(t) > r, 90,
                       "node a's page to follow its rounds")
            assert peer_a[-8:] in text_of(driver, "#node-groups tbody")
            node_metrics = get(node_url + "metrics").decode()
            assert re.search(r"^pathswarm_node_round \d+", node_metrics, re.M)
            assert re.search(r"^pathswarm_swarm_nodes 2\.0$", node_metrics, re.M)
            errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]  # (reading them clears them)
            assert not errors, errors

            # Back to the swarm's page (the node's would log its server's end as an error), and stop the nodes: the
            # records stand still, and the page, /api/status and `swarm status --json` agree
            driver.get(url)
            for name in ("a", "b"):
                swarm.signal(name, signal.SIGTERM)
            assert swarm.wait_nodes(["a", "b"], timeout_s=90) == {"a": 0, "b": 0}
            with pytest.raises((urllib.error.URLError, ConnectionError)):
                get(node_url, timeout=3)  # the node's dashboard left with it
            out = tmp_path / "status.json"

            def agree():
                proc = cli("swarm", "status", "--join", spec.swarm_id, "--initial-peer", maddr, "--json", str(out))
                assert proc.returncode == 0, proc.stderr[-2000:]
                api = json.loads(get(url + "api/status"))
                page = page_numbers(driver)
                want = expected_numbers(json.loads(out.read_text()))
                got = {k: page[k] for k in want}
                return (expected_numbers(api) == want and got == want) or None
            wait_until(agree, 60, "the page, /api/status and `swarm status --json` to agree")
            api = json.loads(get(url + "api/status"))
            assert api["swarm_id"] == spec.swarm_id and api["name"] == HOSTILE_NAME
            assert sum(m["round"] or 0 for m in api["modules"]) > 0 and api["totals"]["tokens_trained"] > 0
            assert api["totals"]["ddp_fp32_bytes"] > api["totals"]["bytes_sent"] > 0

            # Prometheus' /metrics says what the API says
            samples = {s.name: s.value for fam in text_string_to_metric_families(get(url + "metrics").decode())
                       for s in fam.samples if not s.labels}
            assert samples["pathswarm_swarm_sent_bytes_total"] == api["totals"]["bytes_sent"]
            assert samples["pathswarm_swarm_tokens_trained_total"] == api["totals"]["tokens_trained"]

            # Nothing beyond this origin was requested, and the page logged no error
            origin = url.rstrip("/")
            resources = driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
            assert resources and all(r.startswith(origin + "/") for r in resources), resources
            errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
            assert not errors, errors

    finally:
        driver.quit()
        if board is not None:
            board.send_signal(signal.SIGTERM)
            try:
                code = board.wait(20)
            except subprocess.TimeoutExpired:
                board.kill()
                raise
    assert code == 0, board_log.read_text()[-2000:]


def test_before_the_first_round_the_page_says_so_and_every_field_is_explained():
    """Staged summaries (no swarm): claims with no metrics yet, then three rounds. Before round 1 the charts say why
    they are empty and reachability is "not measured yet" (not "0 / 0 / 0" beside "nodes 2"); after, the legends
    show the newest values unhovered and the group-size lines, all at 2 members, are drawn apart."""
    from pathswarm.node.app.dashboard.server import Dashboard
    from pathswarm.node.app.dashboard.view import DashboardState
    from pathswarm.protocol.records import ModuleAnnouncement, NodeMetrics, PathClaim
    from pathswarm.protocol.spec import SwarmSpec
    from pathswarm.protocol.swarm_view import SwarmView, summarize

    spec = SwarmSpec(name="staged", levels=(2, 2))
    peers = {"QmPeerA": (0, 0), "QmPeerB": (1, 1)}
    stage = {"round": 0}

    def poll():
        r = stage["round"]
        claims = [PathClaim(path=path, peer_id=p, tokens_per_s=0.0, round=r, expires_at=1e9)
                  for p, path in peers.items()]
        anns = {mid: [ModuleAnnouncement(module_id=mid, round=r, digest="ab", peer_id=p, numel=100) for p in peers]
                for mid in spec.all_module_ids()}
        metrics = [NodeMetrics(path=path, peer_id=p, round=r, loss=2.5 + 0.01 * i, tokens_per_s=1000.0,
                               bytes_sent=100 * r, bytes_received=100 * r, inner_steps=10 * r, reachable=True,
                               history=tuple((k, 3.0 - 0.1 * k + 0.01 * i) for k in range(1, r + 1)),
                               groups=tuple((mid, k, 2) for mid in spec.all_module_ids() for k in range(1, r + 1)))
                   for i, (p, path) in enumerate(peers.items())] if r else []
        return summarize(spec, SwarmView(claims=claims, modules=anns, metrics=metrics))

    driver = browser()
    try:
        with Dashboard(DashboardState(spec), poll, port=0, poll_s=0.2) as board:
            driver.get(board.url)
            wait_until(lambda: text_of(driver, "#total-nodes") == "2", 30, "the first poll on the page")
            assert empty_charts(driver) == {
                "loss-chart": f"loss per round, per path ({LOSS_UNIT}): no round finished yet: the curve starts "
                              "with the first round",
                "group-chart": "members merged per round, per module (lines offset up to ±0.3 to stay apart): no round "
                               "finished yet: each module's group size shows here once a round merges",
                "rate-chart": "tokens/s over time, all nodes: no throughput yet: a node reports its tokens/s once it "
                              "finishes its first round"}
            assert text_of(driver, "#total-reachability") == "not measured yet"
            # every field says what it is: units, and the words the issue found unexplained
            assert unexplained(driver) == []
            assert text_of(driver, "#loss-text") == LOSS_DEFINITION + "."
            assert text_of(driver, "#th-loss-latest") == f"latest loss ({LOSS_UNIT})"
            assert "open swarm (anyone may join)" in text_of(driver, "#swarm-kind")
            assert re.search(r"records read \d+ times", text_of(driver, "#updated"))
            assert driver.execute_script("return document.getElementById('updated').title").startswith("When ")
            assert text_of(driver, "#modules thead").count("holders at newest round") == 1

            stage["round"] = 3
            wait_until(lambda: not empty_charts(driver), 30, "the charts once rounds are in")
            assert text_of(driver, "#total-reachability") == "2 reachable · 0 behind NAT"
            assert losses_side_by_side(driver)["path 0.0"] == ["2.7000", "2.7000"]
            assert losses_side_by_side(driver)["path 1.1"] == ["2.7100", "2.7100"]
            assert legend_values(driver, "group-chart") == {"outer round": "3", **{m: "2" for m in
                                                            spec.all_module_ids()}}
            assert "--" not in legend_values(driver, "rate-chart").values()
            # five modules merging groups of 2: five lines, none on top of another
            ends = driver.execute_script("return charts['group-chart'].plot.data.slice(1).map(ys => ys[ys.length - 1])")
            assert len(ends) == 5 and len(set(ends)) == 5 and all(abs(y - 2) < 0.31 for y in ends), ends
            assert not [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    finally:
        driver.quit()


def test_the_server_is_read_only_serves_only_its_files_and_says_when_it_has_no_figures_yet():
    from pathswarm.node.app.dashboard.server import Dashboard, DashboardError, start_dashboard
    from pathswarm.node.app.dashboard.view import DashboardState

    spec = tiny_spec()
    gate = {"ready": False}

    def poll():
        if not gate["ready"]:
            raise TimeoutError("the DHT did not answer")
        return {"swarm_id": spec.swarm_id, "name": spec.name, "paths": [], "modules": [],
                "totals": {"nodes": 0, "paths_served": 0, "tokens_per_s": 0.0, "tokens_trained": 0, "bytes_sent": 0,
                           "bytes_received": 0, "ddp_fp32_bytes": 0, "bytes_vs_ddp": None, "nodes_reporting": 0,
                           "nodes_reachable": 0, "nodes_behind_nat": 0}}

    with Dashboard(DashboardState(spec), poll, port=0, poll_s=0.2) as board:
        with pytest.raises(urllib.error.HTTPError) as e:
            get(board.url + "api/status")
        assert e.value.code == 503  # no figures yet: said, not an empty success
        wait_until(lambda: "TimeoutError" in json.loads(get(board.url + "api/dashboard"))["error"], 10,
                   "the failed poll to show")
        gate["ready"] = True
        wait_until(lambda: json.loads(get(board.url + "api/dashboard"))["error"] == "", 10, "a good poll")
        assert json.loads(get(board.url + "api/status"))["swarm_id"] == spec.swarm_id
        with urllib.request.urlopen(board.url, timeout=10) as r:
            csp = r.headers["Content-Security-Policy"]
            assert "script-src 'self'" in csp and "default-src 'none'" in csp and b"dashboard.js" in r.read()
        assert get(board.url + "static/uPlot.iife.min.js").startswith(b"/*! https://github.com/leeoniya/uPlot")
        for bad in ("static/..%2f..%2fserver.py", "static/index.html", "static/..%2F__init__.py", "etc/passwd"):
            with pytest.raises(urllib.error.HTTPError) as e:
                get(board.url + bad)
            assert e.value.code == 404, bad
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(urllib.request.Request(board.url + "api/status", data=b"{}", method="POST"),
                                   timeout=10)
        assert e.value.code == 405
        # the port is taken: a clear error, or (the demo) any free port
        with pytest.raises(DashboardError, match=f"127.0.0.1:{board.port}"):
            Dashboard(DashboardState(spec), poll, port=board.port).start()
        other = start_dashboard(DashboardState(spec), poll, "127.0.0.1", board.port, fallback=True)
        try:
            assert other.port != board.port and get(other.url).startswith(b"<!doctype html>")
        finally:
            other.stop()


def test_the_cli_needs_a_peer_and_names_a_taken_port(tmp_path):
    import socket

    spec = tiny_spec()
    spec_path = tmp_path / "swarm.toml"
    spec_path.write_text(spec.to_toml())
    proc = cli("swarm", "dashboard", "--swarm", str(spec_path))
    assert proc.returncode == 2 and "--initial-peer is required" in proc.stderr
    proc = cli("swarm", "dashboard", "--swarm", str(spec_path), "--initial-peer", "/ip4/127.0.0.1/tcp/1",
               "--port", "70000")
    assert proc.returncode == 2 and "70000 is not in the range" in proc.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = cli("node", "run", "--swarm", str(spec_path), "--offline", "--max-rounds", "1", "--dashboard",
                   str(port))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert f"error: dashboard could not listen on 127.0.0.1:{port}" in proc.stderr
