"""What runs on a volunteer machine: muP model, data and routing, inner and outer optimisation, simulator, checkpoints, CLI."""
