"""How swarms start: the bootstrap peer (`peer.py`, `pathswarm bootstrap`) and the list of public swarms
(`public_swarm.toml`). A new swarm's spec is made by `pathswarm swarm init` (node/app/swarm_init.py)."""
