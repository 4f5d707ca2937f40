"""The ports this project uses by default, and the ones Android's adb owns on a machine.

adb's server listens on 5037; each emulator takes a console port N and an adb port N + 1 from 5554 up
(to 5682 with `-port`), and the adb server probes the odd loopback ports 5555-5585 for emulators'
adb ports, connecting to whatever listens there (a learner on 5555 shows up as an offline
`emulator-5554`); 5555 is also the port of `adb tcpip`. The defaults below stay clear of all of them.
"""

from __future__ import annotations

INGEST_PORT = 7555
"""The learner's ROUTER (handshakes, trajectories, acks)."""
PARAMS_PORT = 7556
"""The learner's PUB (parameter snapshots)."""
RELAY_PORT = 7557
"""A per-host relay's loopback PUB (`python -m actors relay`, `learner launch --relays`)."""

ADB_SERVER_PORT = 5037
EMULATOR_PORTS = range(5554, 5683)
"""Console and adb ports emulators may take (`emulator -port` accepts 5554-5682)."""
ADB_SCAN_PORTS = range(5555, 5586, 2)
"""The ports the adb server probes on loopback for emulators (each emulator's adb port, console + 1)."""


def adb_clash(port: int) -> str:
    """Why `port` collides with adb on the same machine, or "" when it does not."""
    if port == ADB_SERVER_PORT:
        return "it is the adb server's port"
    if port in ADB_SCAN_PORTS:
        return (
            f"the adb server probes 127.0.0.1:{ADB_SCAN_PORTS.start}-{ADB_SCAN_PORTS.stop - 1} for emulators and "
            f"would list whatever listens on {port} as an offline emulator-{port - 1}"
            + (" (5555 is also `adb tcpip`'s port)" if port == 5555 else "")
        )
    if port in EMULATOR_PORTS:
        return f"emulators take ports {EMULATOR_PORTS.start}-{EMULATOR_PORTS.stop - 1} (console N, adb N + 1)"
    return ""
