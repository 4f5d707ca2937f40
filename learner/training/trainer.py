"""The training state and the one way to change it: a jitted, sharded update on a Batch.

Acme's learner is the model: one object holds what training changes (parameters and optimizer state on
the device mesh, the update count, the policy version, the demonstrations' random stream) and offers
`step`, `save` and `restore`; everything around it (the replay, the sockets, the schedule) lives
elsewhere and hands it batches.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, wait
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import jax
import numpy as np
from flax import nnx

from common.backbones.decoder.lora import split_trained
from common.params_file import flat_to_params, params_to_flat
from common.policies import make_policy
from common.policies.family import augments, host_inputs, scaled_param, update_shapes
from learner.batch import Batch, collate, example_batch
from learner.config import LearnerConfig
from learner.losses import LossParams, PriorityTerms, get_loss
from learner.training import multihost
from learner.training.checkpoint import Checkpointer, TrainState, rng_state, set_rng_state
from learner.training.sharded_step import make_sharded_train_step
from learner.training.sharding import batch_sharding, init_opt_state, named_shardings, param_specs
from learner.training.train_step import make_optimizer

R = TypeVar("R")


class DemoFit(NamedTuple):
    """How the parameters fit demonstrations, means over their steps (learner/warmup.py's validation)."""

    nll: float
    """-log pi(a_demo | s), nats per action: the imitation loss."""
    rho: float
    """pi(a_demo | s) / mu(a_demo | s), unclipped: the importance weight a demonstration step gets in a
    reinforcement-learning batch (the lm oracle is deterministic, mu = 1, so rho = pi(a_demo | s))."""
    value_gap: float
    """G_t - V(s_t): the demonstrator's discounted return from the step (bootstrapped from V where the
    demonstration was truncated) minus the critic's value. The critic estimates the learner's policy
    (Retrace corrects demonstrations towards it), so the gap is how far the policy's value is from the
    demonstrator's as the critic sees it: it closes as rho goes to 1."""


def discounted_returns(episode, bootstrap: float, gamma: float) -> np.ndarray:
    """[L] float64 G_t = r_t + gamma G_{t+1} of one episode, G_L = 0 when it ended in a terminal state,
    `bootstrap` (V(s_L)) when it was truncated."""
    rewards = np.asarray(episode.steps["reward"], np.float64)
    out = np.zeros(len(rewards))
    g = 0.0 if not episode.truncated else float(bootstrap)
    for t in range(len(rewards) - 1, -1, -1):
        g = rewards[t] + gamma * g
        out[t] = g
    return out


SERVE_EVERY_S = 0.01
"""While a helper thread compiles or trains, the caller's thread calls `serve()` after waiting at most this
long for it: an actor's message waits at most this plus one `serve()` (and the end of the work is seen at
once, not at the next serve)."""
GIL_SWITCH_S = 0.0005
"""Meanwhile the interpreter hands the GIL from one running thread to another waiting one after this
long (Python's default: 5 ms). Each blocking call of `serve()` (a socket poll, a large numpy copy) gives
the GIL up, and getting it back from a helper running Python (tracing and lowering a compile, the host
side of a step) took up to the whole interval every time: a batch of episodes that takes 50 ms to store
took up to 0.8 s during a compile."""


class Abandoned(Exception):
    """`run_while_serving` stopped waiting (its `abandon()` said so) and left the work running on its
    helper thread: whatever the work was given (an update's donated parameters) is gone to it."""


def run_while_serving(
    fn: Callable[[], R],
    serve: Callable[[], None] | None,
    name: str = "busy",
    abandon: Callable[[], bool] | None = None,
) -> R:
    """`fn()` on a helper thread while this thread calls `serve()` every SERVE_EVERY_S until it is done;
    returns what it returned (or raises what it raised, once it is done). Without `serve`, `fn()` here.
    When `abandon()` turns true first, raises Abandoned at once (the learner's SIGTERM during an update that
    takes a minute): the helper is a daemon thread, so it does not keep the process alive.

    The learner's sockets stay on its main thread (ZeroMQ sockets are not thread-safe), which keeps
    answering handshakes and heartbeats and taking in episodes while `fn` compiles or trains. So `fn`
    and `serve` must share nothing that either changes: `fn` changes only the Trainer (see `step`) and
    reads nothing else that changes (a drawn batch's episodes do not change), `serve` owns the sockets,
    the replay and the statistics. And `serve` must call no collective: with several learner processes
    every process must issue the same collectives in the same order, and `serve` runs a different
    number of times on each. While both threads run, the GIL changes hands more often (GIL_SWITCH_S)."""
    if serve is None:
        return fn()
    switch = sys.getswitchinterval()
    sys.setswitchinterval(min(switch, GIL_SWITCH_S))
    future: Future[R] = Future()

    def work() -> None:
        try:
            future.set_result(fn())
        except BaseException as e:  # handed to the waiting thread
            future.set_exception(e)

    try:
        threading.Thread(target=work, name=name, daemon=True).start()
        while not wait([future], timeout=SERVE_EVERY_S).done:
            serve()
            if abandon is not None and abandon() and not future.done():
                raise Abandoned(name)
        return future.result()
    finally:
        sys.setswitchinterval(switch)


@dataclasses.dataclass(frozen=True)
class StepResult:
    """What one update reports: scalar metrics, and this process's rows of the new replay priorities."""

    metrics: dict[str, float]
    """Loss parts, gradient and parameter norms (floats; the losses in learner/losses name them)."""
    priorities: PriorityTerms | None
    """The new replay priority terms of this process's rows [local batch] (None after an imitation update
    or with a loss that has none, --algorithm a2c)."""
    skipped: bool
    """The loss or gradient was not finite: the parameters were left as they were."""


class Trainer:
    """Parameters, optimizer state, update count and policy version of one learner process.

    `step(batch, imitation)` applies one update (A-RIDE or the plain actor-critic, or behavior cloning
    for an imitation update) and counts it; `new_version()` numbers a snapshot to publish; `save` and
    `restore` write and read the state with a Checkpointer. Parameters are placed on the mesh per
    --mesh.param-sharding; the batch is split over 'data', and with several processes each contributes
    `rows` of it.
    """

    def __init__(self, cfg: LearnerConfig, mesh: jax.sharding.Mesh, rank: int):
        self.cfg = cfg
        self.mesh = mesh
        self.rank = rank
        self.rows = multihost.local_rows(batch_sharding(mesh), cfg.batch_size)
        """This process's rows of every global batch."""
        self.local_batch = self.rows.stop - self.rows.start
        self.policy = make_policy(cfg.model)
        graphdef, host_params = self.policy.create(cfg.seed)
        self.graphdef = graphdef
        specs = param_specs(host_params, mesh, cfg.mesh.param_sharding)
        self.params = multihost.place(host_params, named_shardings(specs, mesh))
        opt = cfg.optimizer
        optimizer = make_optimizer(
            opt.learning_rate,
            opt.max_grad_norm,
            weight_decay=opt.weight_decay,
            decay_updates=opt.lr_decay_updates,
            final_fraction=opt.lr_final_fraction,
        )
        self.opt_state = init_opt_state(optimizer, self.params, mesh, specs)
        loss, params = get_loss(cfg.loss.algorithm), loss_params(cfg)
        step = functools.partial(
            make_sharded_train_step,
            graphdef,
            optimizer,
            loss_params=params,
            evaluate=self.policy.evaluate,
            mesh=mesh,
            param_shardings=specs,
            encoder_update_scale=opt.text_encoder_lr_scale,
            scaled_param=scaled_param(self.policy),
        )
        self._rl_step = step(loss.rl, update_scale=opt.rl_lr_scale)
        self._imitation_step = step(loss.imitation)
        self.update = 0
        """Updates applied (imitation ones included); checkpoints are numbered by it."""
        self.version = 0
        """The newest published policy version."""
        self._served_frozen: Any = None
        """The inference service's copy of a frozen base (`serving_copy`), made once."""
        # Process I's demonstration draws: process 0's stream jumped I times (so a restored state stays right).
        self.demo_rng = _jumped(np.random.default_rng(cfg.seed), rank)
        self.host_inputs = host_inputs(self.policy, graphdef, cfg.buffer.trunk_cache_mb * 2**20)
        """The family's host-side step before each update (common/policies/family.py:HostInputs; the
        pointer policy's frozen text encoder adds its cached states, the lm family packs the rows that
        matter, adds its cached frozen trunk and cuts the shared preamble), applied to the observations and to the acted ones of an augmented batch; None for a
        family or run without one."""
        self.shape_bound = update_shapes(self.policy, cfg.max_steps) if self.host_inputs else None
        """How many batch shapes the host step gives, at most (common/policies/family.py:ShapedUpdates);
        None: one. With several the update compiles per shape (jit's cache) when a batch first has it,
        not ahead (`compile`)."""
        self._demo_eval: Callable | None = None
        """The jitted forward `demo_fit` scores demonstrations with (built at its first call)."""
        self.shapes: set[tuple] = set()
        """The (imitation, batch shapes) updates ran with: what was compiled (train/update_shapes)."""

    def compile(
        self,
        imitation: bool,
        serve: Callable[[], None] | None = None,
        abandon: Callable[[], bool] | None = None,
    ) -> float:
        """Compile the update(s) ahead of data on a helper thread, calling `serve()` meanwhile
        (`run_while_serving`: the learner keeps answering handshakes and taking in data, a first compile
        can take longer than an actor waits); the imitation update only when it will be used. Returns the
        seconds it took. A family whose host step packs batches into a few shapes (`shape_bound`: the lm
        family) compiles each shape when a batch first has it, inside that update (`step`)."""
        t0 = time.monotonic()
        if self.shape_bound is not None:
            return 0.0
        sharding = batch_sharding(self.mesh)
        choices = self.policy.episode_spec().choice_arrays()
        cfg = self.cfg
        example = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
            example_batch(
                self.policy.input_spec(),
                cfg.batch_size,
                cfg.max_steps,
                augments(self.policy, cfg.augmentation()),
                choices=choices,
            ),
        )
        # Imitation updates read no acted observations (see `step`).
        plain = example._replace(acted_obs=None)

        def compile_both():
            rl = self._rl_step.lower(self.params, self.opt_state, example).compile()
            bc = (
                self._imitation_step.lower(self.params, self.opt_state, plain).compile()
                if imitation
                else None
            )
            return rl, bc

        self._rl_step, self._imitation_step = run_while_serving(compile_both, serve, "compile", abandon)
        return time.monotonic() - t0

    def step(self, batch: Batch, imitation: bool) -> StepResult:
        """One update on this process's rows of a batch (every process calls it together).

        The learner calls it on a helper thread while its main thread keeps serving actors (learner/loop.py,
        `run_while_serving`). The step is given (donated) the parameters and optimizer state, so nothing
        may read them until it returns; the serving thread reads of the Trainer only the counts `update`
        and `version`, and answers PARAM_REQ from the snapshot it published."""
        if imitation:
            # No second pass for imitation: it slowed the warm-up by about 20% (the README run's), and the
            # demonstrations' ratios pi / mu_oracle are far from 1 anyway, so the renaming's effect on
            # them, unlike on RL data at zero lag, is small next to the policy gap the critic corrects.
            batch = batch._replace(acted_obs=None)
        batch = self.with_inputs(batch)
        batch = multihost.global_batch(batch, batch_sharding(self.mesh), self.cfg.batch_size)
        step_fn = self._imitation_step if imitation else self._rl_step
        self.shapes.add((imitation, *(x.shape for x in jax.tree.leaves(batch))))
        self.params, self.opt_state, metrics, terms = step_fn(self.params, self.opt_state, batch)
        self.update += 1  # with the parameters it counts, whatever happens next
        metrics, terms = jax.device_get(multihost.host_copy((metrics, terms)))
        metrics["update_shapes"] = len(self.shapes)
        metrics.update(getattr(self.host_inputs, "stats", dict)())
        priorities = None if terms is None else PriorityTerms(*(np.asarray(t)[self.rows] for t in terms))
        skipped = bool(metrics.pop("skipped_nonfinite"))
        return StepResult({k: float(v) for k, v in metrics.items()}, priorities, skipped)

    def demo_fit(self, episodes: list) -> DemoFit:
        """How the current parameters fit `episodes` (learner/warmup.py's validation), forward only, means
        over their steps. In batches of this process's rows, the last one filled up with repeats that are
        not counted (one shape); single-process (LearnerConfig refuses --validation-demos with several)."""
        if self._demo_eval is None:
            policy, graphdef = self.policy, self.graphdef

            def scores(params, obs, choice):
                ev = policy.evaluate(graphdef, params, obs, choice, None)
                return ev.logp, ev.values

            self._demo_eval = jax.jit(scores)
        nll, rho, gap, steps, b = 0.0, 0.0, 0.0, 0, self.local_batch
        for i in range(0, len(episodes), b):
            chunk = episodes[i : i + b]
            batch = self.with_inputs(collate((chunk * b)[:b], self.cfg.max_steps))
            logp, values = jax.device_get(self._demo_eval(self.params, batch.obs, batch.choice))
            for row, ep in enumerate(chunk):
                n = ep.length
                lp = np.asarray(logp[row, :n], np.float64)
                mu = np.asarray(batch.behavior_logp[row, :n], np.float64)
                v = np.asarray(values[row, : n + 1], np.float64)
                nll -= lp.sum()
                rho += np.exp(lp - mu).sum()
                gap += (discounted_returns(ep, v[n], self.cfg.loss.gamma) - v[:n]).sum()
                steps += n
        steps = max(steps, 1)
        return DemoFit(nll / steps, rho / steps, gap / steps)

    def with_inputs(self, batch: Batch) -> Batch:
        """`batch` with what the update reads besides the features (`host_inputs`: the pointer policy's
        frozen encoder states), added to the observations and to the acted ones of an augmented batch;
        unchanged otherwise."""
        if self.host_inputs is None:
            return batch
        obs, acted = self.host_inputs(batch.obs, batch.acted_obs, batch.choice, self.params)
        return batch._replace(obs=obs, acted_obs=acted)

    def new_version(self) -> int:
        """The next policy version (the caller publishes `snapshot()` under it)."""
        self.version += 1
        return self.version

    def snapshot(self) -> dict[str, np.ndarray]:
        """The parameters as the host copy actors receive (gathered from every device and process): with
        LoRA adapters only what trains (adapters and heads; actors hold the frozen base themselves)."""
        return params_to_flat(multihost.host_copy(split_trained(self.params)[0]))

    def serving_copy(self) -> Any:
        """The parameters as the inference service acts with them: a copy on the same devices (the next
        update donates the arrays it is given, so the service cannot keep those). A frozen base (LoRA) is
        copied once and shared by every later copy: per version only what trains is copied."""
        trained, frozen = split_trained(self.params)
        trained = jax.tree.map(lambda x: x.copy(), trained)
        if frozen is None:
            return trained
        if self._served_frozen is None:
            self._served_frozen = jax.tree.map(lambda x: x.copy(), frozen)
        return nnx.merge_state(trained, self._served_frozen)

    def digest(self) -> str:
        """A short hash of the snapshot: equal digests mean bit-identical parameters (across processes, runs)."""
        h = hashlib.sha256()
        flat = self.snapshot()
        for name in sorted(flat):
            h.update(name.encode())
            h.update(np.ascontiguousarray(flat[name]).tobytes())
        return h.hexdigest()[:16]

    def write_decoder(self, path: Path) -> None:
        """A family with a pretrained decoder (lm) writes what training changed in it to `path`, the run's
        export source (`python -m learner export RUN_DIR OUT`); other families write nothing. Every
        process calls it (the gather is a collective); process 0 writes."""
        write = getattr(self.policy, "write_decoder", None)
        if write is not None:
            params = multihost.host_copy(self.params)
            if self.rank == 0:
                write(self.graphdef, params, path)

    def save(self, checkpointer: Checkpointer, config: dict[str, Any]) -> None:
        state = TrainState(self.params, self.opt_state, self.update, self.version, rng_state(self.demo_rng))
        checkpointer.save(state, config)

    def start_from(self, flat: dict[str, np.ndarray]) -> None:
        """--init-params: the trained part (adapters and heads with LoRA, else every parameter) from a
        parameters file's `flat` (ValueError naming what does not fit), on the current parameters'
        devices; the frozen base and the optimizer state stay as built."""
        trained, frozen = split_trained(self.params)
        loaded = flat_to_params(trained, flat)
        loaded = jax.device_put(loaded, jax.tree.map(lambda x: x.sharding, trained))
        self.params = loaded if frozen is None else nnx.merge_state(loaded, frozen)
        self._served_frozen = None

    def restore(self, checkpointer: Checkpointer) -> None:
        """Continue from the newest checkpoint (ValueError naming it if it does not fit this model)."""
        template = TrainState(self.params, self.opt_state, 0, 0, rng_state(self.demo_rng))
        state = checkpointer.restore(template, self.cfg.model.to_dict())
        self.params, self.opt_state = state.params, state.opt_state
        self.update, self.version = state.update, state.policy_version
        self._served_frozen = None
        set_rng_state(self.demo_rng, state.rng)
        self.demo_rng = _jumped(self.demo_rng, self.rank)


def loss_params(cfg: LearnerConfig) -> LossParams:
    """The numbers of the loss, from the flags with their defaults resolved (one --rho-clip clips rho_bar,
    c and the policy-gradient weight alike)."""
    loss = cfg.loss
    return LossParams(
        gamma=loss.gamma,
        lambda_=loss.lambda_,
        rho_clip=loss.rho_clip,
        c_clip=loss.rho_clip,
        pg_rho_clip=loss.rho_clip,
        entropy_coef=cfg.entropy(),
        value_coef=loss.value_coef,
        advantage_threshold=loss.advantage_threshold,
        binarize_advantage=cfg.binarize_advantage(),
        actor_weighting=loss.actor_weighting,
        vmpo_eta=loss.vmpo_eta,
        vmpo_kl_coef=loss.vmpo_kl_coef,
        off_policy_correction=loss.off_policy_correction,
    )


def _jumped(rng: np.random.Generator, times: int) -> np.random.Generator:
    """`rng`'s stream advanced by `times` x 2^127 draws (PCG64 jumps): disjoint streams per process."""
    return np.random.Generator(rng.bit_generator.jumped(times)) if times else rng
