"""The web dashboard of a swarm or of one node: live page, `/api/status`, `/api/dashboard` and Prometheus' `/metrics`.

view.py (pure) keeps what the page shows across polls, prom.py turns it into Prometheus' metrics, server.py serves
both over HTTP (aiohttp, in a thread of its own), static/ holds the page and its chart library (uPlot, MIT).
"""
