"""What a person runs: the CLI, the demo, a local swarm of node processes, and their displays."""
