"""Training without a network: inner AdamW, outer Nesterov, the round rule, the worker, the simulator,
checkpoints, evaluation and muP tuning."""
