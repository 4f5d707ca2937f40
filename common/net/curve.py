"""Optional ZeroMQ CURVE security for the learner's two sockets (ZMTP CurveZMQ, checked by zmq.auth).

With CURVE on, the learner's ROUTER and PUB are CURVE servers: traffic is encrypted, and only clients
whose public key is in the learner's authorized-keys folder complete the handshake. An actor without
an authorized key can neither send trajectories nor receive parameters: ZeroMQ drops its connection
during the handshake, before any message reaches the learner. Key files are the ones
`zmq.auth.create_certificates` writes (`NAME.key` public, `NAME.key_secret` both halves).
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import tyro
import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator


class CurveError(ValueError):
    """A key file that is missing or unusable; the message names it."""


def _certificate(path: Path, what: str) -> tuple[bytes, bytes | None]:
    try:
        return zmq.auth.load_certificate(Path(path))
    except (OSError, ValueError) as e:
        raise CurveError(f"{path}: cannot read a CURVE {what}: {e}") from e


def load_keypair(path: Path) -> tuple[bytes, bytes]:
    """(public, secret) from a `.key_secret` file."""
    public, secret = _certificate(path, "key pair")
    if not secret:
        raise CurveError(f"{path}: holds no secret key (use the .key_secret file, not the public .key)")
    return public, secret


def load_public(path: Path) -> bytes:
    """The public key from a `.key` (or `.key_secret`) file."""
    return _certificate(path, "public key")[0]


@dataclass
class CurveServer:
    """The learner's side: its key pair and the folder of authorized actor public keys."""

    secret_key_file: Path
    authorized_dir: Path

    def __post_init__(self) -> None:
        self.public, self.secret = load_keypair(self.secret_key_file)
        if not Path(self.authorized_dir).is_dir():
            raise CurveError(f"{self.authorized_dir}: the authorized-keys folder does not exist")
        if not list(Path(self.authorized_dir).glob("*.key")):
            raise CurveError(f"{self.authorized_dir}: holds no .key files, so no actor could connect")

    def start(self, ctx: zmq.Context) -> ThreadAuthenticator:
        """Start the ZAP authenticator on `ctx` (stop it before the context terminates). The authorized
        folder is read at every handshake, so a key added (`learner keys DIR --add NAME`) or deleted
        takes effect at the next connection, without a restart."""
        auth = ThreadAuthenticator(ctx)
        auth.start()
        auth.configure_curve_callback(
            domain="*", credentials_provider=AuthorizedFolder(Path(self.authorized_dir))
        )
        return auth

    def apply(self, sock: zmq.Socket) -> None:
        sock.curve_secretkey = self.secret
        sock.curve_publickey = self.public
        sock.curve_server = True


@dataclass
class AuthorizedFolder:
    """The ZAP credentials provider: a client key is allowed while a .key file in `folder` holds it."""

    folder: Path

    def callback(self, domain: str, client_key: bytes) -> bool:
        """`client_key`: the connecting actor's public key, Z85-encoded (what .key files hold)."""
        try:
            return client_key in zmq.auth.load_certificates(str(self.folder))
        except OSError:  # the folder itself went away: nobody is authorized
            return False


@dataclass
class CurveClient:
    """An actor's side: its key pair and the learner's public key."""

    secret_key_file: Path
    server_key_file: Path

    def __post_init__(self) -> None:
        self.public, self.secret = load_keypair(self.secret_key_file)
        self.server_public = load_public(self.server_key_file)

    def apply(self, sock: zmq.Socket) -> None:
        sock.curve_secretkey = self.secret
        sock.curve_publickey = self.public
        sock.curve_serverkey = self.server_public


def generate(directory: Path, actors: int) -> list[Path]:
    """Key pairs for a learner and `actors` actors, plus `authorized/` with the actors' public keys."""
    return _create(Path(directory), ["learner", *(f"actor-{i}" for i in range(actors))])


def add_actors(directory: Path, names: list[str]) -> list[Path]:
    """Key pairs for more actors in an existing folder, authorized at once (the learner reads
    `authorized/` at every handshake)."""
    directory = Path(directory)
    if not (directory / "learner.key").is_file():
        raise CurveError(
            f"{directory}: no learner.key here; make the folder with `learner keys {directory}` first"
        )
    bad = [n for n in names if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", n) or n == "learner"]
    if bad:
        raise CurveError(
            f"--add takes key names of letters, digits, '.', '_' and '-' (not 'learner'), got {bad}"
        )
    return _create(directory, names)


def _create(directory: Path, names: list[str]) -> list[Path]:
    authorized = directory / "authorized"
    authorized.mkdir(parents=True, exist_ok=True)
    for name in names:  # all checked before any is written
        if (directory / f"{name}.key_secret").exists():
            raise CurveError(f"{directory / name}.key_secret exists already; not overwriting keys")
    written = []
    for name in names:
        public, secret = zmq.auth.create_certificates(str(directory), name)
        os.chmod(secret, 0o600)  # pyzmq writes it with the umask's mode, often readable by everyone
        written += [Path(public), Path(secret)]
        if name != "learner":
            shutil.copy(public, authorized / Path(public).name)
    return written


def is_loopback(host: str) -> bool:
    """True when `host` (an address or name) only reaches this machine."""
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
        except (OSError, ValueError):
            return False


@dataclass
class KeysConfig:
    """Write CURVE key pairs for a learner and its actors (BUILD.md, "Security")."""

    directory: Annotated[Path, tyro.conf.Positional]
    """Where to write learner.key / learner.key_secret, actor-I.key / actor-I.key_secret, and authorized/."""
    actors: int = 1
    """Actor key pairs to make (one per actor host is enough; add more later with --add)."""
    add: tuple[str, ...] = ()
    """Add actor key pairs NAME.key / NAME.key_secret to an existing folder instead, authorized at once: a
    running learner reads authorized/ at every handshake. Deleting authorized/NAME.key revokes one."""


def write_keys(cfg: KeysConfig) -> None:
    d = cfg.directory
    try:
        if cfg.add:
            add_actors(d, list(cfg.add))
            print(f"added {len(cfg.add)} actor key pair(s) to {d}, authorized from the next handshake")
            for name in cfg.add:
                print(
                    f"  {name}: --curve-secret-key {d}/{name}.key_secret --curve-server-key {d}/learner.key"
                )
            return
        if cfg.actors < 1:
            raise SystemExit(f"--actors must be at least 1, got {cfg.actors}")
        generate(d, cfg.actors)
    except CurveError as e:
        raise SystemExit(str(e)) from e
    print(
        f"wrote {cfg.actors + 1} key pairs to {d}\n"
        f"  learner: --curve-secret-key {d}/learner.key_secret --curve-authorized {d}/authorized\n"
        f"  actor I: --curve-secret-key {d}/actor-I.key_secret --curve-server-key {d}/learner.key\n"
        "Copy only an actor's own .key_secret and learner.key to its host; keep learner.key_secret on the learner."
    )
