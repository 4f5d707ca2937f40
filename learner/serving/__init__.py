"""Parameters in use outside the update: the inference service (--inference remote) and wall-clock snapshots."""
