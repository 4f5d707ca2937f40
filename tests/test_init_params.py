"""--init-params: a new run starts from a parameters file (the trained part only with LoRA, the frozen base
as built), and a file of another model or of other shapes is refused with its name."""

from __future__ import annotations

import dataclasses
import io

import jax
import numpy as np
import pytest
from rich.console import Console

from common import params_file
from common.backbones.decoder.lora import split_trained
from common.config import ModelConfig
from common.params_file import params_to_flat
from learner.config import LearnerConfig, MeshConfig
from learner.setup.resume import start_from_file
from learner.training.mesh import make_mesh
from learner.training.trainer import Trainer
from tests.lm_backbone import tiny_lm_folder


def _trainer(cfg: LearnerConfig) -> Trainer:
    return Trainer(cfg, make_mesh(MeshConfig()), 0)


def _lm_config(tmp_path, seed: int) -> LearnerConfig:
    model = ModelConfig(kind="lm", backbone=str(tiny_lm_folder(tmp_path / "tiny-lm")), lora_rank=4)
    return dataclasses.replace(LearnerConfig(), model=model, batch_size=2, seed=seed)


def test_a_run_starts_from_the_files_adapters_and_keeps_its_frozen_base(tmp_path):
    source = _trainer(_lm_config(tmp_path, seed=1))
    flat = {name: value + 0.25 for name, value in source.snapshot().items()}  # unlike any initialization
    path = tmp_path / "warmup-end.safetensors"
    params_file.write(path, flat, source.cfg.model, {"update": 7})
    cfg = dataclasses.replace(_lm_config(tmp_path, seed=2), init_params=path)
    trainer = _trainer(cfg)
    frozen_before = jax.tree.map(np.asarray, split_trained(trainer.params)[1])
    console = Console(file=io.StringIO(), width=200)
    start_from_file(cfg, trainer, console)
    got = trainer.snapshot()
    assert set(got) == set(flat) and all(np.array_equal(got[k], flat[k]) for k in flat)
    frozen_after = jax.tree.map(np.asarray, split_trained(trainer.params)[1])
    assert params_to_flat(frozen_after).keys() == params_to_flat(frozen_before).keys()
    assert all(
        np.array_equal(a, b)
        for a, b in zip(jax.tree.leaves(frozen_after), jax.tree.leaves(frozen_before), strict=True)
    )
    assert "update 7" in console.file.getvalue()


def test_files_that_do_not_fit_are_refused_by_name(tmp_path):
    cfg = dataclasses.replace(LearnerConfig(), model=ModelConfig(text_encoder="none"), batch_size=2)
    trainer = _trainer(cfg)
    flat = trainer.snapshot()
    other = tmp_path / "other-model.safetensors"
    params_file.write(other, flat, dataclasses.replace(cfg.model, d_model=cfg.model.d_model * 2))
    with pytest.raises(SystemExit, match="written for another model"):
        start_from_file(dataclasses.replace(cfg, init_params=other), trainer, Console(quiet=True))
    name = sorted(flat)[0]
    shapes = tmp_path / "other-shapes.safetensors"
    params_file.write(shapes, {**flat, name: np.zeros((3, 1), flat[name].dtype)}, cfg.model)
    with pytest.raises(SystemExit, match=f"parameter {name}"):
        start_from_file(dataclasses.replace(cfg, init_params=shapes), trainer, Console(quiet=True))
    with pytest.raises(SystemExit, match="not a readable parameters file"):
        start_from_file(dataclasses.replace(cfg, init_params=tmp_path / "none"), trainer, Console(quiet=True))
