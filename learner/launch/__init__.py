"""Starting processes: the Ray launch (cluster.py, its config, plan and supervisor), the local actors and the
check of their flags."""
