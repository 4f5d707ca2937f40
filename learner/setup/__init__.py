"""`open_session` and its builders: every part of a run, built once, in order."""
