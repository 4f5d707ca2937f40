"""Batched, jitted policy inference on the CPU with the newest parameter snapshot, for any policy family
(common/policies): the family featurizes, acts and turns choices into actions; this keeps the snapshot,
the compiled call and the seeded sampling stream."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import numpy as np
from flax import nnx

from common.backbones.decoder.lora import split_trained
from common.config import ModelConfig
from common.params_file import flat_to_params
from common.policies import make_policy, resolved_config
from common.policies.family import StagedAct
from common.types import Action, Observation


class ChosenRows(NamedTuple):
    """One batched policy call brought to the host: per row, the choice (Python ints) and what the
    learner's replay can use of it; made from the family's `Acted` (its device arrays) by `act`."""

    choices: list[dict[str, int]]
    """Each row's choice arrays by name (the family's `episode_spec().choices`), as Python ints."""
    logp: np.ndarray
    """[N] float32: log mu of each choice (the behaviour log-probability the learner corrects with)."""
    value: np.ndarray
    """[N] float32: the critic's V(s) on the same forward pass."""
    entropy: np.ndarray
    """[N] float32: the exact entropy of the policy at s."""


class PolicyRunner:
    def __init__(self, cfg: ModelConfig, seed: int, greedy: bool = False):
        # The family's files are checked now (the pointer policy's text encoder, its folder and checksum:
        # CheckpointError when they are not this learner's).
        cfg = resolved_config(cfg)
        self.cfg = cfg
        self.policy = make_policy(cfg)
        # Shapes only: the parameters always come from a snapshot (load), and building real ones first
        # would block the actor for up to a minute on a busy CPU, before it can heartbeat.
        self.graphdef, self._template = self.policy.abstract()
        self.params = None
        self.version = -1
        self._seed = seed
        self._frozen = None
        """A LoRA-tuned family's frozen base, built on the first snapshot (later ones carry no base)."""
        self._key = jax.random.key(seed)
        policy, graphdef = self.policy, self.graphdef
        self._act = jax.jit(lambda params, inputs, key: policy.act(graphdef, params, inputs, key, greedy))
        self._stages = None
        """A two-stage family's (prefill, decode), jitted apart so each is timed (StagedAct)."""
        if isinstance(policy, StagedAct):
            self._stages = (
                jax.jit(lambda params, inputs: policy.prefill(graphdef, params, inputs)),
                jax.jit(
                    lambda params, inputs, pre, key: policy.decode(graphdef, params, inputs, pre, key, greedy)
                ),
            )
        self.stage_seconds: dict[str, float] = {}
        """The last `act`'s seconds per stage ({"prefill": s, "decode": s}), empty for a one-stage family."""

    def load(self, version: int, flat: dict[str, np.ndarray]) -> None:
        """Swap to a snapshot; raises ValueError if it does not fit the model. A family with LoRA
        adapters publishes only what trains (adapters and heads, lora.split_trained): they are merged
        into this actor's own copy of the frozen base, read from the checkpoint once."""
        trained, frozen = split_trained(self._template)
        if frozen is None:
            self.params = flat_to_params(self._template, flat)
        else:
            if self._frozen is None:
                self._frozen = split_trained(self.policy.create(self._seed)[1])[1]
            self.params = nnx.merge_state(flat_to_params(trained, flat), self._frozen)
        self.version = version
        self.policy.loaded(self.params)

    def featurize(self, obs: Observation, history: Sequence[Action] = ()) -> dict[str, np.ndarray]:
        """One observation as the family's arrays (`history`: the episode's actions so far)."""
        return self.policy.featurize(obs, history)

    def example_features(self, rows: int) -> dict[str, np.ndarray]:
        """All-zero features of `rows` observations, each boolean mask with its first slot on (as real
        screens have): what `compile` needs."""
        spec = self.policy.episode_spec().observations
        out = {k: np.zeros((rows, *shape), dtype) for k, (shape, dtype) in spec.items()}
        for v in out.values():
            if v.dtype == bool and v.ndim > 1:
                v[..., 0] = True
        return out

    def compile(self, features: dict[str, np.ndarray]) -> None:
        """Compile the sampling step for this batch shape now, with a throwaway key: the actor's own key
        stream (its seeded sampling) is untouched."""
        jax.block_until_ready(self._call(self.policy.inputs(features), jax.random.key(0)))

    def act(self, features: dict[str, np.ndarray]) -> ChosenRows:
        """Sample one action per row of the batched features (the mode when greedy)."""
        self._key, key = jax.random.split(self._key)
        choice, logp, value, entropy = jax.device_get(self._call(self.policy.inputs(features), key))
        columns = {k: np.asarray(v).tolist() for k, v in choice.items()}
        choices = [dict(zip(columns, row, strict=True)) for row in zip(*columns.values(), strict=True)]
        f32 = np.float32
        return ChosenRows(choices, np.asarray(logp, f32), np.asarray(value, f32), np.asarray(entropy, f32))

    def _call(self, inputs: dict[str, np.ndarray], key: jax.Array):
        """The family's act: one jitted call, or its two stages, each timed (`stage_seconds`)."""
        if self._stages is None:
            return self._act(self.params, inputs, key)
        prefill, decode = self._stages
        t0 = time.perf_counter()
        prefilled = jax.block_until_ready(prefill(self.params, inputs))
        t1 = time.perf_counter()
        acted = jax.block_until_ready(decode(self.params, inputs, prefilled, key))
        self.stage_seconds = {"prefill": t1 - t0, "decode": time.perf_counter() - t1}
        return acted

    def to_action(self, obs: Observation, choice: dict[str, Any]) -> Action:
        """The concrete action of one row's choice on the observation it was chosen on."""
        return self.policy.to_action(obs, choice)


def stack(features: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Per-observation features stacked along a new leading axis (one batched call)."""
    return {k: np.stack([f[k] for f in features]) for k in features[0]}
