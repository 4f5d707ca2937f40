"""Ingest: many actor connections on loopback flooding small TRAJ batches into the learner's real ingest.

The learner side is a real `learner.ingest.server.IngestServer` bound to 127.0.0.1 on free ports, in the main
thread of a fresh process per row (`python -m benchmarks.ingest learner ...`, so its memory starts clean)
and driven the way `learner.loop` drives it: `server.poll(...)` in a loop, episodes stored by the
`on_episodes` callback into a real `learner.replay.prioritized.PrioritizedReplay` of the learner's default capacity
(2048 episodes; FIFO eviction once full, so memory stays bounded, and the arrays stay alive as the
learner keeps them: views of the received messages). Version 0 is published first, as the learner does.

The actors are DEALER sockets in worker processes started by the learner process (`python -m
benchmarks.ingest actors ...`, up to 32 sockets each in one poll loop, each process owning its sockets),
so the learner's Python thread competes with them for the CPUs only, not for a GIL. Each socket HELLOs
with its own `instance` and `first_unacked=1`, then sends TRAJ batches built from a handful of
messages encoded once with `common.wire` (only `actor_id` and `seq` are packed per send: re-encoding
every batch would measure the client, not the learner). No PARAM_REQ: the steps carry version 0.

Modes (one row each):
- `credit`: as the reference actor: never a seq above the grant; the grant is raised from each ACK
  and HEARTBEAT. Zero loss is checked: every TRAJ answered by exactly one in-order ACK, episodes stored
  == episodes sent == episodes acknowledged, no duplicates, nothing rejected. Replies the learner had to
  drop (`reply_drops`: a full per-actor queue) are reported, not counted as loss: a dropped answer to a
  TRAJ leaves it unanswered, which is checked; what else drops under a flood on a starved CPU is a
  HEARTBEAT, whose grant the next one repeats.
- `credit, log os` / `credit, log fsync`: as `credit`, with the learner's write-ahead log in a temporary
  directory (`--durability os`: each batch written to the log before its ACK; `fsync`: and flushed to
  the disk, one fdatasync per poll turn for all the batches it read). `vs_none` is the row's TRAJ/s
  over the `credit` row's; `ack_p50_ms` / `ack_p99_ms` are the actors' send-to-ACK latencies.
- `ignore credit`: the actor never looks at its grant and keeps IGNORE_WINDOW batches unanswered per
  connection. Its seqs are consecutive, so each is read after its predecessor was stored, when the
  grant (watermark + credit) already covers it: nothing is refused, and what bounds the learner's
  memory is the ROUTER's receive high-water mark (INGEST_QUEUE_MESSAGES messages per connection).
- `ignore credit, tap closed`: the same flood against a learner whose rate limit has closed the credit
  tap from the start (grant 0): every batch is refused with `no_credit` and nothing is stored; the row
  measures what refusing costs.

References measured in the same run, in the benchmark's own process, without sockets, on the same
messages: `validate only` (`protocol.validate_episodes` of the decoded messages: the validation
ceiling; `ratio` is against it) and `in-process` (parse + validate + store in a full replay: all that
ingest does per TRAJ except the sockets, the ledger and the ACK; `vs_in_process` is against it).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import msgpack
import numpy as np
import zmq

from benchmarks.report import best_seconds
from common import protocol, wire
from common.config import ModelConfig
from common.policies.pointer import featurize
from common.types import NUM_ACTION_TYPES, NUM_SWIPE_DIRECTIONS

if TYPE_CHECKING:  # the actor processes never load the learner
    from learner.ingest.server import IngestServer
    from learner.ingest.wal import WriteAheadLog
    from learner.replay.prioritized import PrioritizedReplay

ROOT = Path(__file__).resolve().parents[1]

CONNECTIONS = 64
SOCKETS_PER_PROCESS = 32
STEPS = 4
"""Env steps per episode (small trajectories)."""
EPISODES_PER_BATCH = 2
VARIANTS = 8
"""Distinct pre-encoded episode lists, used in turn."""
CREDIT = 8
"""The learner's default `--actor-credit`."""
REPLAY_CAPACITY = 2048
"""The learner's default `--replay-capacity`."""
MAX_STEPS = 16
"""The learner's default `--max-steps`."""
IGNORE_WINDOW = 512
"""Batches a credit-ignoring connection keeps unanswered: twice the learner's per-connection queue."""
START_TIMEOUT_S = 60.0
DRAIN_TIMEOUT_S = 120.0

MODES = ("credit", "credit, log os", "credit, log fsync", "ignore credit", "ignore credit, tap closed")
DURABILITY = {"credit, log os": "os", "credit, log fsync": "fsync"}
"""The rows whose learner appends every batch to a write-ahead log (learner/ingest/wal.py) before its ACK."""
LATENCY_SAMPLES = 4000
"""ACK latencies each actor process reports (every k-th, evenly over the measured window)."""

NOTE = (
    "ingest: the learner process and the actor processes share this machine's CPUs, so 'learner_cpu' (CPU "
    "seconds of the learner process per second, its zmq I/O thread included) shows how much of a core it "
    "got, 'learner_idle' the share of the window it waited with nothing to read, and 'actors_cpu' the CPU "
    "of all actor processes together. 'ratio' is stored steps/s over the validation-only ceiling, "
    "'vs_in_process' over parse + validate + store without sockets; 'us_per_msg' is the learner's CPU time "
    "per TRAJ handled (wall time for the references), the figure contention changes least. RSS is the "
    "learner process's, sampled every second over the measured window; the slope is a least-squares fit "
    "over its second half."
)


# ---- messages ----------------------------------------------------------------------------------------
def random_episode(rng: np.random.Generator, cfg: ModelConfig, steps: int) -> dict:
    """The wire fields of one valid episode of `steps` steps with random content (policy version 0)."""
    obs, arrays = random_arrays(rng, cfg, steps)
    return protocol.episode_fields("bench", bool(rng.random() < 0.5), False, obs, arrays)


def random_arrays(
    rng: np.random.Generator, cfg: ModelConfig, steps: int
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Random valid observations [steps + 1, ...] and step arrays [steps] (policy version 0), in the dtypes
    protocol.episode_fields sends."""
    obs = {}
    for name, (shape, dtype) in featurize.feature_spec(cfg).items():
        full = (steps + 1, *shape)
        if dtype == "|b1":
            obs[name] = rng.random(full) < 0.5
        elif dtype == "<i4":  # token ids
            obs[name] = rng.integers(0, cfg.vocab_size, full, dtype=np.int32)
        else:
            obs[name] = rng.random(full, dtype=np.float32)
    arrays = {
        "action_type": rng.integers(0, NUM_ACTION_TYPES, steps),
        "element": rng.integers(0, cfg.max_elements, steps),
        "word": rng.integers(0, cfg.max_instruction_tokens, steps),
        "direction": rng.integers(0, NUM_SWIPE_DIRECTIONS, steps),
        "behavior_logp": -rng.random(steps),
        "reward": rng.random(steps),
        "policy_version": np.zeros(steps),
    }
    return obs, {k: np.asarray(v, dtype=np.dtype(protocol.STEP_ARRAYS[k])) for k, v in arrays.items()}


def episode_blobs(
    cfg: ModelConfig, variants: int = VARIANTS, per_batch: int = EPISODES_PER_BATCH, steps: int = STEPS
) -> list[bytes]:
    """`variants` packed maps of `per_batch` episodes each: the `episodes` value of a TRAJ, encoded once
    (small enough, under wire.BY_REFERENCE_BYTES, that `wire.encode` writes a TRAJ's entries in order)."""
    rng = np.random.default_rng(0)
    return [
        wire.encode(protocol.pack_episodes([random_episode(rng, cfg, steps) for _ in range(per_batch)]))
        for _ in range(variants)
    ]


_PACK = msgpack.Packer(use_bin_type=True)
_EPISODES_KEY = _PACK.pack("episodes")


def traj_head(actor_id: int) -> bytes:
    """A TRAJ message up to its `seq` value: a map of 5, `v`, `kind`, `actor_id`, then the key `seq`."""
    fields = ("v", protocol.PROTOCOL_VERSION, "kind", protocol.TRAJ, "actor_id", actor_id, "seq")
    return b"\x85" + b"".join(_PACK.pack(x) for x in fields)


def traj_bytes(head: bytes, seq: int, blob: bytes) -> bytes:
    """The same bytes as wire.encode(protocol.Traj(actor_id, seq, episodes).to_msg())."""
    return b"".join((head, _PACK.pack(seq), _EPISODES_KEY, blob))


# ---- the actors (worker processes) -------------------------------------------------------------------
@dataclass
class _Conn:
    sock: zmq.Socket
    instance: str
    actor_id: int = 0
    head: bytes = b""
    next_seq: int = 1
    grant: int = 0
    last_acked: int = 0
    answered: int = 0
    welcomed: bool = False
    sent_at: dict[int, float] = field(default_factory=dict)
    """time.monotonic() of each unanswered seq's sending (for the ACK latency)."""


@dataclass
class _ActorStats:
    sent: int = 0
    sent_episodes: int = 0
    sent_steps: int = 0
    acked: int = 0
    acked_episodes: int = 0
    ack_duplicates: int = 0
    """ACKs for a seq already acknowledged, or flagged `duplicate` by the learner."""
    ack_out_of_order: int = 0
    refused: int = 0
    refused_episodes: int = 0
    unanswered: int = 0
    errors: Counter = field(default_factory=Counter)
    other_replies: Counter = field(default_factory=Counter)
    latencies_ms: list[float] = field(default_factory=list)


def _actor_worker(endpoint: str, first: int, count: int, mode: str) -> None:
    """`count` DEALERs in one poll loop. Prints "ready" once all are welcomed; on "stop" (a line on stdin)
    sends no new TRAJ, waits for every reply, and prints its counters as one JSON line; exits at once
    when stdin closes (the learner process is gone)."""
    ctx = zmq.Context()
    conns: list[_Conn] = []
    try:
        stats = _ActorStats()
        blobs = episode_blobs(ModelConfig())  # the same bytes as the parent's (seeded), not sent over a pipe
        per_batch = len(wire.decode(blobs[0])["task"])
        poller = zmq.Poller()
        control = sys.stdin.fileno()
        poller.register(control, zmq.POLLIN)
        for i in range(first, first + count):
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(endpoint)
            c = _Conn(sock, f"bench-{os.getpid()}-{i}-{os.urandom(4).hex()}")
            hello = protocol.Hello(f"bench-{i}", num_envs=1, instance=c.instance, first_unacked=1)
            sock.send(wire.encode(hello.to_msg()))
            poller.register(sock, zmq.POLLIN)
            conns.append(c)
        by_sock = {c.sock: c for c in conns}
        ignore = not mode.startswith("credit")
        sending, ready, deadline = True, False, time.monotonic() + START_TIMEOUT_S
        while True:
            if sending:
                for c in conns:
                    if not c.welcomed:
                        continue
                    limit = c.answered + IGNORE_WINDOW if ignore else c.grant
                    while c.next_seq <= limit:
                        data = traj_bytes(c.head, c.next_seq, blobs[c.next_seq % len(blobs)])
                        try:
                            c.sock.send(data, zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        c.sent_at[c.next_seq] = time.monotonic()
                        c.next_seq += 1
                        stats.sent += 1
            for sock, _ in poller.poll(50):
                if sock == control:
                    if not os.read(control, 64):  # the learner process is gone: nothing to drain
                        return
                    poller.unregister(control)  # "stop": drain
                    sending, deadline = False, time.monotonic() + DRAIN_TIMEOUT_S
                    continue
                c = by_sock[sock]
                while True:
                    try:
                        data = sock.recv(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    _on_reply(c, protocol.parse(data), stats, per_batch)
            if not ready and all(c.welcomed for c in conns):
                print("ready", flush=True)
                ready, deadline = True, math.inf
            if not sending and all(c.answered == c.next_seq - 1 for c in conns):
                break
            if time.monotonic() > deadline:
                if not ready:
                    raise RuntimeError(f"{sum(not c.welcomed for c in conns)} connections got no WELCOME")
                break  # replies still missing after the drain timeout: counted as unanswered
        stats.unanswered = sum(c.next_seq - 1 - c.answered for c in conns)
        stats.sent_episodes = stats.sent * per_batch
        stats.sent_steps = stats.sent * per_batch * STEPS
        counts = {k: v for k, v in vars(stats).items() if not isinstance(v, Counter | list)}
        step = max(1, len(stats.latencies_ms) // LATENCY_SAMPLES)
        latencies = [round(x, 3) for x in stats.latencies_ms[::step]]
        print(
            json.dumps(
                {**counts, "errors": stats.errors, "other": stats.other_replies, "latencies": latencies}
            )
        )
    finally:
        for c in conns:
            c.sock.close(0)
        ctx.term()


class _Worker:
    """One actor process (`python -m benchmarks.ingest actors ENDPOINT FIRST COUNT MODE`), talked to by lines."""

    def __init__(self, endpoint: str, first: int, count: int, mode: str):
        self.err = tempfile.TemporaryFile()  # noqa: SIM115 (closed in close)
        cmd = [sys.executable, "-m", "benchmarks.ingest", "actors", endpoint, str(first), str(count), mode]
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.err
        )
        os.set_blocking(self.proc.stdout.fileno(), False)
        self._buf = b""

    def line(self) -> str | None:
        """The next whole line it printed, if any; raises if it exited without printing one."""
        if b"\n" not in self._buf:
            exited = self.proc.poll() is not None  # before reading: what it printed before exiting is read
            chunk = self.proc.stdout.read()
            self._buf += chunk or b""
            if b"\n" not in self._buf and exited:
                self.err.seek(0)
                err = self.err.read().decode(errors="replace")
                raise RuntimeError(f"actor process exited with {self.proc.returncode}:\n{err}")
        if b"\n" not in self._buf:
            return None
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode()

    def stop(self) -> None:
        self.proc.stdin.write(b"stop\n")
        self.proc.stdin.flush()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()  # a worker still running exits on EOF
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout, self.err):
            if not f.closed:
                f.close()


def _on_reply(c: _Conn, msg: dict, stats: _ActorStats, per_batch: int) -> None:
    kind = msg["kind"]
    if kind == protocol.WELCOME:
        welcome = protocol.Welcome.from_msg(msg)
        c.actor_id, c.grant, c.welcomed = welcome.actor_id, welcome.grant, True
        c.head = traj_head(c.actor_id)
    elif kind == protocol.ACK:
        ack = protocol.Ack.from_msg(msg)
        c.grant = max(c.grant, ack.grant)
        c.answered += 1
        stats.acked += 1
        stats.acked_episodes += ack.accepted
        if ack.seq <= c.last_acked or ack.duplicate:
            stats.ack_duplicates += 1
        elif ack.seq != c.last_acked + 1:
            stats.ack_out_of_order += 1
        c.last_acked = max(c.last_acked, ack.seq)
        sent_at = c.sent_at.pop(ack.seq, None)
        if sent_at is not None:
            stats.latencies_ms.append((time.monotonic() - sent_at) * 1e3)
    elif kind == protocol.HEARTBEAT:
        c.grant = max(c.grant, protocol.Heartbeat.from_msg(msg).grant)
    elif kind == protocol.ERROR:
        error = protocol.Error.from_msg(msg)
        stats.errors[error.code] += 1
        if error.seq is not None:  # a refused TRAJ: answered, its episodes not stored
            c.answered += 1
            stats.refused += 1
            stats.refused_episodes += per_batch
    else:
        stats.other_replies[kind] += 1


# ---- the learner side (this process) -----------------------------------------------------------------
def _rss_mb(field: str = "VmRSS") -> float | None:
    """This process's resident memory (VmHWM: its peak since start) from /proc; None where there is none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process (all its threads), from /proc; None where there is none."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def _slope_mb_per_min(samples: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, MB) over the second half of the samples, in MB per minute."""
    half = samples[len(samples) // 2 :]
    if len(half) < 2:
        return None
    t = np.array([s[0] for s in half])
    y = np.array([s[1] for s in half])
    if np.ptp(t) == 0:
        return None
    return float(np.polyfit(t, y, 1)[0] * 60)


def _closed_tap() -> bool:
    """The learner's rate limit, asked at every grant, when training is behind: the grants stop growing."""
    return False


def _flood_process(mode: str, connections: int, warmup_s: float, duration_s: float) -> dict:
    """One flood row, its learner in a fresh process (`python -m benchmarks.ingest learner ...`): its RSS
    starts clean, not with what earlier rows left in this process's heap."""
    cmd = [sys.executable, "-m", "benchmarks.ingest", "learner", mode, str(connections)]
    cmd += [str(warmup_s), str(duration_s)]
    limit = START_TIMEOUT_S + warmup_s + duration_s + DRAIN_TIMEOUT_S + 60
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=limit)
    if result.returncode != 0:
        raise RuntimeError(f"the ingest learner process failed ({result.returncode}):\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


@dataclass
class _Learner:
    """The learner side of one flood row: the real ingest storing into a real replay (what it stored
    counted in `stored`), with its write-ahead log in a temporary directory for the logged modes."""

    server: IngestServer
    replay: PrioritizedReplay
    stored: Counter
    """episodes and steps stored."""
    wal: WriteAheadLog | None
    log_dir: tempfile.TemporaryDirectory | None
    rss_before_mb: float | None
    """The process's resident memory before the ingest was built."""

    def handled(self) -> int:
        """TRAJ batches the learner has settled or refused."""
        return self.stored["episodes"] // EPISODES_PER_BATCH + self.server.rejected["no_credit"]

    def close(self) -> dict:
        """Close the ingest and remove its log; the log's counters ({} without one)."""
        self.server.close()
        log_stats = dict(self.wal.stats) if self.wal is not None else {}
        if self.log_dir is not None:
            self.log_dir.cleanup()
        return log_stats


def _open_learner(mode: str) -> _Learner:
    """The ingest on free loopback ports as the learner builds it, its rate limit closed for the
    `tap closed` mode. Imported here: the actor processes never load the learner."""
    from learner.ingest.registry import ActorRegistry
    from learner.ingest.transport import Transport
    from learner.ingest.wal import WriteAheadLog
    from learner.replay.prioritized import PrioritizedReplay, oldest_version
    from learner.setup.ingest import ingest_server

    cfg = ModelConfig()
    log_dir = tempfile.TemporaryDirectory(prefix="ingest-wal-") if mode in DURABILITY else None
    wal = WriteAheadLog(Path(log_dir.name), DURABILITY[mode]) if log_dir is not None else None
    if wal is not None:
        list(wal.recover())  # an empty log, opened for appending

    replay: PrioritizedReplay = PrioritizedReplay(REPLAY_CAPACITY)
    stored = Counter()

    def on_episodes(episodes: list[protocol.Episode], _record: int) -> None:
        for ep in episodes:
            replay.add(ep, oldest_version(ep))
            stored["episodes"] += 1
            stored["steps"] += ep.length

    rss_before = _rss_mb()
    server = ingest_server(
        Transport("127.0.0.1", 0, 0),
        ActorRegistry(),
        welcome_fields={"model": cfg.to_dict(), "max_steps": MAX_STEPS},
        episode_spec=featurize.episode_spec(cfg, text_vocab_size=0),
        max_steps=MAX_STEPS,
        on_episodes=on_episodes,
        credit=CREDIT,
        wal=wal,
        gate=_closed_tap if mode == "ignore credit, tap closed" else None,
    )
    return _Learner(server, replay, stored, wal, log_dir, rss_before)


def _serve_until_all_print(
    server: IngestServer, workers: list[_Worker], what: str, timeout: float
) -> list[str]:
    """Poll the ingest until every actor process has printed a line (RuntimeError naming `what` after
    `timeout` seconds); their lines."""
    lines: list[str | None] = [None] * len(workers)
    deadline = time.monotonic() + timeout
    while None in lines:
        server.poll(20)
        for i, w in enumerate(workers):
            lines[i] = lines[i] or w.line()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{lines.count(None)} of {len(workers)} actor processes not {what}")
    return lines  # type: ignore[return-value]


@dataclass
class _Window:
    """The measured interval: (stored, handled, learner CPU s, actor processes' CPU s) at its start and
    end, the resident memory sampled once a second, and the seconds the learner's polls found nothing."""

    begin: tuple
    end: tuple
    samples: list[tuple[float, float | None]]
    idle: float
    elapsed: float


def _counters(learner: _Learner, workers: list[_Worker]) -> tuple:
    return dict(learner.stored), learner.handled(), time.process_time(), [_cpu_s(w.proc.pid) for w in workers]


def _measure(learner: _Learner, workers: list[_Worker], duration_s: float) -> _Window:
    """Serve the flood for `duration_s` seconds, sampling the memory once a second."""
    t0 = time.monotonic()
    begin = _counters(learner, workers)
    samples = [(0.0, _rss_mb())]
    next_sample, idle = t0 + 1.0, 0.0
    while (now := time.monotonic()) < t0 + duration_s:
        if now >= next_sample:
            samples.append((now - t0, _rss_mb()))
            next_sample += 1.0
        if learner.server.poll(20) == 0:  # waited for the whole timeout with nothing to do
            idle += time.monotonic() - now
    elapsed = time.monotonic() - t0
    samples.append((elapsed, _rss_mb()))
    return _Window(begin, _counters(learner, workers), samples, idle, elapsed)


def _flood(mode: str, connections: int, warmup_s: float, duration_s: float) -> dict:
    """One row: a real IngestServer in this process's main thread, the actors in worker processes."""
    learner = _open_learner(mode)
    server = learner.server
    workers: list[_Worker] = []
    try:
        server.publish(0, {"w": np.zeros(4, np.float32)})
        endpoint = f"tcp://127.0.0.1:{server.ingest_port}"
        nproc = max(1, math.ceil(connections / SOCKETS_PER_PROCESS))
        for p in range(nproc):
            first = p * connections // nproc
            workers.append(_Worker(endpoint, first, (p + 1) * connections // nproc - first, mode))
        _serve_until_all_print(server, workers, "welcomed", START_TIMEOUT_S)
        end_warmup = time.monotonic() + warmup_s
        while time.monotonic() < end_warmup:
            server.poll(20)
        window = _measure(learner, workers, duration_s)
        for w in workers:
            w.stop()
        drained = _serve_until_all_print(server, workers, "drained", DRAIN_TIMEOUT_S + 30)
        results = [json.loads(line) for line in drained]
        for _ in range(5):  # nothing should be left, but whatever is waiting is counted
            server.poll(0)
    finally:
        for w in workers:
            w.close()
        log_stats = learner.close()
    return _flood_row(mode, connections, warmup_s, learner, window, results, log_stats, len(workers))


@dataclass
class _Tally:
    """The actor processes' final counters, summed: counts, ERROR codes, send-to-ACK latencies (ms)."""

    actors: Counter
    errors: Counter
    latencies: list[float]


def _tally(results: list[dict]) -> _Tally:
    tally = _Tally(Counter(), Counter(), [])
    for result in results:
        tally.errors.update(result.pop("errors"))
        result.pop("other")
        tally.latencies += result.pop("latencies")
        tally.actors.update(result)
    return tally


def _broken(mode: str, tally: _Tally, learner: _Learner, lost: int, rejected: int) -> list[str]:
    """The zero-loss checks that fail (every one must hold for zero_loss; the row names those that do not)."""
    actors, errors, stored, server = tally.actors, tally.errors, learner.stored, learner.server
    refused_expected = mode == "ignore credit, tap closed"
    checks = {
        "lost == 0": lost == 0,
        "unanswered == 0": actors["unanswered"] == 0,
        "acked + refused == sent": actors["acked"] + actors["refused"] == actors["sent"],
        "acked episodes == stored": actors["acked_episodes"] == stored["episodes"],
        "no ACK twice": actors["ack_duplicates"] == 0,
        "ACKs in order": actors["ack_out_of_order"] == 0,
        "no duplicates stored": server.duplicates == 0,
        "rejected == refused": rejected == (actors["refused"] if refused_expected else 0),
        "every error is no_credit": errors["no_credit"] == actors["refused"] == sum(errors.values()),
    }
    return [name for name, ok in checks.items() if not ok]


def _flood_row(
    mode: str,
    connections: int,
    warmup_s: float,
    learner: _Learner,
    window: _Window,
    results: list[dict],
    log_stats: dict,
    processes: int,
) -> dict:
    """The row of one flood: throughput, zero loss, memory, latency and CPU (`detail`: the counters)."""
    tally, stored, server = _tally(results), learner.stored, learner.server
    actors, latencies, elapsed = tally.actors, tally.latencies, window.elapsed
    begin, end, samples = window.begin, window.end, window.samples
    episodes = end[0].get("episodes", 0) - begin[0].get("episodes", 0)
    steps = end[0].get("steps", 0) - begin[0].get("steps", 0)
    rss = [s[1] for s in samples if s[1] is not None]
    child_cpu = [
        (b - a) if a is not None and b is not None else None for a, b in zip(begin[3], end[3], strict=True)
    ]
    lost = actors["sent_episodes"] - stored["episodes"] - actors["refused_episodes"]
    rejected = sum(server.rejected.values())
    broken = _broken(mode, tally, learner, lost, rejected)
    return {
        "mode": mode,
        "connections": connections,
        "duration_s": elapsed,
        "msgs_per_s": (end[1] - begin[1]) / elapsed,
        "episodes_per_s": episodes / elapsed,
        "steps_per_s": steps / elapsed,
        "sent": actors["sent"],
        "acked": actors["acked"],
        "stored": stored["episodes"],
        "lost": lost,
        "duplicates": server.duplicates,
        "rejected": rejected,
        "zero_loss": not broken,
        "broken": ", ".join(broken),  # empty when zero_loss
        "rss_start_mb": rss[0] if rss else None,
        "rss_peak_mb": max(rss) if rss else None,
        "rss_end_mb": rss[-1] if rss else None,
        "rss_slope_mb_per_min": _slope_mb_per_min([s for s in samples if s[1] is not None]),
        "ack_p50_ms": float(np.percentile(latencies, 50)) if latencies else None,
        "ack_p99_ms": float(np.percentile(latencies, 99)) if latencies else None,
        "learner_cpu": (end[2] - begin[2]) / elapsed,
        "learner_idle": window.idle / elapsed,
        "actors_cpu": (sum(child_cpu) / elapsed) if None not in child_cpu else None,
        "detail": _detail(tally, learner, window, log_stats, warmup_s, processes),
        "load_1m": os.getloadavg()[0],
    }


def _detail(
    tally: _Tally, learner: _Learner, window: _Window, log_stats: dict, warmup_s: float, processes: int
) -> dict:
    actors = tally.actors
    return {
        "refused": actors["refused"],
        "errors": dict(tally.errors),
        "unanswered": actors["unanswered"],
        "ack_duplicates": actors["ack_duplicates"],
        "ack_out_of_order": actors["ack_out_of_order"],
        "reply_drops": sum(learner.server.drops.values()),
        "sent_episodes": actors["sent_episodes"],
        "acked_episodes": actors["acked_episodes"],
        "stored_steps": learner.stored["steps"],
        "sent_steps": actors["sent_steps"],
        "actor_processes": processes,
        "log": log_stats,
        "warmup_s": warmup_s,
        "replay_size": len(learner.replay),
        "syncs": log_stats.get("syncs", 0),
        "rss_before_mb": learner.rss_before_mb,
        "rss_hwm_mb": _rss_mb("VmHWM"),
        "rss_samples_mb": [s[1] for s in window.samples],
    }


def _references(blobs: list[bytes], cfg: ModelConfig, repeats: int, per_batch: int) -> list[dict]:
    """Validation only, and parse + validate + store, on the same messages with no sockets."""
    from learner.replay.prioritized import PrioritizedReplay, oldest_version

    spec = featurize.episode_spec(cfg, text_vocab_size=0)  # (the benchmark's model has no text encoder)
    raw = [traj_bytes(traj_head(1), i + 1, b) for i, b in enumerate(blobs)]
    decoded = [protocol.parse(r) for r in raw]
    replay: PrioritizedReplay = PrioritizedReplay(REPLAY_CAPACITY)
    while len(replay) < REPLAY_CAPACITY:  # full, as in the flood rows after warm-up: each add evicts one
        for ep in protocol.validate_episodes(decoded[0], spec, MAX_STEPS, 0):
            replay.add(ep, oldest_version(ep))

    def validate_all() -> None:
        for msg in decoded:
            protocol.validate_episodes(msg, spec, MAX_STEPS, 0)

    def ingest_all() -> None:
        for r in raw:
            for ep in protocol.validate_episodes(protocol.parse(r), spec, MAX_STEPS, 0):
                replay.add(ep, oldest_version(ep))

    rows = []
    for what, fn in (
        ("validate only (reference)", validate_all),
        ("in-process parse+validate+store", ingest_all),
    ):
        sec = best_seconds(fn, repeats, inner=10)
        msgs = len(raw) / sec
        rows.append(
            {
                "mode": what,
                "connections": 0,
                "msgs_per_s": msgs,
                "episodes_per_s": msgs * per_batch,
                "steps_per_s": msgs * per_batch * STEPS,
                "load_1m": os.getloadavg()[0],
            }
        )
    return rows


def run(
    quick: bool,
    connections: int = CONNECTIONS,
    duration_s: float | None = None,
    warmup_s: float | None = None,
    modes: tuple[str, ...] = MODES,
) -> list[dict]:
    """Rows: the two socket-free references, then one per mode (see the module doc)."""
    cfg = ModelConfig()
    refs = _references(episode_blobs(cfg), cfg, 3 if quick else 7, EPISODES_PER_BATCH)
    reference, in_process = refs[0]["steps_per_s"], refs[1]["steps_per_s"]
    raw = list(refs)
    for mode in modes:
        duration = duration_s or (3.0 if quick else (25.0 if mode == "credit" else 10.0))
        warmup = warmup_s if warmup_s is not None else (1.0 if quick else 5.0)
        raw.append(_flood_process(mode, connections, warmup, duration))
    print(NOTE, flush=True)
    none = next((r["msgs_per_s"] for r in raw if r["mode"] == "credit"), None)
    return [_row(r, reference, in_process, none) for r in raw]


class _Detail(dict):
    """A row's counters and context: all of them in the JSON, in the table only what is not zero."""

    def __str__(self) -> str:
        shown = [f"{k}={v}" for k, v in self.items() if k in _SHOWN and v]
        return " ".join(shown) or "-"


_SHOWN = ("refused", "unanswered", "ack_duplicates", "ack_out_of_order", "reply_drops", "syncs")


def _row(raw: dict, reference: float, in_process: float, none: float | None = None) -> dict:
    """Rounded for the table (floats print with 4 significant digits), with the ratios and the reference."""
    row = {k: v for k, v in raw.items() if k not in ("detail", "load_1m")}
    for key in ("msgs_per_s", "episodes_per_s", "steps_per_s"):
        row[key] = round(raw[key])
    row["reference_steps_per_s"] = round(reference)
    row["ratio"] = round(raw["steps_per_s"] / reference, 3)
    row["vs_in_process"] = round(raw["steps_per_s"] / in_process, 3)
    if raw["mode"].startswith("credit") and none:
        row["vs_none"] = round(raw["msgs_per_s"] / none, 3)
    for key in ("ack_p50_ms", "ack_p99_ms"):
        if isinstance(raw.get(key), float):
            row[key] = round(raw[key], 2)
    # CPU time per TRAJ handled: what contention on a shared machine changes least (wall time for the
    # references, which run single-threaded and take the best of several repeats)
    cpu = raw.get("learner_cpu", 1.0)
    row["us_per_msg"] = round(cpu * 1e6 / raw["msgs_per_s"], 1) if raw["msgs_per_s"] and cpu else None
    for key, digits in (("duration_s", 1), ("learner_cpu", 2), ("learner_idle", 2), ("actors_cpu", 2)):
        if isinstance(raw.get(key), float):
            row[key] = round(raw[key], digits)
    for key in ("rss_start_mb", "rss_peak_mb", "rss_end_mb", "rss_slope_mb_per_min"):
        if isinstance(raw.get(key), float):
            row[key] = round(raw[key], 1)
    if "detail" in raw:
        row["detail"] = _Detail(raw["detail"])
    if "load_1m" in raw:
        row["load_1m"] = round(raw["load_1m"], 2)
    return row


if __name__ == "__main__":  # the benchmark's own processes: `actors ...` (see _Worker), `learner ...`
    if sys.argv[1] == "actors":
        _actor_worker(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    elif sys.argv[1] == "learner":
        row = _flood(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]))
        print(json.dumps(row))
    else:
        raise SystemExit(f"usage: python -m benchmarks ingest [--quick]; {sys.argv[1]!r} is internal")
