"""WELCOME tells an actor the WordPiece id bound the learner enforces (`text_vocab_size`), and leaves the
field out without a text encoder, so an actor written from docs/PROTOCOL.md alone can respect it."""

from __future__ import annotations

import numpy as np
import pytest
import zmq

from common import protocol, wire
from common.config import ModelConfig
from common.policies import make_policy
from common.policies.family import welcome_fields
from common.policies.pointer import featurize
from learner.ingest.registry import ActorRegistry
from learner.ingest.transport import Transport
from learner.setup.ingest import ingest_server

MODEL = ModelConfig(vocab_size=64, max_instruction_tokens=4, max_elements=5, max_element_tokens=2,
                    d_model=8, num_heads=2, num_layers=1, mlp_dim=8)  # fmt: skip


@pytest.mark.parametrize("text_vocab_size", [0, 30522])
def test_welcome_carries_the_word_piece_bound(text_vocab_size):
    fields = {"model": MODEL.to_dict(), "max_steps": 4, "text_vocab_size": text_vocab_size}  # the family's
    server = ingest_server(
        Transport("127.0.0.1", 0, 0), ActorRegistry(), welcome_fields=fields,
        episode_spec=featurize.episode_spec(MODEL, 0), max_steps=4, on_episodes=lambda *_: None,
    )  # fmt: skip
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        server.publish(0, {"w": np.zeros(3, np.float32)})
        sock.connect(f"tcp://127.0.0.1:{server.ingest_port}")
        sock.send(wire.encode(protocol.Hello("a", 1, "inst", 1).to_msg()))
        while not sock.poll(0):
            server.poll(10)
        msg = protocol.parse(sock.recv())
        assert ("text_vocab_size" in msg) == (text_vocab_size > 0)  # absent without a text encoder
        assert protocol.Welcome.from_msg(msg).text_vocab_size == text_vocab_size
    finally:
        sock.close(0)
        ctx.term()
        server.close()


def test_a_negative_word_piece_bound_is_a_bad_welcome():
    msg = protocol.Welcome("r", 1, 0, 0, 8, 1.0, MODEL, 4, text_vocab_size=5).to_msg()
    msg["text_vocab_size"] = -1
    with pytest.raises(protocol.ProtocolError) as e:
        protocol.Welcome.from_msg(msg)
    assert e.value.code == "bad_field"


def test_the_pointer_family_announces_its_word_piece_bound():
    """open_ingest puts the family's own WELCOME fields (family.welcome_fields) beside the model: the pointer
    policy's is the text encoder's vocabulary, 0 (left out of WELCOME) without an encoder."""
    assert welcome_fields(make_policy(MODEL)) == {"text_vocab_size": 0}
    assert welcome_fields(object()) == {}
