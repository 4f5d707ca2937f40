"""`python -m learner eval`: greedy evaluation of a checkpoint on SimPhone tasks, its episodes run by
`python -m actors eval` on the parameters the learner hands over."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import learner.tools.evaluate as learner_eval
from actors.policy_runner import PolicyRunner
from actors.tools import evaluate as actor_eval
from common import params_file
from common.config import ModelConfig
from common.params_file import params_to_flat
from common.policies.pointer import network as model
from common.types import ActionType
from learner.serving.snapshots import WARMUP_END, write_file
from learner.tools.evaluate import EvalConfig, evaluate
from learner.training.checkpoint import Checkpointer, TrainState, rng_state
from learner.training.train_step import make_optimizer
from tests.conftest import ROOT

CFG = ModelConfig(vocab_size=512, d_model=16, num_heads=2, num_layers=1, mlp_dim=32)
MAX_STEPS = 6


def _checkpoint(directory, seed=0, update=7, version=3):
    _, params = model.create(CFG, seed)
    opt_state = make_optimizer(1e-3, 1.0).init(params)
    ckpt = Checkpointer(directory)
    config = {"model": CFG.to_dict(), "learning_rate": 1e-3, "max_grad_norm": 1.0, "max_steps": MAX_STEPS}
    ckpt.save(TrainState(params, opt_state, update, version, rng_state(np.random.default_rng())), config)
    ckpt.close()
    return params


def _in_process(cfg: EvalConfig, params) -> list[dict]:
    """The reference: the evaluator's episode loop run here on `params` themselves."""
    run = actor_eval.EvalRunConfig(
        params=(cfg.checkpoint,), out=cfg.checkpoint, tasks=cfg.tasks, split=(cfg.split,),
        episodes=cfg.episodes, num_envs=cfg.num_envs, seed=cfg.seed, max_steps=MAX_STEPS,
    )  # fmt: skip
    runner = PolicyRunner(CFG, cfg.seed, greedy=True)
    runner.load(0, params_to_flat(params))
    return actor_eval.run_episodes(run, actor_eval.start(run, runner, cfg.split))


def test_eval_reports_every_episode_per_template(tmp_path, capsys):
    _checkpoint(tmp_path / "run" / "checkpoints")
    out = tmp_path / "eval.json"
    report = evaluate(
        EvalConfig(checkpoint=tmp_path / "run", tasks="webshop", episodes=24, num_envs=5, json=out)
    )
    # The evaluator's progress reaches the user as it runs (here only the final line: it takes seconds).
    assert re.search(
        r"^eval: 24/24 episodes, success [\d.]+, [\d.]+ s per episode$", capsys.readouterr().err, re.M
    )
    assert report["episodes"] == 24 == sum(report["episodes_per_template"].values())
    assert report["update"] == 7 and report["policy_version"] == 3 and report["split"] == "test"
    assert all(name.startswith("shop.") for name in report["per_template"])
    assert 0.0 <= report["success"] <= 1.0
    assert json.loads(out.read_text()) == report
    # Greedy evaluation is deterministic: the same seed gives the same outcomes.
    again = evaluate(EvalConfig(checkpoint=tmp_path / "run", tasks="webshop", episodes=24, num_envs=5))
    assert again["per_template"] == report["per_template"]


def test_the_evaluator_runs_the_checkpoints_own_parameters(tmp_path, monkeypatch):
    """The checkpoint holds seed-3 parameters; the learner restores onto a seed-0 template. The episodes
    the subprocess ran (template, success and length: the length follows the greedy actions) must be
    those of the seed-3 policy run here, which differ from the template's."""
    params = _checkpoint(tmp_path / "run" / "checkpoints", seed=3)
    cfg = EvalConfig(
        checkpoint=tmp_path / "run", tasks="general", split="train", episodes=20, num_envs=4, seed=2
    )
    ran = []
    real = learner_eval.run_episodes
    monkeypatch.setattr(learner_eval, "run_episodes", lambda *a: ran.append(real(*a)) or ran[-1])
    report = evaluate(cfg)
    expected = _in_process(cfg, params)
    assert ran == [expected]
    assert expected != _in_process(cfg, model.create(CFG, 0)[1])  # the comparison can tell parameters apart
    per_template: dict[str, list[bool]] = {}
    for ep in expected:
        per_template.setdefault(ep["template"], []).append(ep["success"])
    assert report["per_template"] == {k: float(np.mean(v)) for k, v in sorted(per_template.items())}
    assert report["episodes"] == 20 == len(expected)


def test_an_older_checkpoint_is_chosen_by_its_update(tmp_path):
    older = _checkpoint(tmp_path / "run" / "checkpoints", seed=1, update=7, version=3)
    newer = _checkpoint(tmp_path / "run" / "checkpoints", seed=2, update=9, version=4)

    def weights(restored) -> dict[str, np.ndarray]:
        return params_to_flat(restored.state.params)

    chosen, newest = learner_eval.restore(tmp_path / "run", 7), learner_eval.restore(tmp_path / "run")
    assert (chosen.state.update, chosen.state.policy_version, newest.state.update) == (7, 3, 9)
    for name, value in params_to_flat(older).items():
        np.testing.assert_array_equal(weights(chosen)[name], value)
    assert any(not np.array_equal(weights(newest)[k], v) for k, v in params_to_flat(older).items())
    assert all(np.array_equal(weights(newest)[k], v) for k, v in params_to_flat(newer).items())
    with pytest.raises(SystemExit, match=r"no checkpoint at update 8 \(saved: 7, 9\)"):
        learner_eval.restore(tmp_path / "run", 8)


def test_a_parameters_file_is_evaluated_like_the_checkpoint_it_came_from(tmp_path, monkeypatch):
    """--params: a file of a checkpoint's parameters (as the warm-up's end writes them, its run's update,
    version and step limit in its metadata) runs the same episodes as that checkpoint, which other
    parameters would not; a missing file and --params with --checkpoint are refused clearly."""
    params = _checkpoint(tmp_path / "run" / "checkpoints", seed=3, update=7, version=3)
    path = tmp_path / "run" / "snapshots" / WARMUP_END
    write_file(path, params_to_flat(params), CFG, {"update": 7, "version": 3, "max_steps": MAX_STEPS})
    common = dict(tasks="general", split="train", episodes=20, num_envs=4, seed=2)
    ran = []
    real = learner_eval.run_episodes
    monkeypatch.setattr(learner_eval, "run_episodes", lambda *a: ran.append(real(*a)) or ran[-1])
    evaluate(EvalConfig(checkpoint=tmp_path / "run", **common))
    from_file = evaluate(EvalConfig(params=path, **common))
    assert (from_file["update"], from_file["policy_version"], from_file["checkpoint"]) == (7, 3, str(path))
    assert ran[0] == ran[1] != _in_process(EvalConfig(checkpoint=path, **common), model.create(CFG, 0)[1])
    with pytest.raises(SystemExit, match="not a readable parameters file"):
        evaluate(EvalConfig(params=tmp_path / "missing.safetensors"))
    with pytest.raises(SystemExit, match="give it without --checkpoint or --init"):
        evaluate(EvalConfig(params=path, checkpoint=tmp_path / "run"))


def test_eval_without_a_checkpoint_says_so(tmp_path):
    cmd = [sys.executable, "-m", "learner", "eval", "--checkpoint", str(tmp_path / "nothing")]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "no such checkpoint directory" in result.stderr


def test_a_bad_task_set_reaches_the_user_as_one_line(tmp_path):
    _checkpoint(tmp_path / "run" / "checkpoints")
    cmd = [sys.executable, "-m", "learner", "eval", "--checkpoint", str(tmp_path / "run"), "--tasks", "nope"]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("eval: nope: no such task file, folder or suite")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            {"split": "bogus"},
            "split must be one of ('train', 'test', 'dev', 'validation', 'heldout'), got 'bogus'",
        ),
        ({"episodes": 0}, "--episodes must be at least 1, got 0"),
    ],
)
def test_bad_flags_stop_the_evaluator_with_its_message(tmp_path, flags, message):
    _checkpoint(tmp_path / "run" / "checkpoints")
    with pytest.raises(SystemExit) as stop:
        evaluate(EvalConfig(checkpoint=tmp_path / "run", **flags))
    assert str(stop.value) == f"eval: {message}"


def test_a_parameters_file_round_trips_and_refuses_other_files(tmp_path):
    flat = params_to_flat(model.create(CFG, 1)[1])
    params_file.write(tmp_path / "p.safetensors", flat, CFG)
    cfg, back = params_file.read(tmp_path / "p.safetensors")
    assert cfg == CFG and set(back) == set(flat)
    assert all(np.array_equal(back[k], v) and back[k].dtype == v.dtype for k, v in flat.items())
    (tmp_path / "junk").write_bytes(b"not safetensors")
    with pytest.raises(ValueError, match="not a readable parameters file"):
        params_file.read(tmp_path / "junk")


def _params_files(tmp_path, *seeds: int, cfg: ModelConfig = CFG, quitter: bool = False) -> list:
    """Freshly initialised parameters per seed; a `quitter` declares every task done at once."""
    paths = []
    for seed in seeds:
        paths.append(tmp_path / f"p{seed}.safetensors")
        flat = params_to_flat(model.create(cfg, seed)[1])
        if quitter:
            flat["type_head/bias"][ActionType.STATUS_COMPLETE] = 100.0
        params_file.write(paths[-1], flat, cfg)
    return paths


def _run(tmp_path, name: str, params, splits, versions=(0,)) -> dict:
    out = tmp_path / f"{name}.json"
    actor_eval.run_eval(
        actor_eval.EvalRunConfig(
            params=tuple(params), out=out, split=tuple(splits), episodes=8, num_envs=3, seed=5,
            max_steps=MAX_STEPS, policy_version=tuple(versions),
        )
    )  # fmt: skip
    return json.loads(out.read_text())


def test_several_files_and_splits_in_one_call_match_one_call_each(tmp_path):
    """One process, the policy built once: each (file, split) entry has the episodes that a one-file,
    one-split call gives (same seeds), and the parameters are really swapped between files."""
    (a,), (b,) = _params_files(tmp_path, 1), _params_files(tmp_path, 2, quitter=True)
    both = _run(tmp_path, "both", [a, b], ["train", "test"], versions=(4, 9))["results"]
    assert [(r["params"], r["split"], r["policy_version"]) for r in both] == [
        (str(a), "train", 4), (str(a), "test", 4), (str(b), "train", 9), (str(b), "test", 9),
    ]  # fmt: skip
    for entry in both:
        alone = _run(tmp_path, "alone", [entry["params"]], [entry["split"]], [entry["policy_version"]])
        assert alone == {"policy_version": entry["policy_version"], "episodes": entry["outcomes"]}
        assert entry["episodes"] == 8 == sum(entry["episodes_per_template"].values())
        successes = [ep["success"] for ep in entry["outcomes"]]
        assert entry["success"] == sum(successes) / 8
    # The parameters really were swapped: the second file's policy ends every episode at its first step.
    assert {ep["steps"] for ep in both[2]["outcomes"]} == {1} != {ep["steps"] for ep in both[0]["outcomes"]}


def test_files_of_different_models_are_refused_before_anything_runs(tmp_path):
    (a,) = _params_files(tmp_path, 1)
    (other,) = _params_files(tmp_path / "..", 3, cfg=ModelConfig(vocab_size=512, d_model=32))
    with pytest.raises(SystemExit, match="its model config differs from"):
        _run(tmp_path, "mixed", [a, other], ["test"])
    with pytest.raises(SystemExit, match="--policy-version takes one version or one per --params file"):
        _run(tmp_path, "versions", [a, a], ["test"], versions=(1, 2, 3))
    assert not list(tmp_path.glob("*.json"))


def test_the_command_line_takes_several_files_and_splits():
    import tyro

    args = ["--params", "a", "b", "--out", "o", "--split", "train", "test", "--policy-version", "3", "4"]
    cfg = tyro.cli(actor_eval.EvalRunConfig, args=args)
    assert cfg.params == (Path("a"), Path("b")) and cfg.split == ("train", "test")
    assert cfg.policy_version == (3, 4)
    one = tyro.cli(actor_eval.EvalRunConfig, args=["--params", "a", "--out", "o", "--split", "train"])
    assert one.params == (Path("a"),) and one.split == ("train",)


def test_progress_lines_come_every_interval_and_at_the_end(monkeypatch, capsys):
    monkeypatch.setattr(actor_eval, "PROGRESS_S", 3600.0)
    progress = actor_eval.Progress(4, "p.safetensors test: ")
    progress.update([{"success": True}])  # within the interval: quiet
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(actor_eval, "PROGRESS_S", 0.0)
    progress.update([{"success": True}, {"success": False}])
    progress.update([{"success": True}] * 4, final=True)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(", ")[:2] for line in lines] == [
        ["eval: p.safetensors test: 2/4 episodes", "success 0.50"],
        ["eval: p.safetensors test: 4/4 episodes", "success 1.00"],
    ]
