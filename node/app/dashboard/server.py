"""The dashboard's HTTP server (aiohttp) and the poller that feeds it, each on a thread of its own.

Routes, all read-only (GET and HEAD; anything else is 405):
  /               the page (static/index.html), live: it fetches /api/dashboard every few seconds
  /static/NAME    the page's script, style and chart library, from the package (nothing from the internet)
  /api/status     the JSON `pathswarm swarm status --json` prints, as of the last poll
  /api/dashboard  what the page draws: the status plus the history kept across polls and the node's own view
  /metrics        Prometheus' text format (prom.py)

It binds 127.0.0.1 unless told otherwise. Every response carries a Content-Security-Policy that allows scripts,
styles and requests from this origin only: even a string that slipped through as markup could run no script.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

from pathswarm.node.app.dashboard.prom import metrics_text, registry_for
from pathswarm.node.app.dashboard.view import DashboardState

logger = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
STATIC_FILES = {"dashboard.js": "text/javascript", "dashboard.css": "text/css", "uPlot.iife.min.js": "text/javascript",
                "uPlot.min.css": "text/css"}
DEFAULT_PORT = 8470
POLL_S = 5.0
"""Seconds between two reads of the swarm's records (each reads every claim, announcement and metrics record)."""
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


class DashboardError(ValueError):
    """The dashboard could not start (the port is taken, the address is not ours): the CLI prints it in one line."""


def make_app(state: DashboardState, node: Callable[[], dict | None] = lambda: None) -> web.Application:
    registry = registry_for(state, node)
    page = (STATIC / "index.html").read_bytes()

    def dumps(obj) -> str:
        return json.dumps(obj, separators=(",", ":"), allow_nan=False)

    async def index(_: web.Request) -> web.Response:
        return web.Response(body=page, content_type="text/html", charset="utf-8", headers=HEADERS)

    async def static(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in STATIC_FILES:  # a fixed list: no path from a request ever reaches the file system
            raise web.HTTPNotFound(headers=HEADERS)
        return web.Response(body=(STATIC / name).read_bytes(), content_type=STATIC_FILES[name], headers=HEADERS)

    async def api_status(_: web.Request) -> web.Response:
        status = state.status()
        if status is None:
            return web.json_response({"error": "no answer from the swarm yet"}, status=503, headers=HEADERS)
        return web.json_response(status, dumps=dumps, headers=HEADERS)

    async def api_dashboard(_: web.Request) -> web.Response:
        return web.json_response(state.snapshot(node()), dumps=dumps, headers=HEADERS)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=metrics_text(registry), headers={**HEADERS, "Content-Type":
                                                                  "text/plain; version=0.0.4; charset=utf-8"})

    app = web.Application()
    app.router.add_get("/", index)
    app.router.add_get("/static/{name}", static)
    app.router.add_get("/api/status", api_status)
    app.router.add_get("/api/dashboard", api_dashboard)
    app.router.add_get("/metrics", metrics)
    return app


class Dashboard:
    """Serve a DashboardState on host:port (port 0: any free one), polling `poll()` for summaries every poll_s.

    `poll` returns `swarm status`'s summary (it reads the DHT); an exception is shown on the page as the last
    error, and the page keeps the last good figures. `node` returns the node's own view, or None."""

    def __init__(self, state: DashboardState, poll: Callable[[], dict], host: str = "127.0.0.1",
                 port: int = DEFAULT_PORT, poll_s: float = POLL_S, node: Callable[[], dict | None] = lambda: None):
        self.state, self.poll, self.host, self.port, self.poll_s, self.node = state, poll, host, port, poll_s, node
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def start(self) -> Dashboard:
        started = threading.Event()
        failure: list[BaseException] = []

        def serve() -> None:
            loop = self._loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            try:
                self._runner = web.AppRunner(make_app(self.state, self.node), access_log=None)
                loop.run_until_complete(self._runner.setup())
                site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
                loop.run_until_complete(site.start())
                self.port = self._runner.addresses[0][1]  # the port picked when asked for 0
            except BaseException as e:  # noqa: BLE001 - reported to start()'s caller
                failure.append(e)
                started.set()
                return
            loop.call_soon(started.set)  # once the loop runs: a stop() from then on reaches it
            loop.run_forever()
            loop.run_until_complete(self._runner.cleanup())
            loop.close()

        t = threading.Thread(target=serve, name="dashboard-http", daemon=True)
        t.start()
        started.wait(30)
        if failure:
            raise DashboardError(f"dashboard could not listen on {self.host}:{self.port}: {failure[0]}")
        self._threads.append(t)
        p = threading.Thread(target=self._poll_loop, name="dashboard-poll", daemon=True)
        p.start()
        self._threads.append(p)
        return self

    def _poll_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.state.update(self.poll())
            except Exception as e:  # noqa: BLE001 - the page says so and keeps the last good figures
                logger.debug("dashboard poll failed: %s", e)
                self.state.failed(f"{type(e).__name__}: {e}")
            self._stop.wait(self.poll_s)

    def stop(self) -> None:
        self._stop.set()
        if self._loop is not None and not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(self._loop.stop)
            except RuntimeError:  # closed meanwhile
                pass
        for t in self._threads:
            t.join(timeout=10)

    def __enter__(self) -> Dashboard:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def start_dashboard(state: DashboardState, poll: Callable[[], dict], host: str, port: int,
                    node: Callable[[], dict | None] = lambda: None, fallback: bool = False,
                    poll_s: float = POLL_S) -> Dashboard:
    """Start a dashboard; with `fallback`, a taken port falls back to any free one (the demo: its URL is printed)."""
    try:
        return Dashboard(state, poll, host, port, poll_s, node).start()
    except DashboardError:
        if not fallback or port == 0:
            raise
        return Dashboard(state, poll, host, 0, poll_s, node).start()
