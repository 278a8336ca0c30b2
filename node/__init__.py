"""What runs on a volunteer machine: muP model, data and routing, inner and outer optimisation,
simulator, the networked node runtime, checkpoints and the CLI."""
