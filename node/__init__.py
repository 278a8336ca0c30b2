"""What runs on a volunteer machine, by concern: `model/` (muP model, router, data), `train/` (inner and
outer optimisation, the round rule, simulator, checkpoints), `peer/` (the running node) and `app/` (CLI,
demo, local swarm, displays)."""
