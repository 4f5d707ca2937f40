"""Learner checkpoints with orbax-checkpoint's CheckpointManager: parameters, optimizer state, update
count, policy version, RNG and the run's config, written atomically (orbax writes to a temporary
directory and renames it), the newest few kept.

A run dir that holds checkpoints resumes from the newest one. A checkpoint that cannot be read, or was
written for another model, is an error naming the directory and the reason; nothing is overwritten.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp


@dataclasses.dataclass
class TrainState:
    """Everything a learner needs to continue exactly where it stopped."""

    params: Any
    opt_state: Any
    update: int
    policy_version: int
    rng: np.ndarray
    """State of the learner's numpy Generator (bit_generator.state), as a uint8 array of its JSON."""


class Checkpointer:
    def __init__(self, directory: Path, max_to_keep: int = 3):
        self.directory = Path(directory).absolute()
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True),
        )

    def latest_update(self) -> int | None:
        return self.manager.latest_step()

    def config(self) -> dict[str, Any]:
        """The run config stored with the newest checkpoint."""
        step = self.manager.latest_step()
        return self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"][
            "config"
        ]

    def save(self, state: TrainState, config: dict[str, Any]) -> None:
        tree = {"params": state.params, "opt_state": state.opt_state, "rng": state.rng}
        meta = {"update": state.update, "policy_version": state.policy_version, "config": config}
        self.manager.save(
            state.update,
            args=ocp.args.Composite(state=ocp.args.StandardSave(tree), meta=ocp.args.JsonSave(meta)),
            force=True,
        )

    def restore(self, template: TrainState, model_config: dict[str, Any]) -> TrainState:
        """The newest checkpoint, shaped like `template`; refuses one written for another model."""
        step = self.manager.latest_step()
        if step is None:
            raise FileNotFoundError(f"{self.directory}: no checkpoint to resume from")
        abstract = jax.tree.map(
            ocp.utils.to_shape_dtype_struct,
            {"params": template.params, "opt_state": template.opt_state, "rng": template.rng},
        )
        try:
            meta = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
            saved_model = meta["config"].get("model")
            if saved_model != model_config:
                raise ValueError(f"it was written for model {saved_model}, this run uses {model_config}")
            tree = self.manager.restore(
                step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract))
            )["state"]
        except (ValueError, KeyError, FileNotFoundError, OSError) as e:
            raise ValueError(f"{self.directory / str(step)}: cannot resume from this checkpoint: {e}") from e
        return TrainState(
            tree["params"], tree["opt_state"], meta["update"], meta["policy_version"], np.asarray(tree["rng"])
        )

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


def rng_state(rng: np.random.Generator) -> np.ndarray:
    import json

    return np.frombuffer(json.dumps(rng.bit_generator.state).encode(), np.uint8).copy()


def set_rng_state(rng: np.random.Generator, blob: np.ndarray) -> None:
    import json

    rng.bit_generator.state = json.loads(bytes(np.asarray(blob, np.uint8)).decode())
