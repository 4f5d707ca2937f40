"""The one error type for bad device output, with a short `kind` so callers can count failures by cause."""

from __future__ import annotations


class DeviceOutputError(ValueError):
    """A device answered with something unusable (unparsable, oversized, hostile, out of range)."""

    def __init__(self, kind: str, detail: str = "") -> None:
        self.kind = kind
        self.detail = detail
        super().__init__(f"{kind}: {detail}" if detail else kind)
