"""The prioritized replay, its checkpoint file, and the instruction critic with its filter."""
