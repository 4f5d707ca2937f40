"""The scripted phone both fake adb layers serve: screens, a shell, files, settings and fault switches.

tests/fake_adb.py answers the adb *host* protocol with it (a fake adb server); tests/fake_adbd.py answers
the adb *transport* protocol with it (a fake device behind the real adb server). Either way the phone is
the same object, so a test scripts a phone once and runs it through whichever layer it exercises.

A phone is screens (uiautomator XML + PNG) linked by tap targets, a tiny file system for `uiautomator
dump` and `sync:` pulls, a settings table, `getprop` values, and a small shell: simple commands joined by
`;` or `&&`, `>/dev/null`, `2>/dev/null` and `2>&1`, `$?`, and `cat` of stdin.
"""

from __future__ import annotations

import shlex
import struct
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

DUMP_PATH = "/sdcard/window_dump.xml"


def make_png(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A valid solid-colour RGB PNG, built with zlib and struct only."""

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    row = b"\x00" + bytes(rgb) * width
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(row * height))
        + chunk(b"IEND", b"")
    )


@dataclass
class Screen:
    xml: bytes
    png: bytes
    links: dict[tuple[int, int, int, int], str] = field(default_factory=dict)
    """Tap target bounds -> name of the screen a tap inside them opens."""


@dataclass
class Faults:
    """Switches flipped by tests while a fake serves the phone. The first four are the transport's to
    apply (the fake adb server and the fake adbd each do it their way); the rest act in the phone itself."""

    gone: bool = False
    """The device left. Fake server: dropped from host:devices, transports fail with `device not found`.
    Fake adbd: its connection is closed and new ones are refused (the real server lists it offline)."""
    hang_up: bool = False
    """Connections are closed without an answer when a command arrives (a cable pulled mid-command)."""
    hang: bool = False
    """A hung device: commands are accepted and never answered."""
    delay_s: float = 0.0
    """A slow device: sleep after accepting a shell or sync request, before any output."""
    truncate_png: bool = False
    dump_xml: bytes | None = None
    """Replaces the current screen's XML in `uiautomator dump` (malformed, empty, hostile...)."""
    failing: dict[str, tuple[int, bytes]] = field(default_factory=dict)
    """Shell command prefix -> (exit code, stderr)."""
    dump_errors: list[bytes] = field(default_factory=list)
    """What the next `uiautomator dump`s print instead of dumping, one each, as a real device does on an
    animated screen ("ERROR: could not get idle state.") or a screen with no window ("ERROR: null root
    node returned by UiTestAutomationBridge."): on stderr, exit status 0, no file written."""


Handler = Callable[["FakePhone", list[str]], tuple[bytes, bytes, int]]


@dataclass
class FakePhone:
    screens: dict[str, Screen]
    current: str
    serial: str = "emulator-5554"
    state: str = "device"
    """What `adb devices` lists: "device", or "offline", "unauthorized", ... (then commands fail)."""
    size: tuple[int, int] = (1080, 2400)
    settings: dict[str, str] = field(default_factory=lambda: {"global/airplane_mode_on": "0"})
    files: dict[str, bytes] = field(default_factory=dict)
    faults: Faults = field(default_factory=Faults)
    props: dict[str, str] = field(default_factory=lambda: {"sys.boot_completed": "1"})
    """`getprop` values."""
    handlers: dict[str, Handler] = field(default_factory=dict)
    """Extra commands by argv[0] (e.g. "content", "dumpsys"), so a test can script what it checks."""
    commands: list[str] = field(default_factory=list)
    """Every simple shell command run, for assertions (a `a; b` line counts as two)."""
    typed: list[str] = field(default_factory=list)
    """Text received by `input text`, unescaped as the device shell would."""
    keys: list[str] = field(default_factory=list)
    """Key codes received by `input keyevent`."""
    awake: bool = True
    """The screen is on (`dumpsys power`: mWakefulness=Awake); KEYCODE_WAKEUP turns it on."""
    locked: bool = False
    """The keyguard shows (`dumpsys window policy`: mShowingLockscreen=true)."""
    secure_lock: bool = False
    """A PIN/pattern/password lock: `wm dismiss-keyguard` cannot dismiss it."""
    keyboard: tuple[int, int, int, int] | None = None
    """The on-screen keyboard's frame while it shows: taps inside it hit keys (recorded in `keys_hit`),
    not the app; BACK hides it and does nothing else."""
    keys_hit: list[tuple[int, int]] = field(default_factory=list)
    override_size: tuple[int, int] | None = None
    """`wm size`'s "Override size" line (a density or resolution override, as `wm size WxH` sets)."""

    def run(self, line: str, stdin: bytes = b"") -> tuple[bytes, bytes, int]:
        """Run a shell line: simple commands joined by `;` or `&&`, with `>/dev/null` and `2>&1`
        redirections and `$?`; (stdout, stderr, exit code of the last command run). `stdin` is what a
        `cat` without a file reads."""
        results = self._run_each(line, stdin)
        out = b"".join(o for o, _, _ in results)
        err = b"".join(e for _, e, _ in results)
        return out, err, results[-1][2] if results else 0

    def run_merged(self, line: str, stdin: bytes = b"") -> tuple[bytes, int]:
        """`run`, with stdout and stderr on one stream in the order written (as a raw `shell:` sees them)."""
        results = self._run_each(line, stdin)
        return b"".join(o + e for o, e, _ in results), results[-1][2] if results else 0

    def _run_each(self, line: str, stdin: bytes) -> list[tuple[bytes, bytes, int]]:
        """(stdout, stderr, exit code) of each simple command run."""
        tokens = _tokens(line)
        if tokens is None:
            return [(b"", b"/system/bin/sh: syntax error\n", 2)]
        results = []
        code, argv, joiner = 0, [], ";"
        for token in [*tokens, ";"]:
            if token not in (";", "&&"):
                argv.append(token)
                continue
            if argv and (joiner == ";" or code == 0):
                argv = [word.replace("$?", str(code)) for word in argv]
                results.append(self._simple(argv, stdin))
                code = results[-1][2]
            argv, joiner = [], token
        return results

    @staticmethod
    def reads_stdin(line: str) -> bool:
        """Whether `run(line)` reads stdin (it has a `cat` without a file): a device then waits for the
        client's input to end before it answers."""
        tokens = _tokens(line) or []
        ends = {";", "&&", "|"}
        return any(t == "cat" and (tokens[i + 1 :] or [";"])[0] in ends for i, t in enumerate(tokens))

    def _simple(self, argv: list[str], stdin: bytes = b"") -> tuple[bytes, bytes, int]:
        quiet_out = quiet_err = False
        while len(argv) >= 2 and argv[-2] in (">", "2>") and argv[-1] == "/dev/null":
            quiet_out, quiet_err = quiet_out or argv[-2] == ">", quiet_err or argv[-2] == "2>"
            argv = argv[:-2]
        if len(argv) >= 3 and argv[-3:] == ["2", ">", "&1"]:
            argv = argv[:-3]
        out, err, code = self._command(argv, stdin)
        return (b"" if quiet_out else out), (b"" if quiet_err else err), code

    def _command(self, argv: list[str], stdin: bytes = b"") -> tuple[bytes, bytes, int]:
        cmd = shlex.join(argv)
        self.commands.append(cmd)
        for prefix, (code, err) in self.faults.failing.items():
            if cmd.startswith(prefix):
                return b"", err, code
        if argv[:2] == ["input", "keyevent"] and argv[2:] in (["KEYCODE_WAKEUP"], ["224"]):
            self.awake = True  # the power state, whoever scripts the rest of `input`
        if self.keyboard is not None and (keyboard := self._keyboard_input(argv)) is not None:
            return keyboard
        if argv and argv[0] in self.handlers:
            return self.handlers[argv[0]](self, argv)
        match argv:
            case ["input", "tap", x, y]:
                return self._tap(int(float(x)), int(float(y)))
            case ["input", "swipe", *_]:
                return b"", b"", 0
            case ["input", "text", text]:
                self.typed.append(text.replace("%s", " "))
                return b"", b"", 0
            case ["input", "keyevent", key]:
                self.keys.append(key)
                return b"", b"", 0
            case ["dumpsys", "input_method"]:
                return f"  mInputShown={str(self.keyboard is not None).lower()}\n".encode(), b"", 0
            case ["dumpsys", "window", "InputMethod"]:
                if self.keyboard is None:
                    return b"WINDOW MANAGER WINDOWS (dumpsys window windows)\n", b"", 0
                left, top, right, bottom = self.keyboard
                frame = f"    mFrame=[{left},{top}][{right},{bottom}]\n"
                return b"  Window #4 Window{a1 u0 InputMethod}:\n" + frame.encode(), b"", 0
            case ["dumpsys", "power"]:
                state = "Awake" if self.awake else "Asleep"
                return f"POWER MANAGER (dumpsys power)\n  mWakefulness={state}\n".encode(), b"", 0
            case ["dumpsys", "window", "policy"]:
                shown = str(self.locked).lower()
                return f"WINDOW MANAGER POLICY STATE\n    mShowingLockscreen={shown}\n".encode(), b"", 0
            case ["wm", "dismiss-keyguard"]:
                self.locked = self.locked and self.secure_lock
                return b"", b"", 0
            case ["getprop", name]:
                return (self.props.get(name, "") + "\n").encode(), b"", 0
            case ["uiautomator", "dump", *rest]:
                path = rest[0] if rest else DUMP_PATH
                if self.faults.dump_errors:
                    return b"", self.faults.dump_errors.pop(0), 0
                xml = self.faults.dump_xml if self.faults.dump_xml is not None else self.screen.xml
                self.files[path] = xml
                return f"UI hierchary dumped to: {path}\n".encode(), b"", 0
            case ["screencap", "-p"]:
                png = self.screen.png
                return (png[: len(png) // 2] if self.faults.truncate_png else png), b"", 0
            case ["settings", "get", ns, key]:
                return (self.settings.get(f"{ns}/{key}", "null") + "\n").encode(), b"", 0
            case ["settings", "put", ns, key, value]:
                self.settings[f"{ns}/{key}"] = value
                return b"", b"", 0
            case ["wm", "size"]:
                out = f"Physical size: {self.size[0]}x{self.size[1]}\n"
                if self.override_size is not None:
                    out += f"Override size: {self.override_size[0]}x{self.override_size[1]}\n"
                return out.encode(), b"", 0
            case ["cat"]:
                return stdin, b"", 0
            case ["cat", path]:
                if path not in self.files:
                    return b"", f"cat: {path}: No such file or directory\n".encode(), 1
                return self.files[path], b"", 0
            case ["echo", *words]:
                return (" ".join(words) + "\n").encode(), b"", 0
        name = argv[0] if argv else ""
        return b"", f"/system/bin/sh: {name}: inaccessible or not found\n".encode(), 127

    def _keyboard_input(self, argv: list[str]) -> tuple[bytes, bytes, int] | None:
        """What the shown keyboard takes for itself: BACK (it hides), a tap inside its frame (a key)."""
        assert self.keyboard is not None
        if argv[:2] == ["input", "keyevent"] and argv[2:] in (["4"], ["KEYCODE_BACK"]):
            self.keys.append(argv[2])
            self.keyboard = None
            return b"", b"", 0
        if argv[:2] == ["input", "tap"] and len(argv) == 4:
            x, y = int(float(argv[2])), int(float(argv[3]))
            left, top, right, bottom = self.keyboard
            if left <= x < right and top <= y < bottom:
                self.keys_hit.append((x, y))
                return b"", b"", 0
        return None

    @property
    def screen(self) -> Screen:
        return self.screens[self.current]

    def _tap(self, x: int, y: int) -> tuple[bytes, bytes, int]:
        for (left, top, right, bottom), target in self.screen.links.items():
            if left <= x < right and top <= y < bottom:
                self.current = target
                break
        return b"", b"", 0


def _tokens(line: str) -> list[str] | None:
    """The shell words and operators of a line; None when it does not parse (an open quote)."""
    try:
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|<>")
        lexer.whitespace_split = True
        return list(lexer)
    except ValueError:
        return None


def blank_phone(serial: str) -> FakePhone:
    """The phone of an emulator nobody scripted: one empty home screen."""
    xml = b"<?xml version='1.0' encoding='UTF-8' standalone='yes' ?><hierarchy rotation=\"0\"></hierarchy>"
    return FakePhone(screens={"home": Screen(xml, make_png(4, 8, (0, 0, 0)))}, current="home", serial=serial)
