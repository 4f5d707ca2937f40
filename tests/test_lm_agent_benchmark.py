"""benchmarks/lm_agent.py `real_token_share`: the headline share of an update's compute on real tokens,
checked against a batch counted by hand."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from benchmarks.lm_agent import FORWARD_SHARE, real_token_share
from common.policies.lm import packing


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

    # Packed (packing.pack, quantum 4): 3 step rows in 2 slots per episode (one unused); the longest prompt,
    # 9, rounded up to 12 keeps all 10 columns; both final rows forward only (the terminal one's unread).
    packed = packing.pack(batch.obs, quantum=4)
    assert packed["train_rows"].shape == (2, 2) and packed["prompt_ids"].shape[-1] == 10
    share = real_token_share(batch, packed, action_width=4)
    assert share["slots"] == pytest.approx(4 * 14 + FORWARD_SHARE * 2 * 10)
    assert share["real_token_flop_share"] == pytest.approx(real / share["slots"])
