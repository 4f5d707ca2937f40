"""A stand-in for the Android `emulator` binary, run as `python tests/fake_emulator.py -avd NAME -port P ...`.

It opens what the device pool talks to: the emulator console on 127.0.0.1:P (banner, `auth`, `avd
snapshot load`, `kill`) and an "adbd" on 127.0.0.1:P+1 that answers every connection with one status
line, `fake-emulator INSTANCE BOOTED GENERATION`, which tests/fake_adb.py probes to list `emulator-P`
(as the real adb server finds emulators by their adb port). Unknown flags are ignored. Stdlib only.

Behaviour switches (environment variables):
  FAKE_EMULATOR_AVDS        comma-separated AVD names that exist (unset: any); others exit with a PANIC
  FAKE_EMULATOR_BOOT_S      seconds until sys.boot_completed=1 (default 0.2)
  FAKE_EMULATOR_NEVER_BOOT  "1": stay booting forever
  FAKE_EMULATOR_CRASH_S     exit with status 3 this many seconds after start
  FAKE_EMULATOR_IGNORE_TERM "1": ignore SIGTERM (only SIGKILL stops it)
  FAKE_EMULATOR_TOKEN_FILE  the console requires `auth <contents of this file>`
  FAKE_EMULATOR_SNAPSHOTS   comma-separated snapshot names `avd snapshot load` accepts (others: KO)
  FAKE_EMULATOR_PID_DIR     write an empty file named PORT.PID there, so tests can find every process
  FAKE_EMULATOR_CHILD       "1": start a child in its process group, as the real emulator starts qemu
                            (`sleep`; with FAKE_EMULATOR_PID_DIR its pid goes in a file child-PORT.PID)
"""

from __future__ import annotations

import argparse
import os
import signal
import socketserver
import subprocess
import sys
import threading
import time
from pathlib import Path


class Emulator:
    def __init__(self, avd: str, port: int) -> None:
        self.avd, self.port = avd, port
        self.started = time.monotonic()
        self.instance = f"{os.getpid()}-{time.time_ns()}"
        self.generation = 0
        self.boot_s = float(os.environ.get("FAKE_EMULATOR_BOOT_S", "0.2"))
        self.never_boot = os.environ.get("FAKE_EMULATOR_NEVER_BOOT") == "1"
        token_file = os.environ.get("FAKE_EMULATOR_TOKEN_FILE")
        self.token = Path(token_file).read_text().strip() if token_file else None
        self.snapshots = set(filter(None, os.environ.get("FAKE_EMULATOR_SNAPSHOTS", "").split(",")))

    def booted(self) -> bool:
        return not self.never_boot and time.monotonic() - self.started >= self.boot_s

    def status(self) -> bytes:
        return f"fake-emulator {self.instance} {int(self.booted())} {self.generation}\n".encode()

    def answer(self, line: str) -> str:
        """The console's answer to one command line (after authentication)."""
        words = line.split()
        if words[:3] == ["avd", "snapshot", "load"] and len(words) == 4:
            if words[3] not in self.snapshots:
                return f"KO: no snapshot named '{words[3]}'"
            time.sleep(0.05)
            self.generation += 1
            log(f"INFO: loaded snapshot {words[3]}")
            return "OK"
        if words == ["help"]:
            return "avd snapshot load, kill, auth, quit\r\nOK"
        return "KO: unknown command, try 'help'"


def log(message: str) -> None:
    print(message, flush=True)


def serve_console(emu: Emulator) -> socketserver.ThreadingTCPServer:
    class Console(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            authed = emu.token is None
            if authed:
                self.send("Android Console: type 'help' for a list of commands\r\nOK")
            else:
                self.send(
                    "Android Console: Authentication required\r\n"
                    "Android Console: type 'auth <auth_token>' to authenticate\r\n"
                    "Android Console: you can find your <auth_token> in \r\n"
                    "'~/.emulator_console_auth_token'\r\nOK"
                )
            for raw in self.rfile:
                line = raw.decode("utf-8", "replace").strip()
                if line in ("quit", "exit"):
                    return
                if line == "kill" and authed:
                    log("INFO: console kill")
                    self.send("OK: killing emulator, bye bye")
                    os._exit(0)
                if line.startswith("auth "):
                    authed = authed or line.removeprefix("auth ").strip() == emu.token
                    self.send(
                        "Android Console: type 'help' for a list of commands\r\nOK"
                        if authed
                        else "KO: authentication token does not match ~/.emulator_console_auth_token"
                    )
                elif not authed:
                    self.send("KO: unknown command, try 'help'")
                else:
                    self.send(emu.answer(line))

        def send(self, text: str) -> None:
            self.wfile.write(text.encode() + b"\r\n")
            self.wfile.flush()

    return _server(emu.port, Console)


def serve_adbd(emu: Emulator) -> socketserver.ThreadingTCPServer:
    class Adbd(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            self.request.sendall(emu.status())

    return _server(emu.port + 1, Adbd)


def _server(port: int, handler: type[socketserver.BaseRequestHandler]) -> socketserver.ThreadingTCPServer:
    class Server(socketserver.ThreadingTCPServer):
        daemon_threads = True
        allow_reuse_address = True
        request_queue_size = 64

    try:
        server = Server(("127.0.0.1", port), handler)
    except OSError as e:
        log(f"ERROR: cannot listen on 127.0.0.1:{port}: {e}")
        sys.exit(1)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="emulator", add_help=False, allow_abbrev=False)
    parser.add_argument("-avd", required=True)
    parser.add_argument("-port", type=int, required=True)
    args, _ = parser.parse_known_args(argv)
    known = os.environ.get("FAKE_EMULATOR_AVDS")
    if known is not None and args.avd not in known.split(","):
        log(f"PANIC: Unknown AVD name [{args.avd}], use -list-avds to see valid choices.")
        return 1
    if os.environ.get("FAKE_EMULATOR_IGNORE_TERM") == "1":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    pid_dir = os.environ.get("FAKE_EMULATOR_PID_DIR")
    if pid_dir:
        (Path(pid_dir) / f"{args.port}.{os.getpid()}").touch()
    if os.environ.get("FAKE_EMULATOR_CHILD") == "1":
        child = subprocess.Popen(["sleep", "3600"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        if pid_dir:
            (Path(pid_dir) / f"child-{args.port}.{child.pid}").touch()
    emu = Emulator(args.avd, args.port)
    serve_console(emu)
    serve_adbd(emu)
    log(f"INFO: fake emulator for AVD {args.avd}: console 127.0.0.1:{args.port}, adb {args.port + 1}")
    if crash_s := os.environ.get("FAKE_EMULATOR_CRASH_S"):
        time.sleep(float(crash_s))
        log("FATAL: fake emulator crashed")
        os._exit(3)
    threading.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
