"""Reading flags out of a command line, for the recipe tests (deploy/)."""

from __future__ import annotations


def value(argv: list[str], flag: str) -> str:
    """The one word after `flag`, which must appear exactly once."""
    assert argv.count(flag) == 1, f"{flag} appears {argv.count(flag)} times in {argv}"
    return argv[argv.index(flag) + 1]


def values(argv: list[str], flag: str) -> list[str]:
    """The words after `flag` up to the next flag (a tuple-valued flag such as --adb.serials)."""
    rest = argv[argv.index(flag) + 1 :]
    return rest[: next((i for i, w in enumerate(rest) if w.startswith("--")), len(rest))]
