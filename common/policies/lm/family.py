"""The language-model family (`--model.kind lm`): a pretrained decoder reads the screen as text and writes
its action in a small grammar (`tap(3)`, `type("Aiko")`, `swipe(down)`, `back()`, ...), trained by A-RIDE
on turns.

Observations are the prompt's token ids (common/policies/lm/prompt.py builds them on the actor, tokenising
each distinct line once; the learner never re-tokenises), left-padded to --model.lm-prompt-tokens, with
their length and the number of screen elements shown. A choice is the action's token ids, their number,
and each token's behaviour log-probability under the distribution it was drawn from (masked by the
grammar, over the temperature): the learner rebuilds the same mask from the stored tokens, so the step's
ratio is exactly 1 on-policy (common/policies/lm/network.py).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx

from common.backbones.decoder import snapshot as decoder_snapshot
from common.backbones.decoder.llama import Decoder, frozen_layers
from common.backbones.decoder.lora import HeadParam, LoraConfig
from common.backbones.decoder.tokenizer import DecoderTokenizer
from common.backbones.pretrained import load_pretrained
from common.config import ModelConfig
from common.policies.evaluation import Evaluation
from common.policies.family import Acted, DemoOracle, HostStep
from common.policies.lm import grammar, network, packing, segments
from common.policies.lm.demos import LMDemonstrator
from common.policies.lm.network import Decoding, LMAgent, actions_in_grammar, score_actions
from common.policies.lm.prompt import PromptBuilder
from common.policies.lm.trunk import TrunkCache
from common.protocol.episodes import EpisodeSpec
from common.types import Action, ActionType, Observation

PROMPT_QUANTUM = 64
"""An actor trims a batch's left padding to a multiple of this many tokens (few shapes, few compiles)."""
INVALID_NOTE = "invalid"
"""The history text of an action that did not parse (constraints off)."""


@functools.lru_cache(maxsize=4)
def _backbone(source: str):
    """(decoder config, tokenizer) of a checkpoint, read once per process (its weights are dropped)."""
    pretrained = load_pretrained(source)
    return pretrained.config, pretrained.require_tokenizer()


class LMPolicy:
    """The `lm` family; see the module docstring (and common.policies.family for the interface)."""

    noisy_demos = False
    """Its demonstrator is the oracle alone (--noise 0)."""

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg
        self._prompts: PromptBuilder | None = None

    # ---- what the checkpoint gives: config, tokenizer, grammar ------------------------------------------
    @property
    def tokenizer(self) -> DecoderTokenizer:
        return _backbone(self.cfg.backbone)[1]

    @property
    def vocab_size(self) -> int:
        return _backbone(self.cfg.backbone)[0].vocab_size

    @property
    def eos_id(self) -> int:
        ids = self.tokenizer.eos_ids
        if not ids:
            raise ValueError(f"{self.cfg.backbone}: its tokenizer names no end-of-turn token")
        return int(ids[0])

    @functools.cached_property
    def tables(self) -> grammar.GrammarTables:
        """The action grammar over this tokenizer's vocabulary (built once: seconds)."""
        texts = grammar.token_texts(self.tokenizer, self.vocab_size)
        return grammar.build_tables(texts, self.eos_id, self.cfg.lm_max_text_chars)

    @functools.cached_property
    def decoding(self) -> Decoding:
        """The grammar's tables as concrete device arrays (also when first asked for inside a trace,
        where they become constants of the compiled act or update), the end-of-turn id, temperature."""
        with jax.ensure_compile_time_eval():
            tables = self.tables.to_jax() if self.cfg.lm_constrained else None
        cfg = self.cfg
        return Decoding(
            tables, self.eos_id, float(cfg.lm_temperature), cfg.lm_constrained, cfg.lm_action_tokens
        )

    @property
    def prompts(self) -> PromptBuilder:
        if self._prompts is None:
            cfg = self.cfg
            self._prompts = PromptBuilder(self.tokenizer, cfg.lm_prompt_tokens, cfg.lm_history)
        return self._prompts

    def _lora(self) -> LoraConfig | None:
        cfg = self.cfg
        return LoraConfig(cfg.lora_rank, last_layers=cfg.lora_layers) if cfg.lora_rank else None

    # ---- the interface -----------------------------------------------------------------------------------
    def episode_spec(self) -> EpisodeSpec:
        cfg, vocab = self.cfg, self.vocab_size
        p, a = cfg.lm_prompt_tokens, cfg.lm_action_tokens
        return EpisodeSpec(
            observations={
                "prompt_ids": ((p,), "<i4"),
                "prompt_length": ((), "<i4"),
                "n_elements": ((), "<i4"),
            },
            choices={"action_tokens": ("<i4", vocab), "action_length": ("<i4", a + 1)},
            id_ranges={"prompt_ids": (0, vocab), "prompt_length": (1, p + 1), "n_elements": (0, p + 1)},
            choice_shapes={"action_tokens": (a,)},
            step_logps={"token_logp": (a,)},
            step_check=self._in_grammar if cfg.lm_constrained else None,
        )

    def _in_grammar(self, steps: dict[str, np.ndarray], acted_obs: dict[str, np.ndarray]) -> np.ndarray:
        """bool [N]: whether each step's action is one the constrained sampler can write on its prompt
        (network.actions_in_grammar); rows padded to a power of two, so few shapes compile."""
        tokens, n = steps["action_tokens"], steps["action_tokens"].shape[0]
        size = max(64, 1 << (n - 1).bit_length())

        def padded(x: np.ndarray) -> np.ndarray:
            return np.concatenate([x, np.zeros((size - n, *x.shape[1:]), x.dtype)])

        ok = actions_in_grammar(
            self.decoding.tables,
            padded(tokens),
            padded(steps["action_length"]),
            padded(acted_obs["n_elements"]),
        )
        return np.asarray(ok)[:n]

    def input_spec(self):
        return dict(self.episode_spec().observations)

    def host_inputs(self, graphdef, cache_bytes: int) -> HostStep | None:
        """The update's rows packed (packing.py): step rows with their gradient, final rows forward only,
        their real tokens end to end (segments.py), the shared preamble cut and run once; with LoRA below
        the top blocks and `cache_bytes` > 0, the frozen blocks' output from the cache (trunk.py). None in
        a multi-process learner, where every process would have to agree on the shape (it trains on the
        padded rows there)."""
        if jax.process_count() > 1:
            return None
        frozen = frozen_layers(self._lora(), _backbone(self.cfg.backbone)[0].num_hidden_layers)
        trunk = (
            TrunkCache(graphdef, cache_bytes, PROMPT_QUANTUM, self.prompts.preamble)
            if frozen and cache_bytes > 0
            else None
        )
        return _Packing(trunk, self.prompts.preamble)

    def update_shapes(self, max_steps: int) -> int:
        """The most update shapes packing gives for --max-steps `max_steps`: the packed step rows per
        episode (at most T) times the final rows' widths, twice (with and without the shared preamble:
        prompts from another builder stay whole). The learner compiles each as a batch first has it
        (family.ShapedUpdates), and reports how many it did."""
        longest = self.cfg.lm_prompt_tokens + self.cfg.lm_action_tokens
        steps = segments.bound(longest, segments.SEGMENT_WIDTH, PROMPT_QUANTUM, max_steps)
        return 2 * steps * segments.final_widths(self.cfg.lm_prompt_tokens, PROMPT_QUANTUM)

    def featurize(self, obs: Observation, history: Sequence[Action] = ()) -> dict[str, np.ndarray]:
        """The prompt of `obs` with the episode's recent actions, left-padded to the budget."""
        prompt = self.prompts.build(obs, [a.note or INVALID_NOTE for a in history])
        ids = np.zeros(self.cfg.lm_prompt_tokens, np.int32)
        n = len(prompt.ids)
        ids[ids.shape[0] - n :] = prompt.ids
        return {
            "prompt_ids": ids,
            "prompt_length": np.int32(n),
            "n_elements": np.int32(prompt.n_elements),
        }

    def inputs(self, features: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The batch with the preamble every prompt starts with cut from it (`prefix_ids` [P]: `prefill`
        computes it once for all rows) and the common left padding trimmed to a multiple of
        PROMPT_QUANTUM. A single row, or prompts from another builder (not starting with it), stay whole:
        one row has nothing to share, and its prefill in two passes measured slower (BENCHMARKS.md)."""
        preamble = self.prompts.preamble
        cut = packing.cut_prefix(features["prompt_ids"], features["prompt_length"], preamble, PROMPT_QUANTUM)
        if cut is not None and features["prompt_ids"].shape[0] > 1:
            ids, rest = cut
            return {**features, "prompt_ids": ids, "prompt_length": rest, "prefix_ids": preamble}
        return whole_inputs(features)

    def create(self, seed: int):
        pretrained = load_pretrained(self.cfg.backbone, lora=self._lora(), seed=seed)
        agent = LMAgent(pretrained.model, HeadParam if self.cfg.lora_rank else nnx.Param)
        return nnx.split(agent)

    def abstract(self):
        config = _backbone(self.cfg.backbone)[0]
        head = HeadParam if self.cfg.lora_rank else nnx.Param
        lora = self._lora()
        return nnx.split(nnx.eval_shape(lambda: LMAgent(Decoder(config, rngs=nnx.Rngs(0), lora=lora), head)))

    def act(self, graphdef, params, inputs, key, greedy: bool) -> Acted:
        return self.decode(graphdef, params, inputs, self.prefill(graphdef, params, inputs), key, greedy)

    def prefill(self, graphdef, params, inputs) -> network.Prefilled:
        """The decoder over the prompts (act's first stage, common.policies.family.StagedAct)."""
        agent = nnx.merge(graphdef, params)
        return network.prefill(
            agent, inputs["prompt_ids"], inputs["prompt_length"], self.decoding.action_tokens,
            inputs.get("prefix_ids"),
        )  # fmt: skip

    def decode(self, graphdef, params, inputs, prefilled, key, greedy: bool) -> Acted:
        """The action decoded from the prefilled prompts (act's second stage)."""
        shared = 0 if "prefix_ids" not in inputs else inputs["prefix_ids"].shape[-1]
        s = network.decode(
            nnx.merge(graphdef, params),
            self.decoding,
            prefilled,
            inputs["prompt_length"] + shared,  # the positions count the prefix
            inputs["n_elements"],
            key,
            greedy,
        )
        choice = {"action_tokens": s.tokens, "action_length": s.length, "token_logp": s.token_logp}
        return Acted(choice, s.token_logp.sum(-1), s.value, s.entropy)

    def evaluate(self, graphdef, params, obs, choice, acted_obs) -> Evaluation:
        """Every step's action scored in one forward pass (network.score_actions); the learner does not
        augment this family's observations, so the ratio's log-prob is the same, without gradient."""
        scored = score_actions(nnx.merge(graphdef, params), self.decoding, obs, choice)
        return Evaluation(scored.logp, scored.entropy, scored.values, jax.lax.stop_gradient(scored.logp))

    def loaded(self, params) -> None:
        pass

    def write_decoder(self, graphdef, params, path: Path) -> int:
        """The decoder's trained parameters (its adapters with LoRA; the value head stays in the checkpoint)
        as a snapshot `python -m learner export` turns into a Hugging Face folder; its size in bytes."""
        source = self.cfg.backbone
        base = str(Path(source).resolve()) if Path(source).exists() else source  # "default" stays a name
        decoder = nnx.merge(graphdef, params).decoder
        return decoder_snapshot.write(path, decoder, base, self._lora(), "float32")

    def action_text(self, choice: dict[str, Any]) -> str:
        """The action's text as generated, without its end-of-turn token."""
        tokens = [int(t) for t in np.asarray(choice["action_tokens"])[: int(choice["action_length"])]]
        if tokens and tokens[-1] == self.eos_id:
            tokens = tokens[:-1]
        return self.tokenizer.decode(tokens)

    def demonstrator(self, oracle: DemoOracle, noise: float, rng: np.random.Generator) -> LMDemonstrator:
        """The oracle's actions in the grammar (demos.py); `noise` must be 0 (`noisy_demos`)."""
        return LMDemonstrator(oracle, self.demo_choice)

    def demo_choice(self, obs: Observation, n_elements: int, action: Action) -> dict[str, Any] | None:
        """The choice that writes `action` (a demonstrator's) on `obs` of whose elements the prompt shows
        `n_elements`: its grammar text's tokens and end-of-turn, log-probs 0 (the demonstrator's own);
        None when the grammar cannot write it (a tap on an element not shown, text too long or with a
        quote) or it takes more than --model.lm-action-tokens tokens."""
        parsed = _parsed(obs, n_elements, action, self.cfg.lm_max_text_chars)
        if parsed is None:
            return None
        text = grammar.render(parsed)
        ids = [*self.tokenizer.tokenizer.encode(text, add_special_tokens=False).ids, self.eos_id]
        width = self.cfg.lm_action_tokens
        if len(ids) > width:
            return None
        return {
            "action_tokens": [*ids, *[0] * (width - len(ids))],
            "action_length": len(ids),
            "token_logp": [0.0] * width,
        }

    def to_action(self, obs: Observation, choice: dict[str, Any]) -> Action:
        """The parsed action on `obs` (its `note` the canonical text); an action that does not parse
        (possible with constraints off) is a no-op noted INVALID_NOTE."""
        parsed = grammar.parse(self.action_text(choice), len(obs.elements), self.cfg.lm_max_text_chars)
        if parsed is None:
            return Action(ActionType.NOOP, note=INVALID_NOTE)
        note = grammar.render(parsed)
        if parsed.kind == ActionType.TAP:
            x, y = _center(obs.elements[parsed.element], obs.screen_size)
            return Action(ActionType.TAP, x=x, y=y, note=note)
        if parsed.kind == ActionType.TYPE:
            return Action(ActionType.TYPE, text=parsed.text, note=note)
        if parsed.kind == ActionType.SWIPE:
            return Action(ActionType.SWIPE, direction=parsed.direction, note=note)
        return Action(parsed.kind, note=note)


def whole_inputs(features: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A batch of whole prompts with their common left padding trimmed to a multiple of PROMPT_QUANTUM."""
    width = features["prompt_ids"].shape[-1]
    keep = min(width, packing.quantized(int(np.max(features["prompt_length"], initial=1)), PROMPT_QUANTUM))
    return {**features, "prompt_ids": features["prompt_ids"][..., width - keep :]}


class _Packing:
    """The lm family's host step (`LMPolicy.host_inputs`): pick the rows that matter (packing.pack), lay
    them out as sequences end to end (segments.py) with the preamble every prompt shares cut and computed
    once, and their frozen trunk from the cache when kept."""

    def __init__(self, trunk: TrunkCache | None, preamble: np.ndarray):
        self.trunk = trunk
        self.preamble = preamble

    def __call__(self, obs, acted_obs, choice, params):
        packed = packing.pack(obs)
        states = None if self.trunk is None else self.trunk.row_states(packed, choice, params)
        return segments.packed_sequences(packed, choice, self.preamble, PROMPT_QUANTUM, states), acted_obs

    def stats(self) -> dict[str, float]:
        return {} if self.trunk is None else self.trunk.stats()


def _center(element, screen_size: tuple[int, int]) -> tuple[float, float]:
    cx, cy = element.center
    return cx / screen_size[0], cy / screen_size[1]


def _parsed(obs: Observation, n_elements: int, action: Action, max_chars: int) -> grammar.ParsedAction | None:
    """`action` in the grammar's terms on `obs`, None when it cannot be written."""
    kind = action.type
    if kind == ActionType.TAP:
        point = (round(action.x * obs.screen_size[0]), round(action.y * obs.screen_size[1]))
        shown = [i for i, el in enumerate(obs.elements[:n_elements]) if el.center == point]
        return grammar.ParsedAction(kind, shown[0], None, None) if shown else None
    if kind == ActionType.TYPE:
        parsed = grammar.ParsedAction(kind, None, action.text, None)
        return parsed if grammar.parse(grammar.render(parsed), n_elements, max_chars) == parsed else None
    if kind == ActionType.SWIPE:
        return grammar.ParsedAction(kind, None, None, action.direction)
    if kind == ActionType.NOOP:
        return None
    return grammar.ParsedAction(kind, None, None, None)
