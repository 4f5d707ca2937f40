"""The inference service (learner/serving/inference.py) with real sockets on 127.0.0.1, driven by the actor's
remote policy (actors/remote_policy.py) and by a hostile fake peer.

What must hold: the service answers with the newest published parameters and names their version; its
log-probs are the family's own for the choices it made (the importance ratio an actor's steps get is 1 at
zero lag); requests from several actors are batched; and every bad request (undecodable, wrong kind,
wrong shapes, ids out of range, extra frames, an actor the learner has not welcomed, before the first
parameters) is answered with its code and counted, while the service keeps serving. Against a fake
service, the remote policy ignores late answers and gives up on silence. Both policy families are served.
"""

from __future__ import annotations

import threading
import time

import jax
import numpy as np
import pytest
import zmq

from actors.envs.standin import StandInPhoneEnv
from actors.policy_runner import stack
from actors.remote_policy import InferenceRefused, RemotePolicy
from common import protocol, wire
from common.config import ModelConfig
from common.policies import make_policy
from common.protocol.inference import Act, ActedReply
from learner.serving.inference import InferenceConfig, InferenceService

CFG = ModelConfig(vocab_size=512, d_model=32, num_heads=4, num_layers=1, mlp_dim=64, text_encoder="none")
WELCOMED = {1, 2}


@pytest.fixture
def service():
    policy = make_policy(CFG)
    graphdef, _ = policy.create(0)
    ctx = zmq.Context()
    svc = InferenceService(
        policy,
        graphdef,
        ctx,
        "tcp://127.0.0.1:*",
        WELCOMED.__contains__,
        InferenceConfig(max_rows=16, deadline_ms=50),
    ).start()
    yield svc
    svc.close()
    ctx.term()


def _features(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    policy = make_policy(CFG)
    env = StandInPhoneEnv()
    rows = []
    for i in range(n):
        obs, _ = env.reset(seed=seed + i)
        rows.append(policy.featurize(obs))
    return stack(rows)


def _logp(params, features: dict[str, np.ndarray], choices: list[dict]) -> np.ndarray:
    """The family's own log pi of each row's choice (each row a one-step episode)."""
    policy = make_policy(CFG)
    graphdef, _ = policy.create(0)
    obs = {k: np.stack([v, v], 1) for k, v in features.items()}
    choice = {k: np.array([[c[k]] for c in choices]) for k in choices[0]}
    ev = jax.jit(lambda p, o, c: policy.evaluate(graphdef, p, o, c, None))(params, obs, choice)
    return np.asarray(ev.logp)[:, 0]


def test_answers_with_the_newest_parameters_and_their_own_log_probs(service):
    client = RemotePolicy(CFG, service.endpoint, actor_id=1, timeout=30)
    features = _features(5)
    with pytest.raises(InferenceRefused, match="unavailable"):
        client.act(features)  # nothing published yet
    _, params = make_policy(CFG).create(0)
    service.publish(3, params)
    acted = client.act(features)
    assert client.version == 3 and len(acted.choices) == 5
    np.testing.assert_allclose(acted.logp, _logp(params, features, acted.choices), atol=1e-5)
    _, newer = make_policy(CFG).create(1)
    service.publish(4, newer)
    acted = client.act(features)
    assert client.version == 4
    np.testing.assert_allclose(acted.logp, _logp(newer, features, acted.choices), atol=1e-5)
    # A check that can fail: the same choices under the older parameters have other log-probs.
    assert np.abs(acted.logp - _logp(params, features, acted.choices)).max() > 1e-3
    assert service.rejected == {"unavailable": 1}
    client.close()


def test_an_idle_service_takes_no_copies_and_never_serves_an_older_version(service, monkeypatch):
    """A publish while no actor asks hands over only the version: a request then is refused (`unavailable`)
    instead of being served by older parameters, and the next publish copies again."""
    import learner.serving.inference

    _, params = make_policy(CFG).create(0)
    assert service.wants_params()  # nothing held yet
    service.publish(1, params)
    assert not service.wants_params()  # nobody has asked
    service.publish(2, None)
    client = RemotePolicy(CFG, service.endpoint, actor_id=1, timeout=30)
    with pytest.raises(InferenceRefused, match="unavailable"):
        client.act(_features(2))  # version 2 exists, its parameters are not here: not served with 1's
    assert service.wants_params() and service.behind()  # an actor asked, and found the service behind
    service.publish(3, params)
    assert not service.behind()
    client.act(_features(2))
    assert client.version == 3 and service.metrics()["inference/idle_publishes"] == 1
    monkeypatch.setattr(learner.serving.inference, "IDLE_S", 0.0)
    assert not service.wants_params()  # idle again
    client.close()


def test_requests_from_several_actors_are_batched(service):
    _, params = make_policy(CFG).create(0)
    service.publish(0, params)
    clients = [RemotePolicy(CFG, service.endpoint, actor_id=1 + i % 2) for i in range(4)]
    barrier = threading.Barrier(len(clients))
    answers: list = [None] * len(clients)

    def go(i: int) -> None:
        barrier.wait()
        answers[i] = clients[i].act(_features(3, seed=10 * i))

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(clients))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(a is not None and len(a.choices) == 3 for a in answers)
    assert service.stats["answered"] == 4 and service.stats["rows"] == 12
    assert service.stats["batches"] < 4  # at least two requests shared one act
    for c in clients:
        c.close()


def _ask(sock: zmq.Socket, frames: list[bytes]) -> dict:
    sock.send_multipart(frames)
    assert sock.poll(30_000), "no answer"
    return protocol.parse(sock.recv())


def test_bad_requests_are_answered_with_their_code_counted_and_change_nothing(service):
    _, params = make_policy(CFG).create(0)
    service.publish(0, params)
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(service.endpoint)
    good = _features(2)
    spec = make_policy(CFG).episode_spec()
    id_name = next(iter(spec.id_ranges))
    out_of_range = {**good, id_name: np.full_like(good[id_name], spec.id_ranges[id_name][1])}
    wrong_shape = {k: v[:, None] if k == id_name else v for k, v in good.items()}
    hello = protocol.Hello("a", 1, "x" * 8, 1).to_msg()
    cases = {
        "bad_encoding": [b"\xc1not msgpack"],
        "unknown_kind": [wire.encode({"v": protocol.PROTOCOL_VERSION, "kind": "NOPE"})],
        "unexpected_kind": [wire.encode(hello)],
        "bad_version": [wire.encode({**Act(1, 1, good).to_msg(), "v": 3})],
        "bad_array": [wire.encode(Act(1, 2, out_of_range).to_msg())],
        "bad_field": [wire.encode(Act(1, 3, wrong_shape).to_msg())],
        "bad_envelope": [b"one", b"two"],
        "not_welcomed": [wire.encode(Act(7, 4, good).to_msg())],
    }
    for code, frames in cases.items():
        answer = _ask(sock, frames)
        assert answer["kind"] == protocol.ERROR and answer["code"] == code, (code, answer)
    assert service.rejected == {code: 1 for code in cases}
    # A flood of good requests it does not read: the service keeps going, every one is answered or a
    # dropped reply is counted, and a fresh client is still served.
    for i in range(200):
        sock.send(wire.encode(Act(1, 100 + i, good).to_msg()))
    client = RemotePolicy(CFG, service.endpoint, actor_id=2)
    assert len(client.act(good).choices) == 2
    sock.close(0)
    client.close()
    assert service.stats["requests"] >= len(cases) + 1
    assert sum(service.rejected.values()) == len(cases)


def test_the_lm_family_is_served_with_its_token_log_probs(tmp_path):
    """The decoder family through the service (tiny decoder, SmolLM2's tokenizer): per-token behaviour
    log-probs come back with each action, and the learner's scoring of them gives an on-policy ratio of 1."""
    from actors.envs.simphone.env import SimPhoneConfig, SimPhoneEnv
    from tests.lm_backbone import tiny_lm_folder

    cfg = ModelConfig(kind="lm", backbone=str(tiny_lm_folder(tmp_path / "tiny-lm")), lora_rank=4)
    policy = make_policy(cfg)
    graphdef, params = policy.create(0)
    ctx = zmq.Context()
    svc = InferenceService(policy, graphdef, ctx, "tcp://127.0.0.1:*", WELCOMED.__contains__).start()
    try:
        svc.publish(2, params)
        env = SimPhoneEnv(SimPhoneConfig(tasks="general", split="train", max_steps=20))
        features = stack([policy.featurize(env.reset(seed=i)[0]) for i in range(3)])
        client = RemotePolicy(cfg, svc.endpoint, actor_id=1)
        acted = client.act(features)
        client.close()
    finally:
        svc.close()
        ctx.term()
    assert client.version == 2 and len(acted.choices) == 3
    tokens = np.array([c["token_logp"] for c in acted.choices])
    np.testing.assert_allclose(acted.logp, tokens.sum(-1), atol=1e-5)
    obs = {k: np.stack([v, v], 1) for k, v in features.items()}
    choice = {k: np.array([[c[k]] for c in acted.choices]) for k in acted.choices[0]}
    ev = jax.jit(lambda p, o, c: policy.evaluate(graphdef, p, o, c, None))(params, obs, choice)
    np.testing.assert_allclose(np.exp(np.asarray(ev.logp)[:, 0] - acted.logp), 1.0, atol=1e-4)


def test_the_remote_policy_ignores_late_answers_and_gives_up_on_silence():
    """Against a fake service: an answer to an earlier request is ignored (counted), the one for this
    request is taken; a service that never answers gives `no_answer` after the timeout, and the next request
    goes out on a new connection. While it waits, it keeps calling `while_waiting` (the actor heartbeats
    there, or a learner would forget it while a new batch size compiles on the service), and gives the
    request up as soon as the actor is asked to stop."""
    ctx = zmq.Context.instance()
    fake = ctx.socket(zmq.ROUTER)
    fake.setsockopt(zmq.LINGER, 0)
    port = fake.bind_to_random_port("tcp://127.0.0.1")
    waits: list[float] = []
    client = RemotePolicy(
        CFG,
        f"tcp://127.0.0.1:{port}",
        actor_id=1,
        timeout=2,
        while_waiting=lambda: waits.append(time.monotonic()),
    )
    features = _features(2)
    spec = make_policy(CFG).episode_spec()
    rows = {
        **{name: np.zeros((2, *shape), dtype) for name, (shape, dtype) in spec.choice_arrays().items()},
        **{name: np.zeros(2, "<f4") for name in ("logp", "value", "entropy")},
    }

    def serve() -> None:
        identity, frame = fake.recv_multipart()
        request = protocol.parse(frame)["id"]
        for answer in (ActedReply(request - 1, 8, rows), ActedReply(request, 9, rows)):  # a stale one first
            fake.send_multipart([identity, wire.encode(answer.to_msg())])

    server = threading.Thread(target=serve)
    server.start()
    acted = client.act(features)
    server.join()
    assert client.version == 9 and len(acted.choices) == 2 and client.stats["late_answers"] == 1
    waits.clear()
    with pytest.raises(InferenceRefused, match="no_answer"):
        client.act(features)  # the fake reads it and stays silent
    assert len(waits) >= 4 and max(np.diff(waits)) < 1.0  # heartbeats every WAIT_SLICE_S through the 2 s
    assert client.stats["reconnects"] == 1 and client._sock is None
    # Asked to stop while it waits (a learner stopping its local actors answers no more and kills what
    # has not stopped within seconds): the request is given up at the next slice, not after the timeout.
    client.timeout, stop_at = 30, time.monotonic() + 0.6
    client.stopping = lambda: time.monotonic() >= stop_at
    with pytest.raises(InferenceRefused, match="stopping"):
        client.act(features)
    assert time.monotonic() - stop_at < 1.0 and client.stats["given_up_stopping"] == 1
    assert client._sock is None  # its answer, should it come, goes nowhere
    client.close()
    fake.close(0)


def test_the_serving_copy_outlives_the_donated_parameters_and_shares_one_frozen_base(tmp_path):
    """Trainer.serving_copy: the update donates the trainer's arrays (deleted here, as donation does), and
    the service's copy still acts; with LoRA, the frozen base is copied once, only what trains per version."""
    import dataclasses

    from common.backbones.decoder.lora import split_trained
    from learner.config import LearnerConfig, MeshConfig
    from learner.training.mesh import make_mesh
    from learner.training.trainer import Trainer
    from tests.lm_backbone import tiny_lm_folder

    model = ModelConfig(kind="lm", backbone=str(tiny_lm_folder(tmp_path / "tiny-lm")), lora_rank=4)
    trainer = Trainer(
        dataclasses.replace(LearnerConfig(), model=model, batch_size=2), make_mesh(MeshConfig()), 0
    )
    want = jax.tree.map(np.asarray, trainer.params)
    first, second = trainer.serving_copy(), trainer.serving_copy()
    (trained_1, frozen_1), (trained_2, frozen_2) = split_trained(first), split_trained(second)
    assert all(a is b for a, b in zip(jax.tree.leaves(frozen_1), jax.tree.leaves(frozen_2), strict=True))
    assert not any(
        a is b for a, b in zip(jax.tree.leaves(trained_1), jax.tree.leaves(trained_2), strict=True)
    )
    jax.tree.map(lambda x: x.delete(), trainer.params)  # what the next update's donation does
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, second), want)
