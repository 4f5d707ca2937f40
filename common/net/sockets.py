"""Binding a ZeroMQ socket to a TCP port the way every server here does it: port 0 picks a free one,
and a port in use stops the program with a message that says what to do."""

from __future__ import annotations

import zmq


def bind_tcp(sock: zmq.Socket, host: str, port: int, hint: str) -> int:
    """Bind `sock` to tcp://host:port and return the port; `hint` ends the error for a port in use."""
    if port == 0:
        return sock.bind_to_random_port(f"tcp://{host}")
    try:
        sock.bind(f"tcp://{host}:{port}")
    except zmq.ZMQError as e:
        raise SystemExit(f"cannot bind tcp://{host}:{port}: {e}. {hint}") from e
    return port
