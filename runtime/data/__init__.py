"""Datasets (plans on the driver, ops on the workers): lazy plans compiled into one
op per stage, sources, lineage for recomputation, accumulators, the one-process
inline runner, and checkpoints. Sits on the shared vocabulary and paging/ only."""
