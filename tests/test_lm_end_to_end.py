"""The `lm` family through the whole system, on the tiny decoder with SmolLM2's tokenizer (tests/lm_backbone.py):
`python -m learner --model.kind lm` records grammar demonstrations, imitates them, trains A-RIDE on a real
actor's episodes, checkpoints, resumes with the actor acting through the learner's inference service, and
`python -m learner eval` runs the checkpoint; hostile TRAJs from
a fake actor (out-of-range token ids, token rows of the wrong shape, in-range tokens outside the grammar)
are refused with their reason codes while it keeps training. Whether the real SmolLM2 learns is a
benchmark (BENCHMARKS.md, "lm_agent"), not a test: it takes minutes per update on this CPU."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from common.backbones.decoder import snapshot as decoder_snapshot
from common.config import ModelConfig
from common.policies import make_policy
from common.protocol.episodes import episode_fields, pack_episodes
from tests.conftest import ACTOR_ENV, ROOT, read_jsonl
from tests.lm_backbone import tiny_lm_folder
from tests.test_fake_actor import FakeActor, message

PROMPT_TOKENS = 128
"""Two prompt widths (64, 128) instead of the default budget's six: fewer update shapes to compile (about
10 s each here), 115 -> 99 CPU-s for the test; long screens lose elements, which it allows."""
RUN = (
    *("--env", "simphone", "--max-steps", "6", "--local-actors", "1", "--envs-per-actor", "2"),
    *("--batch-size", "2", "--warmup-demos", "12", "--warmup-updates", "2", "--checkpoint-every", "3"),
    *("--log-every", "1", "--actor-timeout", "60", "--model.lora-rank", "4", "--model.lora-layers", "1"),
    *("--insert-slack", "0"),  # the recipe's 2 would leave the hostile fake actor without credit
    *("--validation-demos", "0"),  # the recipe's 20 would be more than the 12 demonstrations
    *("--model.lm-prompt-tokens", str(PROMPT_TOKENS)),
)


def _hostile(model: dict) -> dict[str, list]:
    """reason code -> a one-episode batch that must get it: token ids past the vocabulary, token rows of the
    wrong width, and in-range tokens that are not a sentence of the grammar."""
    policy = make_policy(ModelConfig.from_dict(model))
    spec, vocab = policy.episode_spec(), policy.vocab_size
    p, a = model["lm_prompt_tokens"], model["lm_action_tokens"]
    done = [*policy.tokenizer.tokenizer.encode("done()", add_special_tokens=False).ids, policy.eos_id]
    tokens = np.zeros((1, a), "<i4")
    tokens[0, : len(done)] = done

    def episode(action_tokens: np.ndarray) -> dict:
        ep = episode_fields(
            "settings.wifi_on", False, False,
            {"prompt_ids": np.full((2, p), 7, "<i4"), "prompt_length": np.full(2, p, "<i4"),
             "n_elements": np.full(2, 3, "<i4")},
            {"action_tokens": tokens, "action_length": [len(done)], "token_logp": np.zeros((1, a)),
             "behavior_logp": [0.0], "reward": [0.0], "policy_version": [0]},
            spec=spec,
        )  # fmt: skip
        ep["action_tokens"] = action_tokens  # past the spec's own check: what a hostile sender can do
        return ep

    past_vocab, swapped = tokens.copy(), tokens.copy()
    past_vocab[0, 0] = vocab
    swapped[0, [0, 1]] = swapped[0, [1, 0]]
    return {
        "bad_array": [episode(past_vocab), episode(np.zeros((1, a + 1), "<i4"))],
        "bad_choice": [episode(swapped)],
    }


def _send_hostile(learner) -> dict[str, int]:
    actor = FakeActor(learner, "hostile")
    try:
        welcome = actor.hello()
        sent: dict[str, int] = {}
        for code, episodes in _hostile(welcome["model"]).items():
            for ep in episodes:
                actor.seq += 1  # the fake actor packs pointer episodes only: these are packed here
                packed = pack_episodes([ep])
                reply = actor.request(
                    message("TRAJ", actor_id=actor.actor_id, seq=actor.seq, episodes=packed)
                )
                assert reply["kind"] == "ERROR" and reply["code"] == code, reply
                sent[code] = sent.get(code, 0) + 1
        return sent
    finally:
        actor.close()


def _metrics(run_dir) -> list[dict]:
    return read_jsonl(run_dir / "metrics.jsonl")


@pytest.mark.long
@pytest.mark.timeout(900)
def test_lm_learner_trains_refuses_hostile_batches_checkpoints_resumes_and_evaluates(
    learner_process, tmp_path
):
    backbone = str(tiny_lm_folder(tmp_path / "tiny-lm"))
    run_dir = tmp_path / "lm-run"
    first = learner_process("--model.kind", "lm", "--model.backbone", backbone, *RUN, "--max-updates", "6",
                            run_dir=run_dir)  # fmt: skip
    deadline = time.monotonic() + 600
    while not any(m["update"] >= 1 for m in first.metrics()):  # demonstrations recorded, first update done
        assert first.proc.poll() is None and time.monotonic() < deadline, first.log()
        time.sleep(1)
    sent = _send_hostile(first)
    assert first.proc.wait(timeout=600) == 0, first.log()
    final = _metrics(run_dir)[-1]
    assert final["update"] == 6 and final["skipped_nonfinite"] == 0, final
    assert final["rejected_by_reason"] == sent, final  # the hostile batches and nothing else
    assert final["episodes"] > 0 and final["env_steps"] >= final["episodes"]  # the real actor's episodes
    assert final["local_actors_killed"] == 0, first.log()  # it stopped between acts, within the grace
    assert "lm recipe" in first.log()
    # The update trained on packed rows (common/policies/lm/packing.py), compiled per shape as it came:
    # at most 5 row rungs (1, 2, 3, 4, 6: --max-steps 6) times 2 prompt widths (64 and PROMPT_TOKENS).
    bound = re.search(r"compiles for each batch shape as it first comes \(at most (\d+)\)", first.log())
    assert bound, first.log()
    assert 1 <= final["train/update_shapes"] <= int(bound[1]), final
    # ... with the bottom block's output from the cache (common/policies/lm/trunk.py; LoRA on the top one).
    assert final["train/trunk_misses"] > 0 and final["train/trunk_cache_mb"] > 0, final
    # The actor timed its act's two stages (its final counters; the status line shows their means).
    stopped = (run_dir / "actor-0.log").read_text()
    assert re.search(r"'act_prefill_us': [1-9]", stopped) and re.search(r"'act_decode_us': [1-9]", stopped)
    meta, adapters = decoder_snapshot.read(run_dir / "decoder.safetensors")  # `learner export`'s source
    assert meta["base"] == backbone and meta["lora"].rank == 4
    assert adapters and all("lora" in name for name in adapters)

    # Resumed with the actor acting through the learner's inference service (--inference remote), stopped
    # by SIGTERM once it trained 2 more updates and the service answered the actor: the episodes the
    # log recovers after the checkpoint can pay for those updates before a loaded actor's first request.
    second = learner_process("--model.kind", "lm", "--model.backbone", backbone, *RUN, "--max-updates", "100",
                             "--local-actor-args=--inference remote", run_dir=run_dir)  # fmt: skip
    deadline = time.monotonic() + 600
    while not any(m["update"] >= 8 and m.get("inference/answered", 0) > 0 for m in _metrics(run_dir)):
        assert second.proc.poll() is None and time.monotonic() < deadline, second.log()
        time.sleep(1)
    assert second.stop() == 0, second.log()
    assert "resuming from the checkpoint at update 6" in second.log()
    resumed = _metrics(run_dir)[-1]
    assert resumed["stopped"] == "SIGTERM" and resumed["update"] >= 8 and resumed["episodes"] > 0, resumed
    # A request that finds the service behind (a publish while no actor asked hands over no copy) is
    # refused `unavailable` and makes the loop hand the parameters over (learner/serving/inference.py):
    # whether the first request comes before that depends on timing; any other refusal is a fault.
    assert resumed["inference/answered"] > 0, resumed
    assert set(resumed["inference/rejected_by_reason"]) <= {"unavailable"}, resumed
    # It stopped on the learner's SIGTERM (a request in flight given up), not killed after the grace.
    assert resumed["local_actors_killed"] == 0, second.log()
    assert "param_swaps" not in (run_dir / "actor-0.log").read_text().rsplit("stopped", 1)[-1]

    out = tmp_path / "eval.json"
    cmd = [sys.executable, "-m", "learner", "eval", "--checkpoint", str(run_dir), "--episodes", "4",
           "--num-envs", "2", "--split", "train", "--json", str(out)]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, env=ACTOR_ENV, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    # The newest checkpoint: the final one, or with an update in flight at the SIGTERM (abandoned, so the
    # learner ends within seconds) the one before it, which the learner names.
    saved = resumed["update"]
    if resumed["abandoned"] == "update":
        saved = int(re.search(r"a resume starts from checkpoint (\d+)", second.log())[1])
    assert 6 <= saved <= resumed["update"]
    assert report["update"] == saved and report["episodes"] == 4 and report["invalid_actions"] == 0
    assert 0 < report["mean_prompt_tokens"] <= PROMPT_TOKENS
