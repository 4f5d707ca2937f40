"""The warm-up in epochs with held-back demonstrations (learner/warmup.py): every training demonstration once
per epoch and a resumed run drawing on where it was; the validation loss's patience rule; the held-back
ones never imitated; the early end recorded for a resume; the schedule's warm-up moving with it; and a
real learner whose validation loss cannot improve (learning rate 0) ending its warm-up after the epochs
its patience allows, with the loss in metrics.jsonl and equal to a per-episode reference."""

from __future__ import annotations

import io
import json
import time
from types import SimpleNamespace

import numpy as np
import pytest
from rich.console import Console

import learner.tools.evaluate as learner_eval
from common import params_file
from common.backbones.decoder.lora import split_trained
from common.params_file import params_to_flat
from learner import warmup
from learner.config import parse_args
from learner.schedule import Schedule
from learner.serving.snapshots import WARMUP_END
from learner.training.trainer import DemoFit
from learner.warmup import EpochDraws, Validation, Warmup
from tests.conftest import one_line


def test_each_training_demonstration_is_drawn_once_per_epoch_and_a_resume_draws_on():
    draws = EpochDraws(7, [3, 0])
    taken = [draws.take(3) for _ in range(7)]  # 21 indices: three epochs, batches spanning two
    flat = [i for batch in taken for i in batch]
    for epoch in range(3):
        assert sorted(flat[7 * epoch : 7 * epoch + 7]) == list(range(7))
    assert flat[:7] != flat[7:14]  # a new order each epoch
    assert draws.epochs == 3 and draws.drawn == 21
    resumed = EpochDraws(7, [3, 0], drawn=9)  # a run resumed after 3 updates of 3
    assert resumed.take(12) == flat[9:21]
    assert EpochDraws(7, [3, 1]).take(7) != flat[:7]  # another process: its own order


def test_the_warm_up_ends_after_patience_epochs_without_a_new_low():
    v = Validation(patience=2)
    assert [v.record(x) for x in (3.0, 2.0, 2.5, 2.1)] == [False, False, False, True]
    assert v.best == 2.0 and v.losses == [3.0, 2.0, 2.5, 2.1]
    assert not any(Validation(patience=0).record(x) for x in (1.0, 2.0, 3.0, 4.0))  # never early
    equal = Validation(patience=1)
    assert [equal.record(x) for x in (2.0, 2.0)] == [False, True]  # equal is no new low


def test_the_last_demonstrations_are_held_back_and_the_end_is_recorded(tmp_path):
    assert warmup.split_validation(list(range(10)), 3) == (list(range(7)), [7, 8, 9])
    assert warmup.split_validation([1, 2], 0) == ([1, 2], [])
    with pytest.raises(SystemExit, match="leaves nothing to imitate"):
        warmup.split_validation([1, 2], 2)
    assert warmup.ended_at(tmp_path) is None
    warmup.write_end(tmp_path, 12, [2.5, 2.4])
    assert warmup.ended_at(tmp_path) == 12
    (tmp_path / warmup.WARMUP_FILE).write_text("{not json")
    with pytest.raises(SystemExit, match="cannot read"):
        warmup.ended_at(tmp_path)


def test_the_schedule_s_warm_up_ends_where_it_was_ended():
    cfg = parse_args(["--warmup-updates", "20", "--demo-update-every", "4"])
    schedule = Schedule(cfg, 4, has_demos=True)
    assert schedule.in_warmup(15) and schedule.warmup_updates == 20
    schedule.warmup_end = 8  # as learner/warmup.py:Warmup sets it
    assert not schedule.in_warmup(8) and schedule.in_warmup(7) and schedule.phase(9) == "rl"
    # After it, every 4th update imitates, counted from the new end.
    assert [schedule.imitates(u) for u in range(8, 16)] == [False, False, False, True] * 2
    resumed = Schedule(cfg, 4, has_demos=True, warmup_end=8)
    assert resumed.warmup_updates == 8
    assert Schedule(cfg, 4, has_demos=True, warmup_end=30).warmup_updates == 20  # never longer


def test_validation_is_due_each_epoch_at_the_warm_up_s_end_and_every_epoch_of_updates_after_it():
    """6 training demonstrations in batches of 2 (an epoch: 3 updates), a warm-up of 7 updates: before it,
    after updates 3 and 6 (epochs), after 7 (its end: the supervised policy), then every 3 updates of
    reinforcement learning (imitation's included), each recorded with its phase's fields."""
    cfg = parse_args(["--warmup-updates", "7", "--demo-update-every", "4"])
    schedule = Schedule(cfg, 2, has_demos=True)
    fits = iter(range(100))
    trainer = SimpleNamespace(
        update=0, local_batch=2, demo_fit=lambda _: DemoFit(3.0 - next(fits) / 10, 0.5, 0.2)
    )
    stats = SimpleNamespace(validation={})
    console_text = io.StringIO()
    w = Warmup(
        trainer, schedule, stats, Console(file=console_text, width=300), None, 0, 0, 6, [], Validation(0)
    )
    seen = []
    for update in range(17):
        w.validate_if_due(serve=lambda: None, abandon=lambda: False)
        if stats.validation.get("validation/update") == update:
            seen.append((update, stats.validation["validation/epoch"]))
        if schedule.imitates(update):
            w.picks()
        trainer.update = update + 1
    assert seen == [(0, 0), (3, 1), (6, 2), (7, 2), (10, 2), (13, 2), (16, 3)]  # RL: imitation every 4th
    assert "the warm-up's end (2.33 epochs) (update 7)" in console_text.getvalue()
    assert stats.validation["validation/best"] == 3.0 - 3 / 10  # the warm-up's lowest, not RL's
    assert stats.validation["validation/nll"] == 3.0 - 6 / 10 and stats.validation["validation/rho"] == 0.5


def test_the_warm_up_ends_once_its_share_of_the_time_limit_has_passed(tmp_path):
    cfg = parse_args(["--time-limit", "100", "--warmup-share", "0.5", "--warmup-updates", "50"])
    schedule = Schedule(cfg, 2, has_demos=True, start=time.monotonic() - 49.0)
    trainer = SimpleNamespace(update=12, local_batch=2)
    out = io.StringIO()
    w = Warmup(trainer, schedule, None, Console(file=out, width=200), tmp_path, 0, 0, 6)
    w.end_if_late()
    assert schedule.warmup_end is None  # 49 s of 100: not yet
    schedule.start -= 2.0
    w.end_if_late()
    assert schedule.warmup_end == 12 and not schedule.in_warmup(12) and warmup.ended_at(tmp_path) == 12
    assert "50% of the 100 s time limit has passed (--warmup-share)" in out.getvalue()
    without_limit = Schedule(parse_args(["--warmup-share", "0.5"]), 2, has_demos=True, start=0.0)
    Warmup(trainer, without_limit, None, Console(file=out), tmp_path, 0, 0, 6).end_if_late()
    assert without_limit.warmup_end is None  # a share of no time limit: the warm-up's updates decide


def test_patience_needs_validation_demonstrations(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--warmup-patience", "2"])
    assert "--warmup-patience needs --validation-demos" in one_line(capsys.readouterr().err)


@pytest.mark.long
@pytest.mark.timeout(600)
def test_a_learner_validates_each_epoch_and_ends_its_warm_up_when_the_loss_stops_falling(learner_process):
    """40 SimPhone demonstrations, 6 held back (a batch of 8 then holds 2 repeats that must not count),
    batches of 8: the loss is measured before the first update and as epochs end, at updates 5 and 9 (40
    and 72 of 34 drawn). With learning rate 0 it never falls, so patience 2 ends the warm-up at update 9
    of its 100."""
    learner = learner_process(
        *("--env", "simphone", "--warmup-demos", "40", "--warmup-noise", "0", "--validation-demos", "6"),
        *("--warmup-updates", "100", "--warmup-patience", "2", "--batch-size", "8", "--learning-rate", "0"),
        *("--max-updates", "9", "--local-actors", "0", "--checkpoint-every", "9", "--log-every", "1"),
    )
    assert learner.proc.wait(timeout=540) == 0, learner.log()
    log = learner.log()
    assert "the last 6 demonstrations held back" in log and "(34 to imitate, an epoch is 5 updates)" in log
    epochs = [line for line in log.splitlines() if "learner: warm-up epoch" in line]
    assert len(epochs) == 3, log
    assert [
        f"epoch {e} (update {u})" in line for e, u, line in zip((0, 1, 2), (0, 5, 9), epochs, strict=True)
    ] == [True] * 3
    assert "the warm-up ends at update 9" in log
    final = learner.metrics()[-1]
    assert final["stopped"] == "update limit" and final["imitation_updates"] == 9, final
    loss = final["validation/nll"]
    assert final["validation/epoch"] == 2 and 0 < loss == final["validation/best"], final
    assert final["validation/update"] == 9
    assert warmup.ended_at(learner.run_dir) == 9
    nll, rho, gap = _per_episode_fit(learner.run_dir)
    assert abs(loss - nll) < 1e-4  # the loss is the held-back ones' mean NLL
    assert abs(final["validation/rho"] - rho) < 1e-4 and 0 < rho < 1
    assert abs(final["validation/value_gap"] - gap) < 1e-4 and gap != 0
    # The parameters the warm-up ended with, kept for `learner eval --params` (the checkpoint at update 9
    # here is the same update's; in a longer run only the newest few checkpoints are kept).
    path = learner.run_dir / "snapshots" / WARMUP_END
    config = json.loads((learner.run_dir / "config.json").read_text())
    version = final["policy_version"]
    assert params_file.fields(path) == {"update": 9, "version": version, "max_steps": config["max_steps"]}
    _, flat = params_file.read(path)
    saved = params_to_flat(split_trained(learner_eval.restore(learner.run_dir, 9).state.params)[0])
    assert flat.keys() == saved.keys() and all(np.array_equal(flat[k], saved[k]) for k in flat)


def _per_episode_fit(run_dir) -> tuple[float, float, float]:
    """The reference: each held-back demonstration (the file's last 6) scored alone, under the run's
    initial parameters (learning rate 0: what it validated with), means over their steps of -log pi,
    pi / mu and G_t - V(s_t) (returns summed in float64 here with the run's discount, no bootstrap: every
    demonstration here ends in a terminal state)."""
    import jax

    from common.trajectory_file import load_episodes
    from learner.batch import collate
    from learner.setup.open_session import open_session

    ports = ["--ingest-port", "0", "--params-port", "0", "--local-actors", "0", "--checkpoint-every", "0"]
    run = ["--env", "simphone", "--max-steps", "8", "--model.text-encoder", "none", "--batch-size", "8"]
    no_demos = ["--warmup-updates", "0", "--warmup-demos", "0"]
    cfg = parse_args(["--run-dir", str(run_dir / "ref"), *ports, *run, *no_demos])
    session = open_session(cfg, Console(file=io.StringIO()))
    try:
        trainer = session.trainer
        held = load_episodes(run_dir / "demos.msgpack", cfg.model)[-6:]
        nll, rho, gap, steps = 0.0, 0.0, 0.0, 0
        for ep in held:
            assert not ep.truncated
            n = ep.length
            batch = trainer.with_inputs(collate([ep], cfg.max_steps))
            ev = trainer.policy.evaluate(trainer.graphdef, trainer.params, batch.obs, batch.choice, None)
            logp = np.asarray(jax.device_get(ev.logp))[0, :n].astype(np.float64)
            values = np.asarray(jax.device_get(ev.values))[0, :n].astype(np.float64)
            mu = np.asarray(ep.steps["behavior_logp"], np.float64)
            rewards = np.asarray(ep.steps["reward"], np.float64)
            returns = [sum(cfg.loss.gamma**k * r for k, r in enumerate(rewards[t:])) for t in range(n)]
            nll -= logp.sum()
            rho += np.exp(logp - mu).sum()
            gap += (np.array(returns) - values).sum()
            steps += n
        return nll / steps, rho / steps, gap / steps
    finally:
        session.close("test")
