"""Learner checkpoints with orbax-checkpoint's CheckpointManager: parameters, optimizer state, update
count, policy version, RNG and the run's config, written atomically (orbax writes to a temporary
directory and renames it), the newest few kept.

The replay buffer is saved beside them as `<dir>/replay/<update>.p<process>.replay` (learner/replay/file.py),
one file per learner process, and pruned with the checkpoints it belongs to. With a write-ahead log the
file references the episodes the log holds instead of copying them (an incremental save: the log keeps
those records until a newer checkpoint no longer needs them, learner/session.py).

A run dir that holds checkpoints resumes from the newest complete one: the newest whose delivery ledger
(written last) is on disk, so a learner killed in the middle of a save resumes from the one before. A
checkpoint that cannot be read, or was written for another model, is an error naming the directory and
the reason; nothing is overwritten.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from common.config import ModelConfig
from common.policies import make_policy
from common.protocol import Episode
from learner.replay.file import Logged, ReplaySnapshot, load_replay, snapshot, write_snapshot
from learner.replay.prioritized import PrioritizedReplay


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
    """One run's checkpoint directory: orbax checkpoints of the TrainState (with the run's config and the
    featurizer's layout as JSON metadata) numbered by update, the newest `max_to_keep` kept (and the
    newest complete one, `KeepComplete`), and each
    process's replay file and delivery ledger beside the checkpoint they belong to (pruned with it).
    Save order per update: `save`, `save_replay`, `save_delivery`; restore reads them back in that order."""

    def __init__(self, directory: Path, max_to_keep: int = 3, processes: int = 1):
        """`processes`: the learner processes that save here; a checkpoint is complete once all of them
        have written their ledger (a multi-process learner killed between two processes' files resumes
        from the one before on every process, never from two different ones)."""
        self.directory = Path(directory).absolute()
        self.processes = processes
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                preservation_policy=KeepComplete(self, max_to_keep), create=True
            ),
        )

    def latest_update(self) -> int | None:
        """The checkpoint to resume from: the newest whose delivery ledgers (the last file a save writes)
        exist for every process; the newest of all when none has one (a run dir from before ledgers)."""
        steps = sorted(self.manager.all_steps())
        done = [s for s in steps if complete(self, s)]
        return (done or steps or [None])[-1]

    def updates(self) -> list[int]:
        """Every saved checkpoint's update, oldest first."""
        return sorted(self.manager.all_steps())

    def config(self, update: int | None = None) -> dict[str, Any]:
        """The run config stored with checkpoint `update` (default: the one to resume from)."""
        step = self.latest_update() if update is None else update
        return self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"][
            "config"
        ]

    def save(self, state: TrainState, config: dict[str, Any]) -> None:
        tree = {"params": state.params, "opt_state": state.opt_state, "rng": state.rng}
        meta = {
            "update": state.update,
            "policy_version": state.policy_version,
            "config": config,
            "features": _features(config["model"]),
        }
        if state.update in self.manager.all_steps():
            # Left by a learner killed before it wrote this checkpoint's ledger (so never resumed from):
            # this run resumed from an older one and reached the same update again. Replace it.
            self.manager.delete(state.update)
        self.manager.save(
            state.update,
            args=ocp.args.Composite(state=ocp.args.StandardSave(tree), meta=ocp.args.JsonSave(meta)),
            force=True,
        )

    def restore(
        self, template: TrainState, model_config: dict[str, Any], update: int | None = None
    ) -> TrainState:
        """Checkpoint `update` (default: the one to resume from, `latest_update`), shaped like `template`;
        refuses one written for another model."""
        step = self.latest_update() if update is None else update
        if step is None:
            raise FileNotFoundError(f"{self.directory}: no checkpoint to resume from")
        abstract = jax.tree.map(
            ocp.utils.to_shape_dtype_struct,
            {"params": template.params, "opt_state": template.opt_state, "rng": template.rng},
        )
        try:
            meta = self.manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
            saved_model = _with_defaults(meta["config"].get("model"))
            if saved_model != model_config:
                changed = sorted(k for k in model_config if saved_model.get(k) != model_config[k])
                raise ValueError(
                    f"it was written for another model ({', '.join(changed)}: "
                    f"{[saved_model.get(k) for k in changed]}, this run uses {[model_config[k] for k in changed]}; "
                    "pass the run's --model.* flags)"
                )
            # The featurizer's layout is code, not config: a change to common/policies/pointer/featurize.py changes it.
            saved_features, features = meta.get("features"), _features(model_config)
            if saved_features is not None and saved_features != features:
                changed = sorted(k for k in features if saved_features.get(k) != features[k])
                raise ValueError(
                    f"it was written for other observation features ({', '.join(changed)}: "
                    f"{[saved_features.get(k) for k in changed]}, this code makes {[features[k] for k in changed]})"
                )
            tree = self.manager.restore(
                step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract))
            )["state"]
        except (ValueError, KeyError, FileNotFoundError, OSError) as e:
            raise ValueError(f"{self.directory / str(step)}: cannot resume from this checkpoint: {e}") from e
        return TrainState(
            tree["params"], tree["opt_state"], meta["update"], meta["policy_version"], np.asarray(tree["rng"])
        )

    def replay_path(self, update: int, process_index: int = 0) -> Path:
        return self.directory / "replay" / f"{update}.p{process_index}.replay"

    def save_replay(
        self,
        update: int,
        replay: PrioritizedReplay[Episode],
        model_cfg: ModelConfig,
        max_steps: int,
        process_index: int = 0,
        by_reference: bool = False,
    ) -> Path:
        """Save the buffer for the checkpoint of `update` (call after `save`) on this thread: `snapshot`
        and `write_replay`. `by_reference`: the items a write-ahead log holds are referenced."""
        snap = snapshot(replay, max_steps, by_reference)
        self.write_replay(update, snap, model_cfg, max_steps, process_index, self.kept_updates(update))
        return self.replay_path(update, process_index)

    def kept_updates(self, update: int) -> set[int]:
        """The updates whose replay files a save of `update` keeps: every checkpoint's, and `update` itself
        (an asynchronous orbax save may not be listed yet). Asked on the thread that saves with orbax."""
        return {*self.manager.all_steps(), update}

    def write_replay(
        self,
        update: int,
        snap: ReplaySnapshot,
        model_cfg: ModelConfig,
        max_steps: int,
        process_index: int,
        keep: set[int],
    ) -> int:
        """Write a buffer's snapshot for checkpoint `update`, then delete this process's replay files of
        updates not in `keep`; the file's bytes. Touches only those files: safe on a helper thread."""
        path = self.replay_path(update, process_index)
        path.parent.mkdir(parents=True, exist_ok=True)
        size = write_snapshot(path, snap, model_cfg, max_steps)
        self._prune_replays(process_index, keep)
        return size

    def restore_replay(
        self,
        update: int,
        replay: PrioritizedReplay[Episode],
        model_cfg: ModelConfig,
        process_index: int = 0,
        *,
        max_steps: int | None = None,
        logged: Logged | None = None,
    ) -> int | None:
        """Fill `replay` from the file saved with checkpoint `update`; returns its number of episodes, or
        None when there is none (the run then starts with an empty replay). `logged` reads back the
        episodes the file references in the write-ahead log. A damaged file (or a referenced record the
        log lacks) raises a ValueError naming it and leaves `replay` untouched."""
        path = self.replay_path(update, process_index)
        if not path.is_file():
            return None
        return load_replay(path, replay, model_cfg, max_steps=max_steps, logged=logged)

    def delivery_path(self, update: int, process_index: int = 0) -> Path:
        return self.directory / "replay" / f"{update}.p{process_index}.delivery.json"

    def save_delivery(self, update: int, state: dict[str, Any], process_index: int = 0) -> None:
        """The ingest's delivery ledger (learner/ingest/delivery.py) for checkpoint `update`: which batches the
        saved replay holds, so a batch re-sent after a restart is stored exactly once. Call after
        `save_replay`, so that a ledger never exists without its replay."""
        path = self.delivery_path(update, process_index)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(path)

    def restore_delivery(self, update: int, process_index: int = 0) -> dict[str, Any] | None:
        """The ledger saved with checkpoint `update`, or None when there is none; ValueError if damaged."""
        path = self.delivery_path(update, process_index)
        if not path.is_file():
            return None
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"{path}: cannot read the delivery ledger: {e}") from e

    def _prune_replays(self, process_index: int, keep: set[int]) -> None:
        """Delete this process's replay and ledger files (and temporaries) whose update is not in `keep`."""
        pattern = re.compile(rf"(\d+)\.p{process_index}\.(replay|delivery\.json)(\.tmp)?")
        for path in (self.directory / "replay").iterdir():
            match = pattern.fullmatch(path.name)
            if match and int(match[1]) not in keep:
                path.unlink(missing_ok=True)

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


@dataclasses.dataclass
class KeepComplete:
    """orbax's preservation policy for a Checkpointer: the newest `newest` checkpoints, and always the
    newest one complete on every process (`complete`). Why: on a multi-process learner whose saves fail
    on one process (a full disk), the newest `newest` checkpoints can all be incomplete; deleting the
    last complete one with its ledgers would leave nothing to resume from but an empty replay, and the
    write-ahead log is pruned only below what that checkpoint needs (learner/training/checkpoint_files.py)."""

    checkpointer: Checkpointer
    newest: int

    def should_preserve(self, checkpoints: list[Any], *, context: Any) -> list[bool]:
        steps = [info.step for info in checkpoints]
        kept = set(sorted(steps)[-self.newest :]) if self.newest else set()
        kept |= {max((s for s in steps if complete(self.checkpointer, s)), default=None)}
        return [s in kept for s in steps]


def complete(checkpointer: Checkpointer, update: int) -> bool:
    """Whether checkpoint `update`'s delivery ledger (the last file a save writes) is on disk for every
    learner process: only such a checkpoint is ever resumed from (on one process, it is this process's
    own files that decide)."""
    return all(checkpointer.delivery_path(update, p).is_file() for p in range(checkpointer.processes))


def _features(model_config: dict[str, Any]) -> dict[str, list]:
    """The featurized arrays' shapes and dtypes for this model config, as JSON values."""
    spec = make_policy(ModelConfig.from_dict(model_config)).episode_spec().observations
    return {name: [list(shape), dtype] for name, (shape, dtype) in spec.items()}


def rng_state(rng: np.random.Generator) -> np.ndarray:
    return np.frombuffer(json.dumps(rng.bit_generator.state).encode(), np.uint8).copy()


def set_rng_state(rng: np.random.Generator, blob: np.ndarray) -> None:
    rng.bit_generator.state = json.loads(bytes(np.asarray(blob, np.uint8)).decode())


def _with_defaults(saved: Any) -> Any:
    """A stored model config with the fields added since it was written at their defaults (a checkpoint
    from before --model.train-text-encoder still resumes); anything unreadable is returned as it is."""
    try:
        return ModelConfig.from_dict(saved).to_dict()
    except (TypeError, ValueError):
        return saved
