"""The LM policy's prompt: (instruction, screen elements, recent actions) -> token ids within a budget.

The system turn is the grammar line (the actions the model may answer with); the user message is one line
per part, each ending in a newline:
    `Task: <instruction>`,
    `Previous actions: <the last `history` actions, comma separated>` (or `none`; no line when history is 0),
    `Screen:`, then one line per element, `[i] label (description) hint: .. #id kind flags`
    (`PromptBuilder.element_line`).
With a chat template the prompt is the template applied to the system turn and that message with the
assistant turn opened (what `DecoderTokenizer.chat_prompt` renders; a template without a system turn gets
the grammar as the message's first line); without one it is the grammar line, the message and `Action: `.

Ids are built piece by piece so that the actor, which builds a prompt every step, tokenises each distinct
line once: the template's text before and after the user message is tokenised once (rendered around a
sentinel message and split there), every line is looked up in an LRU cache (line -> ids), and the prompt is
their concatenation. Lines end in a newline, so a piece boundary falls where the pre-tokenizer cuts anyway.
Special tokens' text inside a line (a screen showing '<|im_end|>') is tokenised as plain text.

Cut rule, so that len(ids) <= max_tokens always:
1. the fixed parts come first and are never cut: the template's parts with the grammar (or bos, the grammar
   line and `Action: `), the history line and the `Screen:` line;
2. the instruction line is cut to at most max_tokens // 3 tokens;
3. each element line is cut to max_line_tokens tokens (a cut line keeps its closing newline);
4. element lines are added in tree order while they fit, at most max_elements of them; the first that does
   not fit and all after it are dropped. `Prompt.n_elements` counts the shown ones (`tap(N)` needs
   N < n_elements, so a dropped element cannot be tapped) and `Prompt.cut_elements` the dropped ones.
A budget that cannot hold the fixed parts, the cut instruction and the first element line is a ValueError.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from common.backbones.checkpoint import CheckpointError
from common.backbones.decoder.tokenizer import DecoderTokenizer
from common.types import Observation, UIElement

GRAMMAR_LINE = (
    'You operate an Android phone. Answer with one action: tap(N) taps element [N], type("text") types into '
    "the focused field, swipe(up|down|left|right), back(), home(), enter(), done() when the task is complete."
)
"""The role and grammar: the system turn of every prompt (the first line without one)."""
CLASS_WORDS = {"TextView": "", "ImageView": ""}
"""An element's kind by its class's last name where it is not that name lowercased: none for the commonest
(a label says as much)."""
NO_TEMPLATE_SUFFIX = "Action: "
"""What follows the user message when the tokenizer has no chat template: the answer starts after it."""
_SENTINEL = "\ue000PROMPT\ue000"
"""A user message no real prompt contains (private-use characters), rendered to split the template."""


@dataclass(frozen=True)
class Prompt:
    """One step's prompt, ready to be left-padded to the budget by the learner."""

    ids: np.ndarray
    """int32 [n], n <= max_tokens: the prompt's token ids, not padded."""
    n_elements: int
    """Element lines shown, numbered 0..n_elements-1 (the elements `tap(N)` may name)."""
    cut_elements: int
    """Elements of the screen that were not shown (they did not fit or passed max_elements)."""


def render_history(actions: Sequence[str], k: int) -> str:
    """The last `k` actions, oldest first, comma separated; `none` when there are none to show."""
    shown = list(actions)[-k:] if k > 0 else []
    return ", ".join(shown) if shown else "none"


def one_line(text: str) -> str:
    """`text` with every run of whitespace (newlines included) as one space: a part must stay on its line."""
    return " ".join(text.split())


class PromptBuilder:
    """Builds the LM policy's prompt ids for one observation (the module docstring gives the layout and
    the cut rule); one builder per actor, since its cache is what makes a step's prompt cheap."""

    def __init__(
        self,
        tokenizer: DecoderTokenizer,
        max_tokens: int,
        history: int,
        max_line_tokens: int = 32,
        max_elements: int = 64,
        cache_size: int = 20000,
    ):
        for name, value, least in (
            ("max_tokens", max_tokens, 1),
            ("history", history, 0),
            ("max_line_tokens", max_line_tokens, 2),
            ("max_elements", max_elements, 1),
            ("cache_size", cache_size, 1),
        ):
            if value < least:
                raise ValueError(f"PromptBuilder: {name} must be at least {least}, got {value}")
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        self.history = history
        self.max_line_tokens = max_line_tokens
        self.max_elements = max_elements
        self.cache_size = cache_size
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._prefix, self._suffix = self._template_parts()
        self._newline = self._plain_ids("\n")
        self._check_budget()

    @property
    def preamble(self) -> np.ndarray:
        """The ids every prompt starts with (the template's opening with the grammar in it): the learner
        computes them once per update for all rows (segments.packed_sequences)."""
        return self._prefix

    def build(self, obs: Observation, history: Sequence[str]) -> Prompt:
        """The prompt for `obs`, given the episode's past actions in the grammar (oldest first)."""
        fixed = self._fixed_parts(obs.instruction, history)
        room = self.max_tokens - sum(len(ids) for ids in fixed) - len(self._suffix)
        if room < 0:
            raise ValueError(
                f"PromptBuilder: max_tokens={self.max_tokens} cannot hold the prompt's fixed parts "
                f"({self.max_tokens - room} tokens with this history); raise the budget or shorten the history"
            )
        shown = self._element_lines(obs.elements, room)
        ids = np.concatenate([*fixed, *shown, self._suffix]).astype(np.int32, copy=False)
        return Prompt(ids=ids, n_elements=len(shown), cut_elements=len(obs.elements) - len(shown))

    def _fixed_parts(self, instruction: str, history: Sequence[str]) -> list[np.ndarray]:
        """The template's opening (the grammar in it), task (cut to a third of the budget), history and
        `Screen:`."""
        parts = [self._prefix]
        parts.append(self._cut(self._line(f"Task: {one_line(instruction)}"), self.max_tokens // 3))
        if self.history > 0:
            parts.append(self._line(f"Previous actions: {render_history(history, self.history)}"))
        parts.append(self._line("Screen:"))
        return parts

    def element_line(self, index: int, el: UIElement) -> str:
        """One element as the model reads it: `[i] label (description) hint: .. #id kind flags`, empty parts
        left out. The resource id only for an element with no text, description or hint (otherwise it
        repeats the label: `#icon` on every launcher icon); the kind from the class, none for the commonest
        (TextView, ImageView), `field` for an EditText; flags only when true. 28% fewer tokens per line
        than the `| desc: .. | id: .. | Class` layout it replaced, for the same facts
        (BENCHMARKS.md "LM prompt")."""
        text, desc, hint = one_line(el.text), one_line(el.content_desc), one_line(el.hint)
        short_class = el.cls.rsplit(".", 1)[-1]
        kind = "field" if "EditText" in short_class else CLASS_WORDS.get(short_class, short_class.lower())
        resource = el.resource_id.split(":id/", 1)[-1]
        parts = [
            f"[{index}]",
            text,
            (f"({desc})" if text else desc) if desc and desc != text else "",
            f"hint: {hint}" if hint else "",
            f"#{resource}" if resource and not (text or desc or hint) else "",
            kind,
            *flags(el),
        ]
        return " ".join(part for part in parts if part)

    def _element_lines(self, elements: Sequence[UIElement], room: int) -> list[np.ndarray]:
        """The element lines, each cut to max_line_tokens, in tree order while they fit in `room`."""
        shown: list[np.ndarray] = []
        for index, el in enumerate(elements[: self.max_elements]):
            ids = self._cut(self._line(self.element_line(index, el)), self.max_line_tokens)
            if len(ids) > room:
                if not shown:
                    raise ValueError(
                        f"PromptBuilder: max_tokens={self.max_tokens} cannot hold the prompt's fixed parts "
                        f"and one element line (the first needs {len(ids)} tokens, {room} are left); raise "
                        "the budget or shorten the history"
                    )
                break
            shown.append(ids)
            room -= len(ids)
        return shown

    def _line(self, text: str) -> np.ndarray:
        """The ids of `text` + newline, from the LRU cache (tokenised on a miss)."""
        line = text + "\n"
        ids = self._cache.get(line)
        if ids is not None:
            self._cache.move_to_end(line)
            return ids
        with _specials_as_text(self.tokenizer):
            ids = self._plain_ids(line)
        self._cache[line] = ids
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return ids

    def _cut(self, ids: np.ndarray, limit: int) -> np.ndarray:
        """A line's ids cut to `limit` tokens, its closing newline kept."""
        if len(ids) <= limit:
            return ids
        return np.concatenate([ids[: limit - len(self._newline)], self._newline])

    def _plain_ids(self, text: str) -> np.ndarray:
        """The ids of a piece inside the prompt: a bos that `encode` puts first belongs to the prompt's
        start, not to every piece, so it is taken off again."""
        tok = self.tokenizer
        ids = tok.encode(text)
        bos_text = tok.token(tok.bos_id) if tok.bos_id is not None else None
        if tok.add_bos and ids[:1] == [tok.bos_id] and not (bos_text and text.startswith(bos_text)):
            ids = ids[1:]
        return _frozen(ids)

    def _template_parts(self) -> tuple[np.ndarray, np.ndarray]:
        """The ids before and after the user message: the chat template rendered around a sentinel with the
        grammar as its system turn (in place of the model's default system message: SmolLM2's costs 19
        tokens and says nothing about the task) and split there; a template without a system turn gets the
        grammar as the user message's first line. Without a template: bos when the tokenizer adds one and
        the grammar line, then `Action: `."""
        tok = self.tokenizer
        grammar = self._plain_ids(GRAMMAR_LINE + "\n")
        if tok.chat_template is None:
            bos = [tok.bos_id] if tok.add_bos else []
            return _frozen([*bos, *grammar]), self._plain_ids(NO_TEMPLATE_SUFFIX)
        try:
            before, after = self._split(tok.chat_prompt(_SENTINEL, system=GRAMMAR_LINE))
        except CheckpointError:  # the template refuses a system turn
            before, after = self._split(tok.chat_prompt(_SENTINEL))
            return _frozen([*tok.encode(before), *grammar]), self._plain_ids(after)
        return _frozen(tok.encode(before)), self._plain_ids(after)

    def _split(self, rendered: str) -> tuple[str, str]:
        if rendered.count(_SENTINEL) != 1:
            raise ValueError(
                f"{self.tokenizer.where}: the chat template does not show the user message verbatim once, "
                "so the prompt cannot be split around it"
            )
        before, after = rendered.split(_SENTINEL)
        return before, after

    def _check_budget(self) -> None:
        """Fail at construction when the budget cannot hold the fixed parts, a one-word task and a full
        element line: a step would fail on any screen."""
        least = (
            len(self._prefix)
            + len(self._suffix)
            + len(self._line("Task: x"))
            + (len(self._line("Previous actions: none")) if self.history > 0 else 0)
            + len(self._line("Screen:"))
            + self.max_line_tokens
        )
        if least > self.max_tokens:
            raise ValueError(
                f"PromptBuilder: max_tokens={self.max_tokens} cannot hold the prompt's fixed parts and one "
                f"element line of max_line_tokens={self.max_line_tokens} ({least} tokens); raise the budget"
            )


@contextmanager
def _specials_as_text(tokenizer: DecoderTokenizer):
    """Special tokens written in screen text ('<|im_end|>') tokenised as plain text while a line is
    encoded, so that a screen cannot end the user turn or open another one."""
    inner = tokenizer.tokenizer
    before = inner.encode_special_tokens
    inner.encode_special_tokens = True
    try:
        yield
    finally:
        inner.encode_special_tokens = before


def flags(el: UIElement) -> list[str]:
    """The element's states that are on, by name (checked, focused, scrollable, clickable)."""
    states = (("checked", el.checked), ("focused", el.focused), ("scrollable", el.scrollable))
    return [name for name, on in (*states, ("clickable", el.clickable)) if on]


def _frozen(ids: Sequence[int]) -> np.ndarray:
    """int32 ids that a cache hit can hand out without a copy (read-only, so nobody edits the cache)."""
    array = np.asarray(ids, dtype=np.int32)
    array.flags.writeable = False
    return array
