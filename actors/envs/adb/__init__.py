"""ADB backend: drive a real phone or emulator through an adb server, as SimPhone is driven in-process.

Everything a device sends back is untrusted; parsing lives in `uixml` and raises `DeviceOutputError`.
"""
