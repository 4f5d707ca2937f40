"""benchmarks/lm_agent.py `real_token_share`: the headline share of an update's compute on real tokens,
checked against a batch counted by hand."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from benchmarks.lm_agent import FORWARD_SHARE, real_token_share
from common.policies.lm import packing, segments
from common.policies.lm.segments import SEGMENT_WIDTH


def test_real_tokens_are_the_step_rows_and_a_truncated_episodes_final_prompt():
    # Two episodes, max_steps 3 (4 observation rows each), prompts 10 wide, actions 4 wide: 2 x 4 x 14 slots.
    lengths = np.array([[6, 7, 8, 0], [5, 9, 0, 0]])
    batch = SimpleNamespace(
        obs={"prompt_length": lengths, "prompt_ids": np.zeros((2, 4, 10), np.int32)},
        choice={"action_length": np.array([[3, 2, 0], [4, 0, 0]])},
        length=np.array([2, 1]),
        terminal=np.array([True, False]),
    )
    share = real_token_share(batch, batch.obs, action_width=4)
    # Episode 0 (terminal): rows 0-1 train (6 + 3, 7 + 2); its final row (8 tokens) is never read.
    # Episode 1 (truncated): row 0 trains (5 + 4); its final row's 9 prompt tokens are read, forward only.
    real = (6 + 3) + (7 + 2) + (5 + 4) + FORWARD_SHARE * 9
    assert share["slots"] == 2 * 4 * 14
    assert share["real_token_flop_share"] == pytest.approx(real / (2 * 4 * 14))

    # Packed as the learner's host step lays it out, every prompt starting with a 2-token preamble: the
    # preamble once (trained), each step row's rest and action end to end (7, 7 and 7 tokens in one row
    # of SEGMENT_WIDTH, rounded up to a row per episode), the final rows' rests (6 and 7, forward only)
    # in rows 8 wide (quantum 4) and the preamble's second pass for them.
    prefix = np.array([5, 6])
    ids = np.zeros((2, 4, 10), np.int32)
    for (i, t), n in np.ndenumerate(lengths):
        ids[i, t, 10 - n :] = np.r_[prefix, np.arange(7, 5 + n)][:n] if n else []
    choice = {"action_length": batch.choice["action_length"], "action_tokens": np.ones((2, 3, 4), np.int32)}
    obs = segments.packed_sequences(packing.pack({**batch.obs, "prompt_ids": ids}), choice, prefix, 4)
    assert obs["steps_segments"].shape == (2, 1, SEGMENT_WIDTH) and obs["finals_segments"].shape == (2, 1, 8)
    share = real_token_share(batch, obs, action_width=4)
    assert share["slots"] == pytest.approx(2 * SEGMENT_WIDTH + 2 + FORWARD_SHARE * (2 * 8 + 2))
    real = 2 + (4 + 3) + (5 + 2) + (3 + 4) + FORWARD_SHARE * 7
    assert share["real_token_flop_share"] == pytest.approx(real / share["slots"])
