"""Command-line configuration of `python -m learner` (tyro builds --help from these docstrings)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from common.config import EmulatorModelConfig, ModelConfig

ParamSharding = Literal["replicated", "fsdp", "model"]
PARAM_SHARDINGS: tuple[str, ...] = ("replicated", "fsdp", "model")


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
            raise ValueError(f"param_sharding must be one of {PARAM_SHARDINGS}, got {self.param_sharding!r}")
        if self.model < 1:
            raise ValueError(f"mesh model axis must be >= 1, got {self.model}")
        if self.data == 0 or self.data < -1:
            raise ValueError(f"mesh data axis must be >= 1 or -1 (all remaining devices), got {self.data}")


@dataclass
class LearnerConfig:
    """Train a phone-control policy from actors' trajectories and publish parameter snapshots."""

    run_dir: Path = Path("runs/latest")
    """Where metrics.jsonl, endpoints.json and the local actors' logs go (created if missing)."""
    bind: str = "127.0.0.1"
    """Address the sockets bind to. Use 0.0.0.0 (or this host's LAN address) for actors on other machines."""
    ingest_port: int = 5555
    """ROUTER port for handshakes, trajectories, acks and parameter requests (0 picks a free port)."""
    params_port: int = 5556
    """PUB port for parameter snapshots (0 picks a free port)."""
    curve_secret_key: Path | None = None
    """CURVE security on both sockets: the learner's key pair (a .key_secret file from `python -m learner
    keys`). Needs --curve-authorized. Traffic is encrypted and only authorized actors connect."""
    curve_authorized: Path | None = None
    """Folder of the public keys (.key files) of the actors allowed to connect."""
    insecure: bool = False
    """Allow binding to an address other than loopback without CURVE keys: anyone who can reach the
    ports could then feed the learner trajectories and read its parameters."""
    mode: Literal["async", "sync"] = "async"
    """"async" (DistRL): actors collect continuously with the newest snapshot while the learner trains.
    "sync" (DigiRL's loop, the baseline): every round each environment runs one episode on the same
    policy version, the round ends when the slowest episode does, then the learner trains (as many
    updates as --samples-per-insert allows on the data so far) and publishes, and collection waits for
    that version. Same algorithm and configuration otherwise."""
    sync_round_timeout: float = 300.0
    """--mode sync: end a round this many seconds after its first episode even if some environments have
    not delivered (a dead device would otherwise stall training forever); counted in sync_rounds_timed_out."""
    local_actors: int = 0
    """Actor processes to start on loopback (the one-command demo); 0 means actors connect from elsewhere."""
    emulator: EmulatorModelConfig = field(default_factory=EmulatorModelConfig)
    """The emulator latency and fault model of the local actors (--emulator.enabled; see docs/SIMPHONE.md)."""
    env: Literal["simphone", "standin"] = "simphone"
    """Environment of the local actors: "simphone" (the built-in phone) or "standin" (a tiny one)."""
    tasks: str = "general"
    """SimPhone tasks of the local actors (a suite name, a .json file or a folder)."""
    split: str = "train"
    """SimPhone split of the local actors."""
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
    envs_per_actor: int = 16
    """Environments each local actor runs (batched inference)."""
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
    algorithm: Literal["aride", "a2c"] = "aride"
    """"aride": Retrace(lambda) targets, truncated-IS advantages, replay weights (DistRL); "a2c": the plain
    actor-critic (an ablation)."""
    lambda_: float = 0.95
    """Retrace trace decay lambda."""
    rho_clip: float = 1.0
    """Clip of the importance ratios pi/mu (rho-bar, c-bar and the policy-gradient weight)."""
    advantage_threshold: float | None = None
    """A-RIDE: only steps with advantage above this train the actor (DigiRL's filtering uses 0; None: all)."""
    binarize_advantage: bool = False
    """A-RIDE: the actor uses 1[A > 0] instead of the advantage A (DigiRL's binarization)."""
    instruction_filter: tuple[float, float] | None = None
    """A-RIDE: LOW HIGH of DigiRL's instruction-level critic filter: a trajectory trains the actor only if
    its task's recent success rate (learner/instruction_critic.py) is in [LOW, HIGH], skipping tasks
    that are already solved or hopeless; tasks with fewer than 10 episodes always train. None: off."""
    word_rename_rate: float = 0.0
    """Share of each training episode's distinct words renamed to random vocabulary ids, consistently
    across its instruction and screens (learner/augment.py). Applies to warm-up and reinforcement-learning
    batches. Off by default: renaming the words that say what to do costs more than it gains (BENCHMARKS.md);
    --typed-word-rename-rate renames the values."""
    typed_word_rename_rate: float = 0.5
    """The same for the words an episode types (instruction words found in a text field at some step), so
    the policy learns to type and tap values it has never seen by where they sit in the instruction. After
    400 behavior-cloning updates on noisy SimPhone demonstrations, 0.5 gave 0.71 greedy success on
    held-out values and templates against 0.51 with no renaming at all (BENCHMARKS.md)."""
    replay: Literal["prioritized", "uniform"] = "prioritized"
    """"prioritized" (DPER: sampling proportional to priority^alpha) or "uniform" (an ablation)."""
    samples_per_insert: float = 4.0
    """Rate limit (as Reverb's): reinforcement-learning updates stop once they have sampled, on average,
    this many times per episode inserted; they resume as new episodes arrive."""
    replay_capacity: int = 2048
    """Episodes kept for training; the oldest is evicted at capacity (counted in dropped_episodes)."""
    alpha: float = 0.6
    """Priority exponent of prioritized sampling."""
    beta_start: float = 0.4
    """Initial importance-weight exponent, annealed linearly to 1."""
    beta_steps: int = 2000
    """Updates over which beta reaches 1."""
    priority_weights: tuple[float, float, float] = (1.0, 0.5, 0.1)
    """(w1, w2, w3) of the trajectory priority w1*mean|delta| + w2*mean(min(rho_clip, rho)) + w3*mean(-log pi)."""
    max_policy_lag: int = 50
    """Trajectories whose oldest step is more than this many policy versions old are dropped (0: keep all)."""
    publish_every: int = 2
    """Publish a new parameter snapshot every this many updates."""
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
    gamma: float = 0.95
    """Discount."""
    entropy_coef: float | None = None
    """Weight of the exact entropy bonus. Default: 0.01 when learning from scratch (exploration), 0.001
    after a warm-up on demonstrations (at 0.01 the entropy kept growing through 15-minute SimPhone runs
    once the sparse advantages were small, undoing the imitation, and success sagged)."""
    value_coef: float = 0.5
    """Weight of the critic loss."""
    checkpoint_every: int = 200
    """Save a checkpoint (orbax) to RUN_DIR/checkpoints every this many updates and at exit; a run dir
    that holds one resumes from it. 0 disables checkpoints."""
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
    actor_timeout: float = 15.0
    """An actor silent this long is forgotten: it no longer counts as connected and must HELLO again."""
    actor_credit: int = 8
    """Flow control: TRAJ batches each actor may have sent and not yet acknowledged. Bounds the learner's
    ingest queue at (actors x credit) batches, whatever the actors do."""
    insert_slack: int = 0
    """Rate limit on the insert side (Reverb's error buffer): while stored episodes run more than this
    many ahead of what reinforcement-learning updates have used (samples / samples_per_insert), the
    learner grants no credit, so actors wait or discard (their --when-blocked). 0: never; actors keep
    collecting as DistRL's do, and the replay evicts its oldest episodes."""
    seed: int = 0
    """Seed of the model initialization and of the local actors' environments."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """Policy network size (sent to every actor in WELCOME)."""
    model_preset: Literal["custom", "large"] = "custom"
    """"custom": the network --model.* describes (default: the small CPU model); "large": the ~134M-parameter
    preset for accelerators (learner.mesh.large_model_config; replaces --model.*), meant for
    --mesh.param-sharding model or fsdp."""
    mesh: MeshConfig = field(default_factory=MeshConfig)
    """Device mesh of the train step (axes 'data' x 'model'); the batch size must be a multiple of 'data'."""
    prefill_demos: bool = True
    """Also put the warm-up demonstrations into the replay (as DigiRL and DistRL do with offline data), so
    early reinforcement-learning batches mix them with the actors' episodes."""
    coordinator: str | None = None
    """Multi-host training: HOST:PORT of process 0's jax.distributed coordinator (the same on every
    learner process). Each process serves its own actors, trains on its share of every batch, and
    publishes the same parameters; process 0 leads checkpointing."""
    num_processes: int = 1
    """Multi-host training: number of learner processes (with --coordinator)."""
    process_id: int = 0
    """Multi-host training: this process's index in [0, num_processes). Processes other than 0 write
    their metrics, endpoints and actor logs to RUN_DIR/process-I; checkpoints are shared in RUN_DIR."""

    def uses_demonstrations(self) -> bool:
        """Whether this run warms up on, or prefills its replay with, demonstrations (a --demos file, or
        SimPhone oracle ones written at start-up)."""
        wanted = self.warmup_updates > 0 or self.prefill_demos or self.demo_update_every > 0
        return wanted and (self.demos is not None or (self.env == "simphone" and self.warmup_demos > 0))

    def entropy(self) -> float:
        """--entropy-coef, or its default: 0.001 after demonstrations, 0.01 from scratch."""
        if self.entropy_coef is not None:
            return self.entropy_coef
        return 0.001 if self.uses_demonstrations() else 0.01
