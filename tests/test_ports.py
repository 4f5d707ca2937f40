"""Default ports stay out of adb's (5037, emulators 5554-5682, the server's probe of 5555-5585), and a
configured port inside them gets a warning from the learner and an explanation from doctor."""

from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest

from actors.config import ActorConfig
from actors.tools.doctor import check_device
from actors.tools.relay import RelayConfig
from common.net.ports import INGEST_PORT, PARAMS_PORT, RELAY_PORT, adb_clash
from learner.config import LearnerConfig
from learner.launch.config import LaunchConfig
from tests.conftest import START_S
from tests.test_faults import wait_for


@pytest.mark.parametrize(
    ("port", "why"),
    [
        (5037, "adb server's port"),
        (5554, "emulators take ports 5554-5682"),  # emulator-5554's console
        (5555, "offline emulator-5554 (5555 is also `adb tcpip`'s port)"),
        (5556, "emulators take ports 5554-5682"),  # emulator-5556's console, not probed
        (5585, "offline emulator-5584"),
        (5586, "emulators take ports 5554-5682"),
        (5682, "emulators take ports 5554-5682"),
    ],
)
def test_ports_inside_adbs_ranges_are_named(port, why):
    assert why in adb_clash(port)


@pytest.mark.parametrize("port", [0, 1024, 5036, 5038, 5553, 5683, 7555, 7556, 7557, 65535])
def test_other_ports_are_clear(port):
    assert adb_clash(port) == ""


def test_every_default_is_clear_of_adb():
    net = LearnerConfig().transport
    actor, relay = ActorConfig(), RelayConfig()
    assert (net.ingest_port, net.params_port) == (INGEST_PORT, PARAMS_PORT)
    assert (actor.ingest_port, actor.params_port) == (INGEST_PORT, PARAMS_PORT)
    assert (relay.params_port, relay.port, LaunchConfig().relay_port) == (PARAMS_PORT, RELAY_PORT, RELAY_PORT)
    for port in (INGEST_PORT, PARAMS_PORT, RELAY_PORT):
        assert adb_clash(port) == "", port


def test_doctor_explains_an_offline_emulator_that_may_be_another_program():
    offline = check_device(SimpleNamespace(serial="emulator-5554"), "offline", 1.0)
    assert any("127.0.0.1:5555" in e and "learner" in e for e in offline.errors), offline.errors
    phone = check_device(SimpleNamespace(serial="R58M1234"), "offline", 1.0)
    assert not any("127.0.0.1" in e for e in phone.errors), phone.errors


def _free_port_in(ports: range) -> int:
    for port in ports:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    pytest.skip(f"no free port in {ports}")


def test_learner_warns_about_a_port_inside_adbs_ranges(learner_process):
    port = _free_port_in(range(5600, 5683))  # emulators' range, outside what an adb server probes
    learner = learner_process("--ingest-port", str(port))
    wait_for(lambda: f"--ingest-port {port} collides with adb" in learner.log(), START_S, "the warning")
    assert learner.log().count("collides with adb") == 1  # --params-port 0 is clear
