"""What peers agree on and say: the swarm spec and its id (networking arrives with the node issue)."""
