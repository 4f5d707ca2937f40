"""The update: trainer, train step (one jit), its sharding on the device mesh, several processes as one job,
checkpoints."""
