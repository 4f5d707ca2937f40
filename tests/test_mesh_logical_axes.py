"""learner.training.sharding.param_specs on a policy that holds a pretrained decoder: every parameter that
names its logical axes is laid out by common/backbones/axes.py's rules (as the fine-tuned text encoder is),
the rest of the policy by learner.training.sharding's name patterns; "model" keeps only the 'model' splits,
"replicated" none. Abstract meshes: only shapes and names are read, nothing is placed."""

from __future__ import annotations

import jax
from flax import nnx
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

from common.backbones import axes
from common.backbones.decoder.config import DecoderConfig
from common.backbones.decoder.llama import Decoder
from common.backbones.decoder.lora import LoraConfig
from learner.training import mesh as M
from learner.training import sharding as S
from tests.decoder_reference import VARIANTS


class PolicyWithDecoder(nnx.Module):
    """A decoder plus a plain head without axis names (a stand-in for an LM policy's value head)."""

    def __init__(self, rngs: nnx.Rngs):
        cfg = DecoderConfig.from_dict(VARIANTS["qwen2_bias"], where="test")
        self.decoder = Decoder(cfg, rngs=rngs, lora=LoraConfig(rank=4))
        self.value_head = nnx.Linear(256, 256, rngs=rngs)


def flat_specs(tree) -> dict:
    leaves = jax.tree_util.tree_leaves_with_path(tree, is_leaf=lambda x: isinstance(x, P))
    return {S.param_name(path): spec for path, spec in leaves}


def test_a_decoder_inside_a_policy_is_laid_out_by_its_logical_axes():
    state = nnx.state(nnx.eval_shape(lambda: PolicyWithDecoder(nnx.Rngs(0))), nnx.Param)
    mesh = AbstractMesh((4, 2), M.AXES)
    got = flat_specs(S.param_specs(state, mesh, "fsdp"))
    want = flat_specs(axes.partition_specs(state["decoder"], mesh))
    decoder = {k[len("decoder/") :]: v for k, v in got.items() if k.startswith("decoder/")}
    assert decoder == want
    # vocab 64 over 'data'; the width 32 is not split a second time over 'data'
    assert got["decoder/embed_tokens/embedding"] == P("data", None)
    assert got["decoder/layers/0/mlp/gate_proj/kernel"] == P("data", "model")
    assert got["decoder/layers/0/self_attn/q_proj/lora_a"][0] == "data"  # the adapters follow their base
    # The head has no axis names: learner.training.mesh's own rule (FSDP: the largest dim over 'data').
    alone = flat_specs(S.param_specs({"value_head": state["value_head"]}, mesh, "fsdp"))
    assert got["value_head/kernel"] == alone["value_head/kernel"]


def test_model_mode_keeps_the_model_splits_and_replicated_none():
    state = nnx.state(nnx.eval_shape(lambda: PolicyWithDecoder(nnx.Rngs(0))), nnx.Param)
    mesh = AbstractMesh((4, 2), M.AXES)
    fsdp = flat_specs(S.param_specs(state, mesh, "fsdp"))
    model = flat_specs(S.param_specs(state, mesh, "model"))
    for name, spec in model.items():
        if name.startswith("decoder/"):
            assert spec == P(*(a if a == "model" else None for a in fsdp[name])), name
    assert model["decoder/layers/0/mlp/gate_proj/kernel"] == P(None, "model")
    replicated = flat_specs(S.param_specs(state, mesh, "replicated"))
    assert all(spec == P() for spec in replicated.values())
