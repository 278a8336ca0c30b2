"""How swarms start: bootstrap peers, the public swarm list, swarm creation (later issue)."""
