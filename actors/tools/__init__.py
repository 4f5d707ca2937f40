"""The actor side's commands besides the actor itself: check-args, demos, doctor, eval, relay (`python -m
actors TOOL`)."""
