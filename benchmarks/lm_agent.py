"""The LM agent's hot paths on this machine, with the default recipe (packaged SmolLM2-135M-Instruct, LoRA
rank 8 on the top 8 blocks, 352-token prompts, 24 action tokens) on real SimPhone screens:

- act: the family's jitted act (prefill, then KV-cached constrained decoding) on N environments' prompts,
  split into the prefill alone (the family's first stage, as the actor times it: the decoder over the
  prompts into the KV cache, the preamble every prompt starts with computed once for all rows; the same
  prompts whole, `prefill_whole_ms`, for comparison) and the decoding after it (per decoder pass: the loop runs until every
  row has ended; a constrained action's completing token and forced end-of-turn are not fed back);
- learner: the jitted gradient of the family's evaluate (one forward pass over prompt + action tokens with
  rematerialised blocks, the grammar mask rebuilt) over the trained parameters, on B episodes of T steps:
  the shape of one update of the recipe;
- update cost: B oracle demonstration episodes of `general`/train (real lengths, real prompts), padded as
  collated (--max-steps rows, the prompt budget) and as the learner's host step lays them out for this
  family (`host_inputs`: the step rows and truncated final rows, their real tokens packed end to end into
  rows of segments.SEGMENT_WIDTH, the preamble every prompt shares run once), with the whole decoder
  rematerialised ("packed sequences") and with the frozen trunk from the cache (common/policies/lm/trunk.py:
  the adapted blocks alone, plus the host step that places the kept rows; the trunk's own forward pass
  timed apart and spread over EPOCHS draws of each row): compile seconds, the gradient's GFLOP, the share
  of its token-slot work on real tokens (`real_token_share`: `real_token_flop_share`) and supervised
  demonstration steps per minute (`demo_steps_per_min`: the batch's real steps over the update's seconds);
  and the cached row again with LoRA on the top 4 blocks (a lever measured, not the recipe). The JSON's
  headline keys: the cached row's `real_token_flop_share` and amortized `demo_steps_per_min`;
- wire and snapshot: TRAJ bytes per episode and per step, and what a published snapshot weighs with LoRA
  (adapters and value head) against all parameters.

Reference in the same process: a jitted chain of [4096, 576] x [576, 576] matmuls (the model's width);
`vs_matmul` is each path's share of this machine's dense float32 throughput (GFLOP from XLA's cost
analysis). Numbers are best of `repeats` after a compile call.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from actors.envs.simphone.env import SimPhoneConfig, SimPhoneEnv
from actors.envs.simphone.oracle import Oracle
from benchmarks.report import best_seconds, compiled_gflop, matmul_gflops
from common import wire
from common.backbones.decoder.lora import split_trained
from common.config import ModelConfig
from common.params_file import params_to_flat
from common.policies import make_policy
from common.policies.lm.family import whole_inputs
from common.protocol.episodes import episode_fields, pack_episodes


def _screens(n: int) -> list:
    """n SimPhone training screens: task starts and a few oracle steps in."""
    env = SimPhoneEnv(SimPhoneConfig(tasks="general", split="train", max_steps=20))
    out = []
    seed = 0
    while len(out) < n:
        obs, _ = env.reset(seed=seed)
        oracle = Oracle(env.task.plan)
        out.append(obs)
        for _ in range(seed % 3):
            obs, _, done, cut, _ = env.step(oracle.act(obs))
            if done or cut:
                break
            out.append(obs)
        seed += 1
    return out[:n]


def _features(policy, screens) -> dict[str, np.ndarray]:
    rows = [policy.featurize(obs) for obs in screens]
    return {k: np.stack([r[k] for r in rows]) for k in rows[0]}


def _timed(fn, args, repeats: int) -> float:
    jax.block_until_ready(fn(*args))
    return best_seconds(lambda: jax.block_until_ready(fn(*args)), repeats)


def _act_rows(policy, graphdef, params, screens, sizes, repeats: int, ref: float) -> list[dict]:
    act = jax.jit(lambda p, i, k: policy.act(graphdef, p, i, k, False))
    prefill_jit = jax.jit(lambda p, i: policy.prefill(graphdef, p, i))  # the actor's first stage
    rows = []
    for n in sizes:
        inputs = policy.inputs(_features(policy, screens[:n]))
        key = jax.random.key(0)
        act_s = _timed(act, (params, inputs, key), repeats)
        acted = jax.device_get(act(params, inputs, key))
        # Decoder passes after the prefill: one per token fed back. Constrained, the token that completes
        # an action and its forced end-of-turn are never fed back (network.decode), so the longest action
        # of L tokens costs L - 2 passes.
        positions = int(np.max(acted.choice["action_length"])) - (2 if policy.cfg.lm_constrained else 0)
        pre_args = (params, inputs)
        pre_s = _timed(prefill_jit, pre_args, repeats)
        whole_s = _timed(prefill_jit, (params, whole_inputs(_features(policy, screens[:n]))), repeats)
        shared = len(inputs.get("prefix_ids", ()))  # the preamble, computed once for all rows
        prompt_tokens = int(np.sum(inputs["prompt_length"])) + shared
        rows.append({
            "path": "act", "envs": n, "prompt_width": inputs["prompt_ids"].shape[-1], "shared_tokens": shared,
            "ms_per_call": act_s * 1e3, "ms_per_env_step": act_s * 1e3 / n, "prefill_ms": pre_s * 1e3,
            "decode_ms_per_position": (act_s - pre_s) * 1e3 / max(positions, 1), "decoded_positions": positions,
            "prefill_tokens_per_s": prompt_tokens / pre_s, "prefill_whole_ms": whole_s * 1e3,
            "vs_matmul": compiled_gflop(prefill_jit, *pre_args) / pre_s / ref,
        })  # fmt: skip
    return rows


def _learner_row(policy, graphdef, params, screens, b: int, t: int, repeats: int, ref: float) -> dict:
    features = _features(policy, screens[: b * (t + 1)])
    acted = jax.device_get(jax.jit(lambda p, i, k: policy.act(graphdef, p, i, k, False))(
        params, features, jax.random.key(1)
    ))  # fmt: skip
    obs = {k: v.reshape(b, t + 1, *v.shape[1:]) for k, v in features.items()}
    choice = {k: np.asarray(v).reshape(b, t + 1, *np.shape(v)[1:])[:, :t] for k, v in acted.choice.items()}
    trained, frozen = split_trained(params)

    def loss(trained, frozen):
        ev = policy.evaluate(graphdef, nnx.merge_state(trained, frozen), obs, choice, None)
        return -ev.logp.sum() + jnp.square(ev.values).sum()

    grad = jax.jit(jax.value_and_grad(loss))
    seconds = _timed(grad, (trained, frozen), repeats)
    width = obs["prompt_ids"].shape[-1] + choice["action_tokens"].shape[-1]
    tokens = b * (t + 1) * width
    return {
        "path": "learner gradient", "episodes": b, "steps": t, "ms_per_call": seconds * 1e3,
        "tokens_per_s": tokens / seconds, "vs_matmul": compiled_gflop(grad, trained, frozen) / seconds / ref,
    }  # fmt: skip


FORWARD_SHARE = 0.25
"""A row whose output is only read (a truncated episode's final observation, whose value is a bootstrap
target under stop_gradient) needs its forward pass alone: about a quarter of a trained row's cost (forward,
the rematerialised forward and the backward's two matmuls per weight)."""


def real_token_share(batch, obs: dict[str, np.ndarray], action_width: int) -> dict[str, float]:
    """How an update's token slots divide, weighted by what each costs (FORWARD_SHARE for a row only read),
    on `batch` in the layout `obs` gives it (the padded observations, or the learner's host step's packed
    sequences: segments.packed_sequences).

    `real` is the prompt and action tokens of every step row and the prompt tokens of a truncated
    episode's final row (forward only), a preamble cut from every prompt counted once. The rest is waste:
    in the padded layout rows past an episode's end, the final row of a terminal episode (its value is
    never read), the backward through a truncated one's final row, left padding and action slots past the
    action's end; packed, the slots left empty at the packed rows' ends, the final rows of terminal
    episodes and the preamble's second pass for the final rows. Counted per token slot, so attention's
    quadratic part is weighed as if linear (a few percent of a 135M decoder's FLOPs at 500 tokens)."""
    b, rows = batch.obs["prompt_length"].shape
    p = obs["prefix_ids"].shape[-1] if "prefix_ids" in obs else 0
    if "steps_segments" in obs:
        total = obs["steps_segments"].size + p + FORWARD_SHARE * (obs["finals_segments"].size + p)
    else:
        total = b * rows * (obs["prompt_ids"].shape[-1] + action_width)
    real = float(p)
    for i in range(b):
        n = int(batch.length[i])
        prompts = batch.obs["prompt_length"][i] - p
        real += float(np.sum(prompts[:n]) + np.sum(batch.choice["action_length"][i, :n]))
        if not batch.terminal[i]:
            real += FORWARD_SHARE * float(prompts[n])
    return {"real_token_flop_share": real / total, "slots": total}


def _demo_batch(policy, b: int, max_steps: int):
    """b oracle demonstrations of `general`/train as the learner collates them (episodes the grammar cannot
    write are skipped, as the learner's recorder skips them)."""
    from actors.envs.simphone.env import SimPhoneConfig as Config
    from actors.tools.demos import record_episode
    from common.protocol.episodes import validate_packed
    from learner.batch import collate

    env = SimPhoneEnv(Config(tasks="general", split="train", max_steps=max_steps))
    rng, fields, seed = np.random.default_rng(0), [], 0
    while len(fields) < b:
        seed += 1
        episode = record_episode(env, seed, 0.0, rng, policy)
        if episode is not None:
            fields.append(episode)
    episodes = validate_packed(pack_episodes(fields), policy.episode_spec(), max_steps, 0)
    return collate(episodes, max_steps)


def _update_rows(policy, graphdef, params, b: int, max_steps: int, repeats: int) -> list[dict]:
    """The update's cost on b real demonstrations, padded as collated and packed as the learner's host
    step packs them (packing.py, segments.py), without and with the cached trunk (trunk.py)."""
    batch = _demo_batch(policy, b, max_steps)
    trained, frozen = split_trained(params)
    grad, compile_s = _update_gradient(policy, graphdef, batch, trained, frozen, batch.obs)
    seconds = _timed(grad, (trained, frozen, batch.obs), repeats)
    steps = int(np.sum(batch.length))
    padded = {
        "path": "update (padded)", "episodes": b, "max_steps": max_steps, "steps": steps,
        "compile_s": compile_s, "ms_per_call": seconds * 1e3, "gflop": compiled_gflop(grad, trained, frozen, batch.obs),
        **real_token_share(batch, batch.obs, batch.choice["action_tokens"].shape[-1]),
        "demo_steps_per_min": steps / seconds * 60,
    }  # fmt: skip
    return [padded] + [
        _packed_row(policy, graphdef, params, batch, repeats, cached) for cached in (False, True)
    ]


EPOCHS = 3
"""Draws of each row the cached update's amortized figure assumes: the trunk of a row is computed at its
first draw and read at the next two (a warm start of a few epochs over its demonstrations)."""


def _update_gradient(policy, graphdef, batch, trained, frozen, obs):
    """(the jitted gradient of the family's evaluate over the trained parameters, as an update
    differentiates it, on `obs` and the batch's choices; its compile seconds)."""

    def loss(trained, frozen, obs):
        ev = policy.evaluate(graphdef, nnx.merge_state(trained, frozen), obs, batch.choice, None)
        return -ev.logp.sum() + jnp.square(ev.values).sum()

    grad = jax.jit(jax.value_and_grad(loss))
    t0 = time.perf_counter()
    grad.lower(trained, frozen, obs).compile()
    return grad, time.perf_counter() - t0


def _packed_row(policy, graphdef, params, batch, repeats: int, cached: bool) -> dict:
    """The update on the learner's host step's layout (the family's `host_inputs`: the step rows and
    truncated final rows as sequences end to end, the shared preamble once), without a trunk cache (the
    whole decoder, rematerialised) or with it (`cached`: only the adapted blocks). Per update the host step
    (with the cache, on hits: placing the kept rows) plus the gradient; with the cache the trunk's
    computation for the batch (a first draw, forward only) timed apart, and demo steps per minute both with
    every row kept (`demo_steps_per_min`) and with the trunk's cost spread over EPOCHS draws
    (`demo_steps_per_min_amortized`)."""
    trained, frozen = split_trained(params)
    steps = int(np.sum(batch.length))
    host = policy.host_inputs(graphdef, 2**31 if cached else 0)
    trunk = host.trunk

    def host_step() -> dict:
        return host(batch.obs, None, batch.choice, params)[0]

    def first_draw() -> dict:
        trunk.clear()  # every row computed again, by the trunk already compiled
        return host_step()

    t0 = time.perf_counter()
    obs = host_step()  # compiles the trunk, when cached
    trunk_compile_s = time.perf_counter() - t0 if cached else 0.0
    trunk_s = best_seconds(first_draw, repeats) if cached else 0.0
    host_s = best_seconds(host_step, repeats)
    grad, compile_s = _update_gradient(policy, graphdef, batch, trained, frozen, obs)
    seconds = _timed(grad, (trained, frozen, obs), repeats) + host_s
    return {
        "path": f"update (packed sequences{', cached trunk' if cached else ''})",
        "episodes": len(batch.length), "steps": steps, "packed_rows": obs["steps_ids"].shape[:2],
        "width": obs["steps_ids"].shape[-1], "shared_tokens": obs["prefix_ids"].shape[-1] if "prefix_ids" in obs else 0,
        "compile_s": compile_s + trunk_compile_s, "ms_per_call": seconds * 1e3, "host_ms": host_s * 1e3,
        "trunk_ms": trunk_s * 1e3, "gflop": compiled_gflop(grad, trained, frozen, obs),
        "trunk_mb": trunk.bytes / 2**20 if cached else 0.0,
        **real_token_share(batch, obs, batch.choice["action_tokens"].shape[-1]),
        "demo_steps_per_min": steps / seconds * 60,
        "demo_steps_per_min_amortized": steps / (seconds + trunk_s / EPOCHS) * 60,
    }  # fmt: skip


def _fewer_adapted_row(layers: int, repeats: int) -> dict:
    """The last update row (packed sequences, cached trunk) with LoRA on the top `layers` blocks instead
    of the recipe's 8: a lever measured for the recipe's choice, not the recipe (what fewer adapted blocks
    cost in learning is another question: issue 47)."""
    policy = make_policy(ModelConfig(kind="lm", lora_layers=layers))
    graphdef, params = policy.create(0)
    row = _packed_row(policy, graphdef, params, _demo_batch(policy, 2, 10), repeats, True)
    return {**row, "path": f"{row['path']}, top {layers} blocks adapted (not the recipe)"}


def _wire_rows(policy, graphdef, params, screens, t: int) -> list[dict]:
    features = _features(policy, screens[: t + 1])
    acted = jax.device_get(jax.jit(lambda p, i, k: policy.act(graphdef, p, i, k, False))(
        params, features, jax.random.key(2)
    ))  # fmt: skip
    steps = {k: np.asarray(v)[:t] for k, v in acted.choice.items()}
    base = {"behavior_logp": np.zeros(t), "reward": np.zeros(t), "policy_version": np.zeros(t)}
    episode = episode_fields("t", True, False, features, {**steps, **base}, spec=policy.episode_spec())
    size = len(wire.encode(pack_episodes([episode] * 8))) / 8
    trained = params_to_flat(split_trained(params)[0])
    full = params_to_flat(params)
    mb = lambda flat: sum(v.nbytes for v in flat.values()) / 1e6  # noqa: E731
    return [
        {"path": "TRAJ", "steps": t, "bytes_per_episode": size, "bytes_per_step": size / t},
        {"path": "published snapshot", "lora": "rank 8, top 8 blocks", "snapshot_mb": mb(trained)},
        {"path": "published snapshot", "lora": "none (everything)", "snapshot_mb": mb(full)},
    ]


def run(quick: bool) -> tuple[list[dict], dict]:
    repeats = 2 if quick else 3
    t0 = time.perf_counter()
    policy = make_policy(ModelConfig(kind="lm"))
    graphdef, params = policy.create(0)
    create_s = time.perf_counter() - t0
    ref = matmul_gflops(576, repeats)
    screens = _screens(22)
    rows = _act_rows(policy, graphdef, params, screens, (1, 4) if quick else (1, 4, 16), repeats, ref)
    rows.append(
        _learner_row(policy, graphdef, params, screens, 1 if quick else 2, 4 if quick else 10, repeats, ref)
    )
    updates = _update_rows(policy, graphdef, params, 2, 10, repeats)  # the recipe's update
    rows += updates
    rows.append(_fewer_adapted_row(4, repeats))
    cached = updates[-1]
    rows += _wire_rows(policy, graphdef, params, screens, 5)
    rows.append({"path": "create policy (GGUF load + LoRA)", "seconds": create_s, "ref_matmul_gflops": ref})
    headline = {
        "real_token_flop_share": cached["real_token_flop_share"],
        "demo_steps_per_min": cached["demo_steps_per_min_amortized"],
    }
    return rows, headline
