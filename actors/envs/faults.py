"""Device faults: how any backend (the emulator model, a real device over adb) says a step or reset failed.

The actor catches `DeviceFault`, sends the interrupted episode as truncated, counts the fault by `kind`
(`device_<kind>` in its stats), and keeps serving its other environments.
"""

from __future__ import annotations


class DeviceFault(Exception):
    """A step or reset failed on the device; `elapsed_s` is how long the caller waited for it."""

    kind: str = "fault"

    def __init__(self, elapsed_s: float = 0.0, message: str | None = None):
        self.elapsed_s = float(elapsed_s)
        super().__init__(message or f"device {self.kind} after {self.elapsed_s:.3f} s")


class DeviceHang(DeviceFault):
    """The command did not return before its timeout."""

    kind = "hang"


class DeviceCrash(DeviceFault):
    """The device died; every step fails until `reset()` restarts it."""

    kind = "crash"


class DeviceDisconnected(DeviceFault):
    """The connection to the device (or to the adb server) dropped, or the device left adb."""

    kind = "disconnect"


class DeviceBadOutput(DeviceFault):
    """The device answered with something unusable; `detail` is the parser's kind (bad_xml, bad_png, ...)."""

    kind = "bad_output"

    def __init__(self, detail: str, message: str | None = None, elapsed_s: float = 0.0):
        self.detail = detail
        super().__init__(
            elapsed_s, f"{detail}: {message}" if message else f"unusable device output: {detail}"
        )


class DeviceCommandFailed(DeviceFault):
    """A command the backend needs (not the agent's action) exited non-zero."""

    kind = "command_failed"


FAULT_KINDS = ("hang", "crash", "disconnect", "bad_output", "command_failed")
