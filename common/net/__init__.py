"""Sockets as both sides use them: CURVE keys (curve.py), binding (sockets.py), default ports (ports.py)."""
