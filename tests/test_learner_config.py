"""LearnerConfig: defaults that depend on the run, every value checked where it is defined (naming its
flag), and flags and stored layout unchanged by the grouping of its settings."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import tyro

from learner.config import (
    GROUPS,
    ImitationConfig,
    LearnerConfig,
    LocalActorsConfig,
    LossSettings,
    ReplayConfig,
    flat_dict,
    parse_args,
)
from learner.losses import DEFAULTS
from tests.conftest import one_line


def test_demonstrations_are_used_when_a_warm_up_or_prefill_can_get_them():
    assert LearnerConfig().uses_demonstrations()  # SimPhone writes oracle demonstrations at start-up
    assert not LearnerConfig(
        local=LocalActorsConfig(env="standin")
    ).uses_demonstrations()  # no oracle demonstrations there
    assert LearnerConfig(
        local=LocalActorsConfig(env="standin"), imitation=ImitationConfig(demos=Path("d.msgpack"))
    ).uses_demonstrations()
    assert not LearnerConfig(imitation=ImitationConfig(warmup_demos=0)).uses_demonstrations()
    assert not LearnerConfig(
        imitation=ImitationConfig(warmup_updates=0, prefill_demos=False, demo_update_every=0)
    ).uses_demonstrations()
    assert LearnerConfig(imitation=ImitationConfig(warmup_updates=0)).uses_demonstrations()  # prefill alone
    assert LearnerConfig(
        imitation=ImitationConfig(warmup_updates=0, prefill_demos=False, demo_update_every=4)
    ).uses_demonstrations()


def test_entropy_default_explores_from_scratch_and_keeps_imitation():
    assert LearnerConfig(local=LocalActorsConfig(env="standin")).entropy() == 0.01
    assert LearnerConfig().entropy() == 0.001
    assert (
        LearnerConfig(loss=LossSettings(entropy_coef=0.0)).entropy() == 0.0
    )  # an explicit value always wins
    assert (
        LearnerConfig(local=LocalActorsConfig(env="standin"), loss=LossSettings(entropy_coef=0.2)).entropy()
        == 0.2
    )


def test_fine_tuning_defaults_after_demonstrations():
    assert LearnerConfig().binarize_advantage() is True
    assert LearnerConfig(local=LocalActorsConfig(env="standin")).binarize_advantage() is False
    assert LearnerConfig(loss=LossSettings(binarize_advantage=False)).binarize_advantage() is False


# ---- every config checks itself, naming the flag ---------------------------------------------------
@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--word-rename-rate", "1.5"], "--word-rename-rate must be in [0, 1], got 1.5"),
        (["--typed-word-rename-rate", "-0.1"], "--typed-word-rename-rate must be in [0, 1], got -0.1"),
        (["--stop-at-success", "2"], "--stop-at-success must be in [0, 1], got 2.0"),
        (["--actor-credit", "0"], "--actor-credit must be at least 1, got 0"),
        (["--insert-slack", "-1"], "--insert-slack must be >= 0, got -1"),
        (["--sync-round-timeout", "0"], "--sync-round-timeout must be positive, got 0.0"),
        (["--demo-update-every", "-1"], "--demo-update-every must be >= 0, got -1"),
        (["--instruction-filter", "0.8", "0.2"], "--instruction-filter needs 0 <= LOW <= HIGH <= 1"),
        (
            ["--mode", "sync", "--num-processes", "2", "--coordinator", "h:1"],
            "--mode sync runs on one learner",
        ),
        (["--num-processes", "2"], "--num-processes > 1 needs --coordinator"),
        (["--process-id", "1"], "--process-id must be in [0, 1), got 1"),
        (["--curve-secret-key", "k.key_secret"], "--curve-secret-key and --curve-authorized go together"),
        (["--bind", "0.0.0.0"], "--bind 0.0.0.0 exposes the learner beyond this machine"),
        (["--alpha", "-1"], "--alpha must be >= 0, got -1.0"),
        (["--beta-start", "1.5"], "--beta-start must be in [0, 1], got 1.5"),
        (["--samples-per-insert", "0"], "--samples-per-insert must be positive, got 0.0"),
        (["--replay-capacity", "0"], "--replay-capacity must be at least 1, got 0"),
        (["--priority-weights", "0", "0", "0"], "--priority-weights must be >= 0 and not all 0"),
        (["--gamma", "1.5"], "--gamma must be in [0, 1], got 1.5"),
        (["--lambda", "-1"], "--lambda must be in [0, 1], got -1.0"),
        (["--weight-decay", "-1"], "--weight-decay must be >= 0, got -1.0"),
        (
            ["--model.kind", "lstm"],
            "--model.kind must be one of ['lm', 'pointer'] or module:Class, got 'lstm'",
        ),
        (["--model.kind", "nosuch.module:Policy"], "--model.kind nosuch.module:Policy: cannot import it"),
        (["--rho-clip", "0"], "--rho-clip must be positive, got 0.0"),
        (["--learning-rate", "-1"], "--learning-rate must be >= 0, got -1.0"),
        (["--max-grad-norm", "0"], "--max-grad-norm must be positive, got 0.0"),
        (["--lr-final-fraction", "2"], "--lr-final-fraction must be in [0, 1], got 2.0"),
        (["--log-every", "0"], "--log-every must be positive, got 0.0"),
        (["--batch-size", "0"], "--batch-size must be at least 1, got 0"),
        (["--publish-every", "0"], "--publish-every must be at least 1, got 0"),
        (["--envs-per-actor", "0"], "--envs-per-actor must be at least 1, got 0"),
        (["--ingest-port", "70000"], "--ingest-port must be in [0, 65535]"),
        (["--mesh.model", "0"], "--mesh.model must be >= 1, got 0"),
        (["--emulator.hang-prob", "2"], "--emulator.hang-prob must be a probability in [0, 1], got 2.0"),
        (["--audit-log", "--durability", "none"], "--audit-log records the write-ahead log's batches"),
    ],
)
def test_bad_flags_are_refused_naming_the_flag(args, says, capsys):
    with pytest.raises(SystemExit) as e:
        tyro.cli(LearnerConfig, args=args)
    assert e.value.code == 2
    assert says in one_line(capsys.readouterr().err)


def test_configs_built_in_code_check_themselves_too():
    with pytest.raises(ValueError, match="--alpha must be >= 0"):
        ReplayConfig(alpha=-0.5)
    with pytest.raises(ValueError, match="--actor-credit must be at least 1"):
        dataclasses.replace(LearnerConfig().transport, actor_credit=0)
    with pytest.raises(ValueError, match="--max-updates must be >= 0"):
        LearnerConfig(max_updates=-1)


def test_grouped_settings_keep_their_flags_and_their_stored_layout():
    """Grouping LearnerConfig changed neither a flag nor config.json / the checkpoints' stored config:
    every setting is still `--field-name` and a top-level key (model, mesh, emulator stay nested)."""
    flat = flat_dict(LearnerConfig())
    nested = {"model", "mesh", "emulator"}
    assert nested <= set(flat) and not set(GROUPS) & set(flat)
    # The 65 settings from before the grouping, --off-policy-correction, --rl-lr-scale, --text-encoder-lr-scale,
    # --rename-word-pieces, --durability, --weight-decay, --snapshot-every, --actor-weighting, --vmpo-eta,
    # --vmpo-kl-coef, --local-actor-args, --inference-port, --inference-max-rows, --inference-deadline-ms,
    # --checkpoint-every-s, --metrics-port, --live-stall-s, --keep-log, --trunk-cache-mb, --validation-demos,
    # --warmup-patience, --init-params, --audit-log, --wal-segment-mb.
    assert len(flat) == 91
    flags = [
        "--lambda" if name == "lambda_" else "--" + name.replace("_", "-") for name in set(flat) - nested
    ]
    values = {"--bind": "localhost", "--lambda": "0.5", "--demos": "d.msgpack", "--coordinator": "h:1"}
    values["--binarize-advantage"] = "False"
    values["--durability"] = "none"  # stored resolved: "fsync" would need checkpoints on
    values["--entropy-coef"] = "0.01"
    for flag in flags:
        field = "lambda_" if flag == "--lambda" else flag.lstrip("-").replace("-", "_")
        default = flat[field]
        if flag in values:
            args = [flag, values[flag]]
        elif isinstance(default, bool):
            args = [flag] if not default else ["--no-" + flag[2:]]
        elif field == "priority_weights":
            args = [flag, "1", "1", "1"]
        elif field in ("instruction_filter",):
            args = [flag, "0.1", "0.9"]
        elif field in ("curve_secret_key", "curve_authorized"):
            args = ["--curve-secret-key", "k", "--curve-authorized", "a"]
        else:
            args = [flag, str(default) if default is not None else "1"]
        cfg = tyro.cli(LearnerConfig, args=args)
        assert field in flat_dict(cfg), flag
    saved = flat_dict(
        tyro.cli(LearnerConfig, args=["--alpha", "0.3", "--learning-rate", "0.01", "--bind", "localhost"])
    )
    assert saved["alpha"] == 0.3 and saved["learning_rate"] == 0.01 and saved["bind"] == "localhost"
    assert json.loads(json.dumps(saved)) == saved  # plain JSON (paths as strings)


def test_config_json_records_the_values_the_run_resolved():
    """Settings whose default depends on others are stored as the run used them, never as null."""
    stored = flat_dict(LearnerConfig())
    assert stored["entropy_coef"] == 0.001 and stored["binarize_advantage"] is True  # after demonstrations
    assert stored["durability"] == "fsync"
    scratch = flat_dict(LearnerConfig(local=LocalActorsConfig(env="standin"), checkpoint_every=0))
    assert scratch["entropy_coef"] == 0.01 and scratch["binarize_advantage"] is False
    assert scratch["durability"] == "none"


def test_the_old_lambda_spelling_is_still_read_but_not_shown(capsys):
    assert parse_args(["--lambda_", "0.5"]).loss.lambda_ == 0.5
    assert parse_args(["--lambda_=0.25"]).loss.lambda_ == 0.25
    assert parse_args(["--lambda", "0.75"]).loss.lambda_ == 0.75
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    shown = capsys.readouterr().out
    assert "--lambda FLOAT" in shown and "--lambda_" not in shown


def test_the_flags_defaults_are_the_losses_defaults():
    """One default per setting: the flags take theirs from learner.losses.DEFAULTS."""
    loss = LearnerConfig().loss
    for name in (
        "gamma",
        "lambda_",
        "rho_clip",
        "value_coef",
        "advantage_threshold",
        "off_policy_correction",
    ):
        assert getattr(loss, name) == getattr(DEFAULTS, name), name


def test_the_insert_slack_bounds_local_actors_by_default_and_an_explicit_value_wins():
    local = dataclasses.replace(LearnerConfig().local, local_actors=2)
    assert LearnerConfig(local=local, batch_size=8).insert_slack() == 32  # 4 batches
    assert LearnerConfig().insert_slack() == 0  # remote actors collect freely
    assert LearnerConfig(local=local, mode="sync").insert_slack() == 0  # rounds bound collection
    assert parse_args(["--local-actors", "2", "--insert-slack", "0"]).insert_slack() == 0
    assert parse_args(["--insert-slack", "7"]).insert_slack() == 7
    assert flat_dict(LearnerConfig(local=local, batch_size=8))["insert_slack"] == 32  # config.json


def test_the_actor_weighting_flags_reach_the_loss():
    from learner.config import parse_args
    from learner.training.trainer import loss_params

    got = loss_params(parse_args(["--actor-weighting", "vmpo", "--vmpo-eta", "0.3", "--vmpo-kl-coef", "2"]))
    assert (got.actor_weighting, got.vmpo_eta, got.vmpo_kl_coef) == ("vmpo", 0.3, 2.0)
    assert loss_params(parse_args([])).actor_weighting == DEFAULTS.actor_weighting


def test_the_lm_recipe_fills_flags_not_given_and_a_given_flag_wins(capsys):
    from learner.recipes import LM_RECIPE

    lm = parse_args(["--model.kind", "lm", "--batch-size", "3", "--warmup-demos=7"])
    assert (lm.batch_size, lm.imitation.warmup_demos) == (3, 7)  # given: kept
    assert lm.max_steps == LM_RECIPE["max_steps"] and lm.checkpoint_every == LM_RECIPE["checkpoint_every"]
    assert lm.local.envs_per_actor == LM_RECIPE["local.envs_per_actor"]
    assert lm.transport.actor_timeout == LM_RECIPE["transport.actor_timeout"]
    assert lm.loss.actor_weighting == "binary_ratio" != parse_args([]).loss.actor_weighting
    said = capsys.readouterr().out
    assert "--model.kind lm recipe:" in said and "--max-steps 10" in said and "--batch-size" not in said
    assert "--actors-after-warmup --validation-demos" in said  # a boolean reads as its flag alone
    pointer = parse_args([])
    assert pointer.max_steps != LM_RECIPE["max_steps"] and "recipe" not in capsys.readouterr().out
    assert parse_args(["--model.kind", "lm"]).local.actors_after_warmup  # the recipe's boolean...
    assert not parse_args(
        ["--model.kind", "lm", "--no-actors-after-warmup"]
    ).local.actors_after_warmup  # ...off
    unvalidated = parse_args(["--model.kind", "lm", "--validation-demos", "0"])
    assert unvalidated.imitation.warmup_patience == 0  # the recipe's patience needs what the flag turned off
    assert LM_RECIPE["imitation.warmup_patience"] > 0
    assert lm.imitation.warmup_demos == 7 and "--warmup-demos" not in said
    # The recipe's demonstrations scale with the run: three epochs of them fit the warm-up's share.
    assert parse_args(["--model.kind", "lm"]).imitation.warmup_demos == 120  # no time limit
    assert parse_args(["--model.kind", "lm", "--time-limit", "900"]).imitation.warmup_demos == 120
    long = parse_args(["--model.kind", "lm", "--time-limit", "3600"])
    assert long.imitation.warmup_demos == 360 and "--warmup-demos 360" in capsys.readouterr().out
    # Demonstrations enter lm updates as imitation only, never as rows of RL batches (learner/recipes.py).
    assert not lm.imitation.prefill_demos and parse_args([]).imitation.prefill_demos
    # A recency bound: the lm replay keeps the newest 16 episodes (BENCHMARKS.md "LM agent: a recency bound").
    assert lm.buffer.replay_capacity == 16 and parse_args([]).buffer.replay_capacity == 2048


def test_warmup_noise_is_refused_where_the_demonstrator_has_no_random_actions():
    """The lm demonstrator is the oracle alone: --warmup-noise with it is refused at start-up, naming the
    flag, instead of failing later in the demonstrations' subprocess; without generated demonstrations
    (a --demos file) the flag does nothing and is accepted, as it is for the pointer policy."""
    with pytest.raises(
        SystemExit, match=r"--warmup-noise 0\.2: the --model\.kind lm demonstrator is the oracle"
    ):
        parse_args(["--model.kind", "lm", "--warmup-noise", "0.2"])
    assert parse_args(["--model.kind", "lm"]).imitation.warmup_noise == 0.0
    assert parse_args(["--model.kind", "lm", "--warmup-noise", "0.2", "--demos", "d.msgpack"])
    assert parse_args(["--warmup-noise", "0.2"]).imitation.warmup_noise == 0.2
