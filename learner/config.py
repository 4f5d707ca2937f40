"""Command-line configuration of `python -m learner` (tyro builds --help from these docstrings).

`LearnerConfig` groups its settings by the part of the learner they steer (transport, local actors,
imitation, replay buffer, loss, optimizer, dashboards, multi-host); every group's flags keep their plain
names, so `--alpha` sets `cfg.buffer.alpha`. Each config checks its own values in `__post_init__` and
raises ValueError naming the flag; tyro shows that message and exits with status 2. What can only be
checked against the machine (the device mesh, key files, ports in use) is checked at start-up
(learner/setup/open_session.py). config.json and checkpoints store the settings flat, by field name (`flat_dict`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import tyro
from tyro.conf import OmitArgPrefixes

from common.config import EmulatorModelConfig, ModelConfig
from common.net.curve import is_loopback
from common.net.ports import INGEST_PORT, PARAMS_PORT
from common.policies import make_policy
from common.policies.family import Augmentation
from learner import recipes
from learner.losses import ACTOR_WEIGHTINGS, DEFAULTS, LOSSES, ActorWeighting

ParamSharding = Literal["replicated", "fsdp", "model"]
PARAM_SHARDINGS: tuple[str, ...] = ("replicated", "fsdp", "model")


def _check(ok: bool, message: str) -> None:
    """One validation rule: ValueError(message) when it does not hold (tyro prints the message)."""
    if not ok:
        raise ValueError(message)


@dataclass(frozen=True)
class MeshConfig:
    """Device mesh of the sharded train step, with axes ('data', 'model')."""

    data: int = -1
    """Devices along 'data': the batch (episodes) is split over them. -1 = all devices not taken by 'model'."""
    model: int = 1
    """Devices along 'model': with param_sharding "model" or "fsdp", big kernels are split over them
    (tensor parallelism). data * model must divide the device count (the first data * model devices are used)."""
    param_sharding: ParamSharding = "replicated"
    """How parameters and optimizer state are laid out: "replicated" (plain data parallelism: a full copy
    on every device), "model" (embeddings, attention and MLP kernels split over 'model', replicated over
    'data'), or "fsdp" (the "model" split plus each big parameter's largest remaining dim split over 'data',
    ZeRO-3 style: parameters are gathered for the forward/backward pass and gradients reduce-scattered)."""

    def __post_init__(self) -> None:
        if self.param_sharding not in PARAM_SHARDINGS:
            raise ValueError(
                f"--mesh.param-sharding must be one of {PARAM_SHARDINGS}, got {self.param_sharding!r}"
            )
        if self.model < 1:
            raise ValueError(f"--mesh.model must be >= 1, got {self.model}")
        if self.data == 0 or self.data < -1:
            raise ValueError(f"--mesh.data must be >= 1 or -1 (all remaining devices), got {self.data}")


@dataclass(frozen=True)
class TransportConfig:
    """The learner's two sockets and how it treats the actors on them (delivery, flow control, security)."""

    bind: str = "127.0.0.1"
    """Address the sockets bind to. Use 0.0.0.0 (or this host's LAN address) for actors on other machines."""
    ingest_port: int = INGEST_PORT
    """ROUTER port for handshakes, trajectories, acks and parameter requests (0 picks a free port)."""
    params_port: int = PARAMS_PORT
    """PUB port for parameter snapshots (0 picks a free port)."""
    curve_secret_key: Path | None = None
    """CURVE security on both sockets: the learner's key pair (a .key_secret file from `python -m learner
    keys`). Needs --curve-authorized. Traffic is encrypted and only authorized actors connect."""
    curve_authorized: Path | None = None
    """Folder of the public keys (.key files) of the actors allowed to connect."""
    insecure: bool = False
    """Allow binding to an address other than loopback without CURVE keys: anyone who can reach the
    ports could then feed the learner trajectories and read its parameters."""
    inference_port: int = 0
    """ROUTER port of the inference service, which acts for actors started with `--inference remote` on
    this learner's devices with its newest parameters. 0 picks a free port (actors learn it from WELCOME;
    give a fixed one where a firewall must let it through), -1 turns the service off. Off with several
    learner processes."""
    inference_max_rows: int = 64
    """The inference service acts on at most this many observations at once (from any actors)."""
    inference_deadline_ms: float = 5.0
    """How long the inference service's first waiting request waits for others to batch with."""
    actor_timeout: float = 15.0
    """An actor silent this long is forgotten: it no longer counts as connected and must HELLO again."""
    actor_credit: int = 8
    """Flow control: TRAJ batches each actor may have sent and not yet acknowledged. Bounds the learner's
    ingest queue at (actors x credit) batches, whatever the actors do."""
    durability: Literal["auto", "none", "os", "fsync"] = "auto"
    """What an ACK promises. "fsync": the batch is in the write-ahead log (RUN_DIR/wal) and flushed to
    the disk (one fsync per loop turn covers every batch of that turn): it survives a kill -9 of the
    learner and a power cut. "os": written to the log, not flushed: survives a kill -9, not a power cut or
    kernel crash. "none": only in memory, as before the log: what came after the last checkpoint is lost
    with the learner (counted as batches_lost_in_restart). "auto": fsync when checkpoints are on
    (--checkpoint-every > 0), none otherwise (the log is pruned at each checkpoint)."""
    keep_log: bool = False
    """Never delete write-ahead log segments, so the log holds every batch the learner ever stored (for
    audits such as `python -m benchmarks chaos`; the log then grows with every batch)."""
    wal_segment_mb: int = 64
    """Size in MiB at which a write-ahead log segment is closed and the next begun. A segment is the unit
    the log is pruned by (a segment goes once all its records are older than what the checkpoints need),
    so smaller segments keep the log closer to what restores need, at the cost of more files."""
    audit_log: bool = False
    """Append one JSON line per batch the write-ahead log takes to RUN_DIR/audit.jsonl (its actor,
    seq, episodes, stored or refused, log position; about 100 bytes a batch, kept for the whole run):
    what an audit such as `python -m benchmarks chaos` reads instead of a log that is never pruned.
    Needs the log (--durability os or fsync, or auto with checkpoints)."""

    def __post_init__(self) -> None:
        for flag, port in (("--ingest-port", self.ingest_port), ("--params-port", self.params_port)):
            _check(0 <= port <= 65535, f"{flag} must be in [0, 65535] (0 picks a free port), got {port}")
        _check(
            -1 <= self.inference_port <= 65535,
            f"--inference-port must be in [-1, 65535] (0 picks a free port, -1 is off), got {self.inference_port}",
        )
        _check(self.wal_segment_mb >= 1, f"--wal-segment-mb must be at least 1, got {self.wal_segment_mb}")
        _check(
            self.inference_max_rows >= 1,
            f"--inference-max-rows must be at least 1, got {self.inference_max_rows}",
        )
        _check(
            self.inference_deadline_ms >= 0,
            f"--inference-deadline-ms must be >= 0, got {self.inference_deadline_ms}",
        )
        _check(self.actor_timeout > 0, f"--actor-timeout must be positive, got {self.actor_timeout}")
        _check(self.actor_credit >= 1, f"--actor-credit must be at least 1, got {self.actor_credit}")
        _check(
            (self.curve_secret_key is None) == (self.curve_authorized is None),
            "--curve-secret-key and --curve-authorized go together",
        )
        _check(
            self.curve_secret_key is not None or self.insecure or is_loopback(self.bind),
            f"--bind {self.bind} exposes the learner beyond this machine without authentication: anyone who "
            "reaches its ports could feed it trajectories and read its parameters. Create keys with "
            "`python -m learner keys DIR` and pass --curve-secret-key DIR/learner.key_secret "
            "--curve-authorized DIR/authorized (BUILD.md, 'Security'), or accept the risk with --insecure.",
        )


@dataclass(frozen=True)
class LocalActorsConfig:
    """Actor processes the learner starts itself on loopback (the one-command demo)."""

    local_actors: int = 0
    """Actor processes to start on loopback (the one-command demo); 0 means actors connect from elsewhere."""
    envs_per_actor: int = 16
    """Environments each local actor runs (batched inference)."""
    env: Literal["simphone", "standin"] = "simphone"
    """Environment of the local actors: "simphone" (the built-in phone) or "standin" (a tiny one)."""
    tasks: str = "general"
    """SimPhone tasks of the local actors (a suite name, a .json file or a folder)."""
    split: str = "train"
    """SimPhone split of the local actors (and of the warm-up demonstrations): train, or dev (train
    without the validation templates, for development whose choices are made on --split validation)."""
    actors_after_warmup: bool = False
    """Start the local actors when the imitation warm-up ends, not with the learner: episodes acted
    during the warm-up come from the policy it is replacing (and, held by the insert side, are trained
    on only once reinforcement learning starts, far off-policy), while the actors' processes take CPU
    from the warm-up's updates (on 2 cores, three processes' XLA threads; the lm recipe's choice)."""
    local_actor_args: str = ""
    """Further `python -m actors` flags for every local actor, one string, e.g.
    --local-actor-args="--max-episode-rate 0.5" (with "=": the value starts with dashes); they come last, so they win, and are checked by the actor's own parser
    before anything starts."""

    def __post_init__(self) -> None:
        _check(self.local_actors >= 0, f"--local-actors must be >= 0, got {self.local_actors}")
        _check(self.envs_per_actor >= 1, f"--envs-per-actor must be at least 1, got {self.envs_per_actor}")


@dataclass(frozen=True)
class ImitationConfig:
    """Demonstrations: the warm-up on them, their share of later updates, and the replay prefill."""

    demos: Path | None = None
    """Demonstrations to warm up on (written by `python -m actors demos`)."""
    warmup_demos: int = 1000
    """Generate this many SimPhone oracle demonstrations at start-up to warm up on (ignored with --env
    standin or --demos)."""
    warmup_noise: float = 0.1
    """Share of random actions in generated demonstrations."""
    warmup_updates: int = 150
    """Updates of behavior cloning on the demonstrations before reinforcement learning starts (0: none)."""
    demo_update_every: int = 4
    """After the warm-up, every Nth update is another behavior-cloning update on the demonstrations (as
    DQfD keeps a demonstration loss during online learning), so imitation keeps anchoring long tasks the
    policy still rarely completes on its own; 0: none. In 15-minute SimPhone runs, 4 gave 0.935 train and
    0.752 test greedy success where 0 gave 0.970 and 0.685 (BENCHMARKS.md)."""
    prefill_demos: bool = True
    """Also put the warm-up demonstrations into the replay (as DigiRL and DistRL do with offline data), so
    early reinforcement-learning batches mix them with the actors' episodes."""
    validation_demos: int = 0
    """Hold back the last N demonstrations (the same training templates, never imitated nor prefilled) and
    measure their imitation loss in nats per action, rho on their steps and the critic's value gap, before
    the warm-up, after each of its epochs and its end, then every epoch's worth of updates (learner/warmup.py;
    `validation/nll`, `validation/rho`, `validation/value_gap` in metrics.jsonl and a console line); 0: no
    validation."""
    warmup_share: float = 0.0
    """With --time-limit: end the warm-up once this share of the run's time has passed (reinforcement
    learning gets the rest, and a resume does not warm up again); 0: no such end. A share, not updates:
    one recipe then suits a 15-minute and a 60-minute run, whose updates take what the machine gives."""
    warmup_patience: int = 0
    """With --validation-demos: end the warm-up once the validation loss has not reached a new low for
    this many epochs (reinforcement learning starts then, and a resume does not warm up again); 0: the
    warm-up runs all its --warmup-updates."""

    def __post_init__(self) -> None:
        _check(self.warmup_demos >= 0, f"--warmup-demos must be >= 0, got {self.warmup_demos}")
        _check(0.0 <= self.warmup_noise <= 1.0, f"--warmup-noise must be in [0, 1], got {self.warmup_noise}")
        _check(self.warmup_updates >= 0, f"--warmup-updates must be >= 0, got {self.warmup_updates}")
        _check(self.demo_update_every >= 0, f"--demo-update-every must be >= 0, got {self.demo_update_every}")
        _check(self.validation_demos >= 0, f"--validation-demos must be >= 0, got {self.validation_demos}")
        _check(self.warmup_patience >= 0, f"--warmup-patience must be >= 0, got {self.warmup_patience}")
        _check(0.0 <= self.warmup_share < 1.0, f"--warmup-share must be in [0, 1), got {self.warmup_share}")
        _check(
            not self.warmup_patience or self.validation_demos,
            "--warmup-patience needs --validation-demos: it ends the warm-up on their loss",
        )


@dataclass(frozen=True)
class ReplayConfig:
    """The replay buffer (DPER) and both sides of its rate limit."""

    replay: Literal["prioritized", "uniform"] = "prioritized"
    """"prioritized" (DPER: sampling proportional to priority^alpha) or "uniform" (an ablation)."""
    replay_capacity: int = 2048
    """Episodes kept for training; the oldest is evicted at capacity (counted in dropped_episodes)."""
    alpha: float = 0.6
    """Priority exponent of prioritized sampling."""
    beta_start: float = 0.4
    """Initial importance-weight exponent, annealed linearly to 1."""
    beta_steps: int = 1200
    """Updates (imitation ones included) over which beta reaches 1; with --time-limit, beta reaches 1 by
    the end of the run at the latest (its share of the time limit counts as that share of these updates,
    learner/schedule.py `beta_progress`): a 15-minute run on a 2-core CPU makes only about 500 updates."""
    priority_weights: tuple[float, float, float] = (1.0, 0.1, 0.02)
    """(w1, w2, w3) of the trajectory priority w1*mean|delta| + w2*mean(min(rho_clip, rho)) + w3*mean(H),
    H the exact entropy of the current policy. Dominated by |delta|, so that sampling steers towards what
    the critic gets wrong: with DistRL-like (1, 0.5, 0.1) the three weighted terms spread alike (standard
    deviations 0.05, 0.06 and 0.03 over refreshed trajectories, BENCHMARKS.md) and sampling was nearly
    uniform."""
    max_policy_lag: int = 0
    """If > 0, trajectories whose oldest step is more than this many policy versions old are dropped.
    0 (the default) keeps everything: the clipped importance ratios correct stale steps, and the
    replay's first-in first-out eviction ages data out. Behind the emulator latency model a limit of 50
    dropped 0-29% of the async episodes and reached the success target no sooner (BENCHMARKS.md,
    "Stale data")."""
    samples_per_insert: float = 4.0
    """Rate limit (as Reverb's): reinforcement-learning updates stop once they have sampled, on average,
    this many times per episode inserted; they resume as new episodes arrive."""
    insert_slack: int | None = None
    """Rate limit on the insert side (Reverb's error buffer): while episodes from actors run more than
    this many ahead of what reinforcement-learning updates have used (samples / samples_per_insert), the
    learner grants no credit, so actors wait or discard (their --when-blocked). 0: never; actors keep
    collecting as DistRL's do, and the replay evicts its oldest episodes. Default
    (LearnerConfig.insert_slack): 4 batches with --local-actors in async mode, which share the learner's
    machine and otherwise outpace it (178,000 episodes for 518 updates of 32 in 15 minutes); 0 otherwise (remote actors on their own machines
    collect freely; sync rounds bound collection themselves). During an imitation warm-up nothing is
    used yet, so actors wait once they are this many episodes ahead, until reinforcement learning starts."""
    trunk_cache_mb: int = 2048
    """--model.kind lm with LoRA below the top blocks: host memory (MiB) for the frozen blocks' output of
    drawn rows (common/policies/lm/trunk.py, float32, least recently drawn evicted first), so an update
    runs only the adapted blocks. 0: no cache, every update recomputes them. A recipe row (about 300 prompt
    and action tokens) of SmolLM2-135M takes about 0.7 MB: the default holds about 3,000 rows, 650
    demonstrations of 4.6 steps."""

    def __post_init__(self) -> None:
        _check(self.trunk_cache_mb >= 0, f"--trunk-cache-mb must be >= 0, got {self.trunk_cache_mb}")
        _check(self.replay_capacity >= 1, f"--replay-capacity must be at least 1, got {self.replay_capacity}")
        _check(self.alpha >= 0, f"--alpha must be >= 0, got {self.alpha}")
        _check(0.0 <= self.beta_start <= 1.0, f"--beta-start must be in [0, 1], got {self.beta_start}")
        _check(self.beta_steps >= 0, f"--beta-steps must be >= 0, got {self.beta_steps}")
        _check(
            all(w >= 0 for w in self.priority_weights) and sum(self.priority_weights) > 0,
            f"--priority-weights must be >= 0 and not all 0, got {self.priority_weights}",
        )
        _check(self.max_policy_lag >= 0, f"--max-policy-lag must be >= 0, got {self.max_policy_lag}")
        _check(
            self.samples_per_insert > 0,
            f"--samples-per-insert must be positive, got {self.samples_per_insert}",
        )
        _check(
            self.insert_slack is None or self.insert_slack >= 0,
            f"--insert-slack must be >= 0, got {self.insert_slack}",
        )


@dataclass(frozen=True)
class LossSettings:
    """The reinforcement-learning objective (A-RIDE or the plain actor-critic) and its options."""

    algorithm: Literal["aride", "a2c"] = "aride"
    """"aride": Retrace(lambda) targets, truncated-IS advantages, replay weights (DistRL); "a2c": the plain
    actor-critic (an ablation). The losses of each are in learner/losses (LOSSES)."""
    gamma: float = DEFAULTS.gamma
    """Discount."""
    lambda_: Annotated[float, tyro.conf.arg(name="lambda")] = DEFAULTS.lambda_
    """Retrace trace decay lambda."""
    rho_clip: float = DEFAULTS.rho_clip
    """Clip of the importance ratios pi/mu (rho-bar, c-bar and the policy-gradient weight)."""
    advantage_threshold: float | None = DEFAULTS.advantage_threshold
    """A-RIDE: only steps with advantage above this train the actor (DigiRL's filtering uses 0; None: all)."""
    binarize_advantage: bool | None = None
    """A-RIDE: instead of the signed advantage A, the actor weighs the steps that did better than the
    critic expected by non-negative weights (DigiRL's binarization; which weights is --actor-weighting):
    it imitates them and never pushes a sampled action down. Default:
    on after a warm-up on demonstrations, off from scratch. After a warm-up, the signed advantage's
    push-downs raised the entropy and cut sampled success by 0.2 to 0.4 within 30 updates, and held-out
    greedy success came out 0.36 against 0.49 binarized (BENCHMARKS.md, "The dip after the warm-up";
    measured with --actor-weighting binary)."""
    actor_weighting: ActorWeighting = DEFAULTS.actor_weighting
    """A-RIDE with binarization on: the actor's weight of each step (learner/losses/actor_weighting.py).
    "binary" (the default, chosen by `python -m benchmarks actor_loss`): 1[A > 0], DigiRL's form, which
    ignores the importance ratio rho = pi/mu; "binary_ratio": min(rho_clip, rho) * 1[A > 0], the
    truncated-IS form, off-policy corrected; "vmpo": V-MPO / AWR weights, softmax of (q - V) / --vmpo-eta
    over the better half of the steps, times min(rho_clip, rho), plus --vmpo-kl-coef * KL(mu || pi)."""
    vmpo_eta: float = DEFAULTS.vmpo_eta
    """--actor-weighting vmpo: the fixed temperature eta of the weights exp((q - V) / eta)."""
    vmpo_kl_coef: float = DEFAULTS.vmpo_kl_coef
    """--actor-weighting vmpo: the weight of the KL(mu || pi) penalty that keeps pi near the actors' policy."""
    off_policy_correction: bool = DEFAULTS.off_policy_correction
    """A-RIDE: --no-off-policy-correction sets every importance ratio to 1 (rho = c = 1), treating
    stale data as on-policy: the ablation of the correction (the paper benchmark's async_no_correction cell)."""
    instruction_filter: tuple[float, float] | None = None
    """A-RIDE: LOW HIGH of DigiRL's instruction-level critic filter: a trajectory trains the actor only if
    its task's recent success rate (learner/replay/instruction_critic.py) is in [LOW, HIGH], skipping tasks
    that are already solved or hopeless; tasks with fewer than 10 episodes always train. None: off."""
    entropy_coef: float | None = None
    """Weight of the exact entropy bonus. Default: 0.01 when learning from scratch (exploration), 0.001
    after a warm-up on demonstrations (at 0.01 the entropy kept growing through 15-minute SimPhone runs
    once the sparse advantages were small, undoing the imitation, and success sagged)."""
    value_coef: float = DEFAULTS.value_coef
    """Weight of the critic loss."""
    word_rename_rate: float = 0.0
    """Share of each training episode's distinct words renamed to random vocabulary ids, consistently
    across its instruction and screens (the pointer policy's, common/policies/pointer/augment.py).
    Applies to warm-up and reinforcement-learning batches. Off by default: renaming the words that say
    what to do costs more than it gains (BENCHMARKS.md; with the text encoder too, 0.3 on issue 34's
    validation protocol); --typed-word-rename-rate renames the values."""
    typed_word_rename_rate: float = 0.5
    """The same for the words an episode types (instruction words found in a text field at some step), so
    the policy learns to type and tap values it has never seen by where they sit in the instruction. After
    400 behavior-cloning updates on noisy SimPhone demonstrations, 0.5 gave 0.71 greedy success on
    held-out values and templates against 0.51 with no renaming at all (BENCHMARKS.md)."""
    rename_word_pieces: bool = True
    """With a text encoder: a renamed value (a word the episode types) also gets new WordPiece ids (random
    real pieces of the same kind, the same wherever the word stands in the episode's labels), so the
    encoder's states do not give the value away either (common/policies/pointer/augment.py); other
    renamed words keep their pieces. Off: the encoder still reads the original value under a renamed
    hashed id. Over three seeds it raised greedy success on held-out values from 0.82 to 0.95
    (BENCHMARKS.md, "Text encoder")."""

    def __post_init__(self) -> None:
        _check(
            self.algorithm in LOSSES, f"--algorithm must be one of {sorted(LOSSES)}, got {self.algorithm!r}"
        )
        _check(0.0 <= self.gamma <= 1.0, f"--gamma must be in [0, 1], got {self.gamma}")
        _check(0.0 <= self.lambda_ <= 1.0, f"--lambda must be in [0, 1], got {self.lambda_}")
        _check(self.rho_clip > 0, f"--rho-clip must be positive, got {self.rho_clip}")
        _check(
            self.advantage_threshold is None or math.isfinite(self.advantage_threshold),
            f"--advantage-threshold must be a finite number, got {self.advantage_threshold}",
        )
        _check(
            self.instruction_filter is None
            or 0.0 <= self.instruction_filter[0] <= self.instruction_filter[1] <= 1.0,
            f"--instruction-filter needs 0 <= LOW <= HIGH <= 1, got {self.instruction_filter}",
        )
        _check(
            self.entropy_coef is None or self.entropy_coef >= 0,
            f"--entropy-coef must be >= 0, got {self.entropy_coef}",
        )
        _check(self.value_coef >= 0, f"--value-coef must be >= 0, got {self.value_coef}")
        _check(
            self.actor_weighting in ACTOR_WEIGHTINGS,
            f"--actor-weighting must be one of {ACTOR_WEIGHTINGS}, got {self.actor_weighting!r}",
        )
        _check(self.vmpo_eta > 0, f"--vmpo-eta must be positive, got {self.vmpo_eta}")
        _check(self.vmpo_kl_coef >= 0, f"--vmpo-kl-coef must be >= 0, got {self.vmpo_kl_coef}")
        for flag, rate in (
            ("--word-rename-rate", self.word_rename_rate),
            ("--typed-word-rename-rate", self.typed_word_rename_rate),
        ):
            _check(0.0 <= rate <= 1.0, f"{flag} must be in [0, 1], got {rate}")

    def augmentation(self) -> Augmentation:
        """What these flags ask of the policy family's augmentation of training batches (the pointer
        policy renames words; other families ignore them). An augmented batch's ratios take a second
        forward pass on the observations the actors saw (the family's `evaluate`, its `acted_obs`)."""
        return Augmentation(self.word_rename_rate, self.typed_word_rename_rate, self.rename_word_pieces)


@dataclass(frozen=True)
class OptimizerConfig:
    """AdamW, its learning-rate schedule and gradient clipping."""

    learning_rate: float = 1e-3
    """AdamW learning rate."""
    lr_decay_updates: int = 2000
    """Cosine-decay the learning rate to lr_final_fraction of itself over this many updates (warm-up
    included), constant after; 0 keeps it constant. Set it to about the number of updates a run will
    make (2000: about 15 minutes on a 2-core CPU). Without the decay, 15-minute SimPhone runs swung
    between 0.7 and 0.9 success late in training; with it they held 0.98."""
    lr_final_fraction: float = 0.1
    """Where the cosine decay ends, as a fraction of --learning-rate."""
    max_grad_norm: float = 1.0
    """Global-norm gradient clipping."""
    weight_decay: float = 0.0
    """AdamW's decoupled weight decay: each update also moves every parameter by -learning rate x this x
    the parameter (Loshchilov & Hutter 2019). 0 (the default, and what every measured run used): Adam."""
    rl_lr_scale: float = 1.0
    """Reinforcement-learning updates step at this fraction of the scheduled learning rate; imitation
    updates (warm-up, --demo-update-every) at the full rate; both share one Adam state. 0.3 halved the
    dip in sampled success after the warm-up with the signed advantage; with the binarized one (the
    default after demonstrations) it made no difference (BENCHMARKS.md, "The dip after the warm-up")."""

    text_encoder_lr_scale: float = 0.03
    """With --model.train-text-encoder, the encoder's parameters step at this fraction of the learning
    rate (3e-5 at the default 1e-3: the usual rate for fine-tuning BERT-sized encoders, which a policy's
    rate would wash out)."""

    def __post_init__(self) -> None:
        _check(self.learning_rate >= 0, f"--learning-rate must be >= 0, got {self.learning_rate}")
        _check(
            self.text_encoder_lr_scale >= 0,
            f"--text-encoder-lr-scale must be >= 0, got {self.text_encoder_lr_scale}",
        )
        _check(self.lr_decay_updates >= 0, f"--lr-decay-updates must be >= 0, got {self.lr_decay_updates}")
        _check(
            0.0 <= self.lr_final_fraction <= 1.0,
            f"--lr-final-fraction must be in [0, 1], got {self.lr_final_fraction}",
        )
        _check(self.max_grad_norm > 0, f"--max-grad-norm must be positive, got {self.max_grad_norm}")
        _check(self.weight_decay >= 0, f"--weight-decay must be >= 0, got {self.weight_decay}")
        _check(self.rl_lr_scale > 0, f"--rl-lr-scale must be positive, got {self.rl_lr_scale}")


@dataclass(frozen=True)
class DashboardConfig:
    """What the learner shows and writes while it trains."""

    log_every: float = 2.0
    """Seconds between metrics.jsonl lines and progress prints."""
    console: Literal["auto", "live", "lines"] = "auto"
    """What the learner shows while training: "live" redraws a panel in place (actors, steps/s,
    updates/s, replay, policy lag, success per task family, rejects and drops, the next checkpoint),
    "lines" prints one progress line per record (for logs and CI), "auto" is live on a terminal only."""
    tensorboard: bool = True
    """Write every metrics record as TensorBoard scalars to RUN_DIR/tensorboard (`tensorboard --logdir
    RUN_DIR/tensorboard`), with the time shares of ingest, train steps and publishing; --no-tensorboard
    to turn off."""
    wandb_project: str = ""
    """Also log the same scalars to this Weights & Biases project (needs `pip install wandb`); "" = off."""
    metrics_port: int = -1
    """An HTTP endpoint on --bind for operators (learner/observe/status_http.py): Prometheus metrics at /metrics
    (the newest metrics record), health at /livez and /readyz. -1 = off, 0 picks a free port (written to
    endpoints.json as `metrics_port`); learner process I of a multi-process run on one host uses
    this port + I. No authentication: on 0.0.0.0 anyone who reaches the port reads the metrics."""
    live_stall_s: float = 300.0
    """/livez answers 503 once the main thread has not turned for this many seconds (it turns every few
    hundred ms, also while compiling or training): a hung collective or a deadlock, worth a restart."""

    def __post_init__(self) -> None:
        _check(self.log_every > 0, f"--log-every must be positive, got {self.log_every}")
        _check(
            self.metrics_port >= -1, f"--metrics-port must be -1 (off), 0 or a port, got {self.metrics_port}"
        )
        _check(self.live_stall_s > 0, f"--live-stall-s must be positive, got {self.live_stall_s}")


@dataclass(frozen=True)
class MultihostConfig:
    """Several learner processes training one model (jax.distributed)."""

    coordinator: str | None = None
    """Multi-host training: HOST:PORT of process 0's jax.distributed coordinator (the same on every
    learner process). Each process serves its own actors, trains on its share of every batch, and
    publishes the same parameters; process 0 leads checkpointing."""
    num_processes: int = 1
    """Multi-host training: number of learner processes (with --coordinator)."""
    process_id: int = 0
    """Multi-host training: this process's index in [0, num_processes). Processes other than 0 write
    their metrics, endpoints and actor logs to RUN_DIR/process-I; checkpoints are shared in RUN_DIR."""

    def __post_init__(self) -> None:
        _check(self.num_processes >= 1, f"--num-processes must be at least 1, got {self.num_processes}")
        _check(
            0 <= self.process_id < self.num_processes,
            f"--process-id must be in [0, {self.num_processes}), got {self.process_id}",
        )
        _check(
            self.num_processes == 1 or bool(self.coordinator),
            "--num-processes > 1 needs --coordinator HOST:PORT (process 0's address)",
        )


@dataclass(frozen=True)
class LearnerConfig:
    """Train a phone-control policy from actors' trajectories and publish parameter snapshots.

    Grouped for reading; every group's flags keep their plain names (`--alpha`, not `--buffer.alpha`).
    """

    run_dir: Path = Path("runs/latest")
    """Where metrics.jsonl, endpoints.json and the local actors' logs go (created if missing)."""
    mode: Literal["async", "sync"] = "async"
    """"async" (DistRL): actors collect continuously with the newest snapshot while the learner trains.
    "sync" (DigiRL's loop, the baseline): every round each environment runs one episode on the same
    policy version, the round ends when the slowest episode does, then the learner trains (as many
    updates as --samples-per-insert allows on the data so far) and publishes, and collection waits for
    that version. Same algorithm and configuration otherwise."""
    sync_round_timeout: float = 300.0
    """--mode sync: end a round this many seconds after its first episode even if some environments have
    not delivered (a dead device would otherwise stall training forever); counted in sync_rounds_timed_out."""
    time_limit: float = 0.0
    """Stop after this many seconds (0 = no limit)."""
    max_updates: int = 0
    """Stop after this many updates (0 = no limit)."""
    stop_at_success: float = 0.0
    """Stop once the training success rate (over the last 100 episodes, all collected after the warm-up)
    reaches this (0 = never)."""
    batch_size: int = 32
    """Episodes per update."""
    max_steps: int = 16
    """Longest episode in steps; actors truncate there and the learner refuses longer ones."""
    publish_every: int = 2
    """Publish a new parameter snapshot every this many updates."""
    checkpoint_every: int = 200
    """Save a checkpoint (orbax) to RUN_DIR/checkpoints every this many updates and at exit; a run dir
    that holds one resumes from it. 0 disables checkpoints."""
    checkpoint_every_s: float = 300.0
    """Also save one when this many seconds have passed since the last (0: by updates only), so a crash
    costs minutes of training rather than everything since the last --checkpoint-every updates."""
    snapshot_every: int = 0
    """Write the parameters to RUN_DIR/snapshots/tNNNNN.safetensors each time the wall clock since the
    start passes a multiple NNNNN of this many seconds, with a line in RUN_DIR/snapshots/index.jsonl
    (learner/serving/snapshots.py): policies to evaluate at equal times across runs. 0: never."""
    seed: int = 0
    """Seed of the model initialization and of the local actors' environments."""
    init_params: Path | None = None
    """Start a new run from this parameters file instead of fresh parameters (what actors receive: with
    LoRA the adapters and heads; e.g. another run's snapshots/warmup-end.safetensors or a --snapshot-every
    file), its --model.* the same; the optimizer starts fresh. With --warmup-updates 0 a run goes straight
    to reinforcement learning from a policy some other run imitated (a 60-minute lm run spends 30 minutes
    on its warm-up before a reinforcement-learning setting is measured). Not used when the run directory
    has a checkpoint: the resume continues that run."""
    model: ModelConfig = field(default_factory=lambda: ModelConfig(text_encoder="minilm"))
    """Policy network size (sent to every actor in WELCOME). The learner's default adds the pretrained text
    encoder (all-MiniLM-L6-v2, --model.text-encoder minilm): over three seeds it doubles success on task
    phrasings never trained on (BENCHMARKS.md "Text encoder"); --model.text-encoder none trains on hashed
    words alone."""
    model_preset: Literal["custom", "large"] = "custom"
    """"custom": the network --model.* describes (default: the small CPU model); "large": the ~134M-parameter
    preset for accelerators (common/policies/pointer/sizes.py; replaces --model.*), meant for
    --mesh.param-sharding model or fsdp."""
    mesh: MeshConfig = field(default_factory=MeshConfig)
    """Device mesh of the train step (axes 'data' x 'model'); the batch size must be a multiple of 'data'."""
    emulator: EmulatorModelConfig = field(default_factory=EmulatorModelConfig)
    """The emulator latency and fault model of the local actors (--emulator.enabled; see docs/SIMPHONE.md)."""
    transport: Annotated[TransportConfig, OmitArgPrefixes] = field(default_factory=TransportConfig)
    """The learner's two sockets and how it treats the actors on them (delivery, flow control, security)."""
    local: Annotated[LocalActorsConfig, OmitArgPrefixes] = field(default_factory=LocalActorsConfig)
    """Actor processes the learner starts itself on loopback (the one-command demo)."""
    imitation: Annotated[ImitationConfig, OmitArgPrefixes] = field(default_factory=ImitationConfig)
    """Demonstrations: the warm-up on them, their share of later updates, and the replay prefill."""
    buffer: Annotated[ReplayConfig, OmitArgPrefixes] = field(default_factory=ReplayConfig)
    """The replay buffer (DPER) and both sides of its rate limit."""
    loss: Annotated[LossSettings, OmitArgPrefixes] = field(default_factory=LossSettings)
    """The reinforcement-learning objective (A-RIDE or the plain actor-critic) and its options."""
    optimizer: Annotated[OptimizerConfig, OmitArgPrefixes] = field(default_factory=OptimizerConfig)
    """AdamW, its learning-rate schedule and gradient clipping."""
    dashboards: Annotated[DashboardConfig, OmitArgPrefixes] = field(default_factory=DashboardConfig)
    """What the learner shows and writes while it trains."""
    multihost: Annotated[MultihostConfig, OmitArgPrefixes] = field(default_factory=MultihostConfig)
    """Several learner processes training one model (jax.distributed)."""

    def __post_init__(self) -> None:
        """Rules across groups and of the top-level settings (each group checks its own)."""
        if self.model.kind == "lm" and self.model.text_encoder == "minilm":
            # The learner's default encoder belongs to the pointer policy: the lm family reads with its decoder.
            object.__setattr__(self, "model", dataclasses.replace(self.model, text_encoder="none"))
        _check(
            self.model.kind != "lm" or not self.model.uses_text_encoder,
            "--model.text-encoder is the pointer policy's: the lm family reads the screen with its decoder",
        )
        make_policy(
            self.model
        )  # ValueError naming --model.kind when it names no family (imports a module:Class)
        _check(
            not (self.mode == "sync" and self.multihost.num_processes > 1),
            "--mode sync runs on one learner process (its rounds are not coordinated across hosts)",
        )
        _check(
            self.sync_round_timeout > 0,
            f"--sync-round-timeout must be positive, got {self.sync_round_timeout}",
        )
        _check(
            not self.transport.audit_log or self.durability() != "none",
            "--audit-log records the write-ahead log's batches: give --durability os or fsync (or "
            "--checkpoint-every > 0 with auto)",
        )
        _check(self.time_limit >= 0, f"--time-limit must be >= 0, got {self.time_limit}")
        _check(self.max_updates >= 0, f"--max-updates must be >= 0, got {self.max_updates}")
        _check(self.snapshot_every >= 0, f"--snapshot-every must be >= 0 seconds, got {self.snapshot_every}")
        _check(
            0.0 <= self.stop_at_success <= 1.0,
            f"--stop-at-success must be in [0, 1], got {self.stop_at_success}",
        )
        _check(self.batch_size >= 1, f"--batch-size must be at least 1, got {self.batch_size}")
        _check(self.max_steps >= 1, f"--max-steps must be at least 1, got {self.max_steps}")
        _check(self.publish_every >= 1, f"--publish-every must be at least 1, got {self.publish_every}")
        _check(self.checkpoint_every >= 0, f"--checkpoint-every must be >= 0, got {self.checkpoint_every}")
        _check(
            self.checkpoint_every_s >= 0 and math.isfinite(self.checkpoint_every_s),
            f"--checkpoint-every-s must be >= 0, got {self.checkpoint_every_s}",
        )
        _check(
            self.checkpoint_every > 0 or self.transport.durability in ("auto", "none"),
            f"--durability {self.transport.durability} needs checkpoints (--checkpoint-every > 0): the log is "
            "replayed on top of a checkpoint and pruned by the next one",
        )

    def durability(self) -> str:
        """--durability with "auto" resolved: "fsync" with checkpoints, "none" without."""
        chosen = self.transport.durability
        if chosen == "auto":
            return "fsync" if self.checkpoint_every else "none"
        return chosen

    def insert_slack(self) -> int:
        """--insert-slack, or its default (ReplayConfig.insert_slack): 4 x --batch-size with local actors in
        async mode, else 0 (off)."""
        if self.buffer.insert_slack is not None:
            return self.buffer.insert_slack
        return 4 * self.batch_size if self.local.local_actors and self.mode == "async" else 0

    def uses_demonstrations(self) -> bool:
        """Whether this run warms up on, or prefills its replay with, demonstrations (a --demos file, or
        SimPhone oracle ones written at start-up)."""
        im = self.imitation
        wanted = im.warmup_updates > 0 or im.prefill_demos or im.demo_update_every > 0
        return wanted and (im.demos is not None or (self.local.env == "simphone" and im.warmup_demos > 0))

    def augmentation(self) -> Augmentation:
        """What the loss flags ask of the family's augmentation of training batches (word renaming for the
        pointer policy, common/policies/pointer/augment.py); whether it applies is the family's to say
        (common/policies/family.py:augments)."""
        return self.loss.augmentation()

    def entropy(self) -> float:
        """--entropy-coef, or its default: 0.001 after demonstrations, 0.01 from scratch."""
        if self.loss.entropy_coef is not None:
            return self.loss.entropy_coef
        return 0.001 if self.uses_demonstrations() else 0.01

    def binarize_advantage(self) -> bool:
        """--binarize-advantage, or its default: on after demonstrations (fine-tuning), off from scratch."""
        if self.loss.binarize_advantage is not None:
            return self.loss.binarize_advantage
        return self.uses_demonstrations()


GROUPS = ("transport", "local", "imitation", "buffer", "loss", "optimizer", "dashboards", "multihost")
"""LearnerConfig's fields that only group others (their fields are flags and JSON keys of their own)."""


def flat_dict(cfg: LearnerConfig) -> dict[str, Any]:
    """The config as plain JSON values (paths as strings), one level of settings by field name with the
    groups dissolved (model, mesh and emulator stay nested, as their flags are): the layout of
    config.json and of the config stored with every checkpoint, the same as before the settings were
    grouped, so older run dirs and `learner eval` read alike. Settings whose default depends on others
    (--entropy-coef, --binarize-advantage, --durability, --insert-slack) are stored as the run resolved
    them."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if f.name in GROUPS:
            out.update(dataclasses.asdict(value))
        else:
            out[f.name] = dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
    out.update(
        entropy_coef=cfg.entropy(),
        binarize_advantage=cfg.binarize_advantage(),
        durability=cfg.durability(),
        insert_slack=cfg.insert_slack(),
    )
    return json.loads(json.dumps(out, default=str))


OLD_SPELLINGS = {"--lambda_": "--lambda"}
"""Flags renamed since they were first documented: still read, not shown in --help."""


def parse_args(args: list[str] | None = None) -> LearnerConfig:
    """`python -m learner`'s flags -> LearnerConfig (tyro prints --help and bad values, exits 2); the old
    spellings of renamed flags are read too."""
    args = sys.argv[1:] if args is None else args
    renamed = []
    for arg in args:
        name, eq, value = arg.partition("=")
        renamed.append(OLD_SPELLINGS.get(name, name) + eq + value)
    cfg = tyro.cli(LearnerConfig, args=renamed)
    cfg, chosen = recipes.apply_recipe(cfg, renamed)
    if chosen:
        settings = " ".join(recipes.setting(path, value) for path, value in chosen.items())
        print(f"learner: --model.kind {cfg.model.kind} recipe: {settings} (a flag given wins)", flush=True)
    problem = warmup_noise_problem(cfg)
    if problem:
        raise SystemExit(f"learner: {problem}")
    return cfg


def warmup_noise_problem(cfg: LearnerConfig) -> str:
    """Why --warmup-noise cannot be honoured (one line), or "": the oracle demonstrations written at
    start-up mix in random actions only where the family's demonstrator can (the pointer policy's);
    checked once the family's recipe is applied (its default noise is 0)."""
    im = cfg.imitation
    generates = im.demos is None and cfg.uses_demonstrations()
    if not (generates and im.warmup_noise) or getattr(make_policy(cfg.model), "noisy_demos", True):
        return ""
    return (
        f"--warmup-noise {im.warmup_noise}: the --model.kind {cfg.model.kind} demonstrator is the oracle "
        "alone (it has no random actions to mix in); use --warmup-noise 0"
    )
