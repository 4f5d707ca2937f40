"""The `lm` family's action grammar, and the tables that let a sampler emit only grammatical actions.

The model writes one action as text, then the tokenizer's end-of-turn token (eos):

    tap(N) | type("TEXT") | swipe(up|down|left|right) | back() | home() | enter() | done()

N is decimal without leading zeros and < n_elements; TEXT is 1..max_text_chars characters, none of them `"`,
`\\`, a control character or a line/paragraph separator. `parse` and `render` are the text level.

Constrained decoding works on tokens, and a token may span parts of an action (`tap`,`(`,`3`,`)`; `("`;
`")`; `()`), so `build_tables` walks each candidate token's characters through a character automaton of the
grammar, once per tokenizer, on the host. Its states: START, keyword prefixes (`t`, `ta`, `tap(`, `swipe(u`,
...), numbers (`tap(12` is num0 + 12, up to max_element), text (`type("ab` is text0 + 2, up to
max_text_chars), AFTER_QUOTE (`type("ab"`), ACCEPT (complete: only eos), END (after eos), DEAD.

Why sparse rows and dense features: outside TEXT a state admits a few first characters, so only a few tokens
of a 50k-150k vocabulary can follow it; each such state keeps a sparse row `ids/next_state/closes[S, K]`
(`closes`: the number a `)` inside the token closed, -1 none). Inside TEXT nearly every token is legal, and
whether it is depends only on how many characters it adds (`plain_len[V]`) or on whether it is characters
then `"` (then maybe `)`) (`close_len[V]`, `close_next[V]`), so text states use these per-token features
and their count. A dense [states x vocab] table would be about 1000 x 150k.

Budget and element count: `reach[S, f]` is the least n_elements for which the action can be completed from S
in at most f more tokens (eos included; BIG: never). A token into state T is allowed, with `remaining` tokens
left (this one included), iff reach[T, remaining - 1] <= n_elements and any number it closes is <
n_elements. Since reach[S, f] = min over tokens of max(closed + 1, reach[T, f - 1]), a state with reach[S,
remaining] <= n_elements always has an allowed token, and every allowed token keeps that property: a row that
starts at START with remaining >= finish[START] reaches END within its budget, whatever it samples.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from common.backbones.decoder.tokenizer import DecoderTokenizer
from common.types import ActionType, SwipeDirection

START, ACCEPT, END, DEAD, AFTER_QUOTE = 0, 1, 2, 3, 4
"""The fixed states; keyword prefixes, numbers and text states follow (see `GrammarTables`)."""

BIG = 1 << 30
"""'Never' in `reach`, `need`, `finish` and the token features (small sums of it stay in int32)."""

DEFAULT_MAX_ELEMENT = 999
"""The largest element number `tap(N)` can write (larger n_elements still allow only 0..999)."""

_KEYS = {
    ActionType.PRESS_BACK: "back()",
    ActionType.PRESS_HOME: "home()",
    ActionType.PRESS_ENTER: "enter()",
    ActionType.STATUS_COMPLETE: "done()",
}
_SWIPES = {f"swipe({d.name.lower()})": d for d in SwipeDirection}
_TAP_OPEN, _TYPE_OPEN = "tap(", 'type("'
_LITERALS = (_TAP_OPEN, _TYPE_OPEN, *_SWIPES, *_KEYS.values())
"""Every action starts with one of these; all but the two openers end the action."""
_TAP = re.compile(r"tap\((0|[1-9][0-9]*)\)")
_DIGITS = "0123456789"
_ASCII = "".join(chr(c) for c in range(32, 127))
"""Outside TEXT the grammar's characters are all printable ASCII."""
_ILLEGAL_CATEGORIES = frozenset({"Cc", "Cs", "Zl", "Zp"})


def legal_text_char(ch: str) -> bool:
    """Whether `ch` may appear in TEXT: not `"` or `\\` (no escapes in this grammar), no control character
    (newline included), surrogate, or line/paragraph separator."""
    return ch not in '"\\' and unicodedata.category(ch) not in _ILLEGAL_CATEGORIES


# ---- text level -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParsedAction:
    """One action as the grammar writes it."""

    kind: ActionType
    """Which action."""
    element: int | None = None
    """The element number of a tap (0-based, as the prompt numbers them), else None."""
    text: str | None = None
    """The text of a type action, else None."""
    direction: SwipeDirection | None = None
    """The direction of a swipe, else None."""


def render(action: ParsedAction) -> str:
    """The grammar's text of `action` (no eos); ValueError when a field its kind needs is missing."""
    if action.kind == ActionType.TAP and action.element is not None and action.element >= 0:
        return f"tap({int(action.element)})"
    if action.kind == ActionType.TYPE and action.text is not None:
        return f'type("{action.text}")'
    if action.kind == ActionType.SWIPE and action.direction is not None:
        return f"swipe({SwipeDirection(action.direction).name.lower()})"
    if action.kind in _KEYS:
        return _KEYS[action.kind]
    raise ValueError(f"the grammar has no text for {action}")


def parse(text: str, n_elements: int, max_text_chars: int) -> ParsedAction | None:
    """The action `text` writes, exactly (the caller removes one trailing eos; nothing else is stripped),
    or None when it is not one: `tap(03)`, `tap( 3)`, `tap(3) `, `type("")`, an element >= n_elements.
    Never raises on a str."""
    if not isinstance(text, str):
        return None
    if text in _SWIPES:
        return ParsedAction(ActionType.SWIPE, direction=_SWIPES[text])
    for kind, key in _KEYS.items():
        if text == key:
            return ParsedAction(kind)
    match = _TAP.fullmatch(text)
    if match:
        digits = match.group(1)
        if len(digits) > len(str(max(int(n_elements), 0))):  # also keeps int() below its digit limit
            return None
        element = int(digits)
        return ParsedAction(ActionType.TAP, element=element) if element < n_elements else None
    if text.startswith(_TYPE_OPEN) and text.endswith('")') and len(text) >= len(_TYPE_OPEN) + 2:
        body = text[len(_TYPE_OPEN) : -2]
        if 1 <= len(body) <= max_text_chars and all(legal_text_char(ch) for ch in body):
            return ParsedAction(ActionType.TYPE, text=body)
    return None


# ---- the character automaton ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Layout:
    """Where each kind of state lives in the state numbering."""

    prefixes: dict[str, int]
    """Keyword prefix -> state ("" is START; `tap(` is a prefix state, `type("` is text0)."""
    num0: int
    """The state of `tap(0`; `tap(N` is num0 + N."""
    text0: int
    """The state of `type("`; with c characters of TEXT, text0 + c."""
    max_element: int
    """The largest N."""
    max_text_chars: int
    """The most TEXT characters."""

    @property
    def num_states(self) -> int:
        return self.text0 + self.max_text_chars + 1


def _layout(max_element: int, max_text_chars: int) -> _Layout:
    words = sorted({lit[:i] for lit in _LITERALS for i in range(1, len(lit))} | {_TAP_OPEN})
    prefixes = {"": START} | {word: AFTER_QUOTE + 1 + i for i, word in enumerate(words)}
    num0 = AFTER_QUOTE + 1 + len(words)
    return _Layout(prefixes, num0, num0 + max_element + 1, max_element, max_text_chars)


def _step(layout: _Layout, words: dict[int, str], state: int, ch: str) -> tuple[int, int]:
    """The state after one more character, and the number a `)` closed (-1 none)."""
    if state in words:
        word = words[state]
        if word == _TAP_OPEN:
            return (
                (layout.num0 + int(ch), -1) if ch in _DIGITS and int(ch) <= layout.max_element else (DEAD, -1)
            )
        longer = word + ch
        if longer in layout.prefixes:
            return layout.prefixes[longer], -1
        if longer == _TYPE_OPEN:
            return layout.text0, -1
        return (ACCEPT, -1) if longer in _LITERALS else (DEAD, -1)
    if layout.num0 <= state < layout.text0:
        value = state - layout.num0
        if ch == ")":
            return ACCEPT, value
        more = 10 * value + int(ch) if ch in _DIGITS else BIG
        return (layout.num0 + more, -1) if value > 0 and more <= layout.max_element else (DEAD, -1)
    if layout.text0 <= state < layout.num_states:
        count = state - layout.text0
        if ch == '"':
            return (AFTER_QUOTE if count >= 1 else DEAD), -1
        fits = count < layout.max_text_chars and legal_text_char(ch)
        return (state + 1 if fits else DEAD), -1
    return (ACCEPT if state == AFTER_QUOTE and ch == ")" else DEAD), -1


def _walk(layout: _Layout, words: dict[int, str], state: int, text: str) -> tuple[int, int]:
    """The state after all of `text`, and the number closed on the way (-1 none)."""
    closed = -1
    for ch in text:
        state, shut = _step(layout, words, state, ch)
        if state == DEAD:
            return DEAD, -1
        closed = max(closed, shut)
    return state, closed


# ---- token tables (host side) -----------------------------------------------------------------------------


@dataclass(frozen=True)
class GrammarTables:
    """The grammar over one vocabulary, as numpy arrays (S states, V tokens); `to_jax()` for the device."""

    ids: np.ndarray
    """[S, K] int32: the tokens a non-text state allows by the grammar, -1 padded (text states: none)."""
    next_state: np.ndarray
    """[S, K] int32: the state after each of them (DEAD in padding)."""
    closes: np.ndarray
    """[S, K] int32: the element number a `)` inside the token closed, -1 none."""
    reach: np.ndarray
    """[S, F] int32: the least n_elements that lets the action finish from the state within f tokens (eos
    included), BIG when none does; the last column is the limit for any larger budget."""
    need: np.ndarray
    """[S] int32: the least n_elements with which the action can finish at all (1 for `tap(`, N+1 for
    `tap(N`, 0 for most, BIG for DEAD)."""
    finish: np.ndarray
    """[S] int32: the fewest tokens (eos included) that finish from the state with `need` elements; a row
    started at START with at least finish[START] tokens always ends in budget."""
    plain_len: np.ndarray
    """[V] int32: characters of a token made only of legal TEXT characters, BIG otherwise."""
    close_len: np.ndarray
    """[V] int32: legal TEXT characters before a token's closing `"` or `")` (its end), BIG otherwise."""
    close_next: np.ndarray
    """[V] int32: AFTER_QUOTE (`..."`), ACCEPT (`...")`), or DEAD."""
    eos_id: int
    """The token that ends an action."""
    layout: _Layout
    """Where the keyword, number and text states are (`prefix_state`, `num0`, `text0`)."""

    @property
    def vocab_size(self) -> int:
        return int(self.plain_len.shape[0])

    @property
    def num_states(self) -> int:
        return self.layout.num_states

    start, accept, end, dead, after_quote = START, ACCEPT, END, DEAD, AFTER_QUOTE

    @property
    def num0(self) -> int:
        """The state of `tap(0`; `tap(N` is num0 + N."""
        return self.layout.num0

    @property
    def text0(self) -> int:
        """The state of `type("`; c characters into TEXT is text0 + c."""
        return self.layout.text0

    def prefix_state(self, prefix: str) -> int | None:
        """The state of a keyword prefix (`""`, `t`, `tap(`, `swipe(u`, ...), None when it is not one."""
        return self.layout.prefixes.get(prefix)

    def to_jax(self) -> JaxGrammarTables:
        """The arrays `allowed` and `advance` read, as a pytree of jnp arrays."""
        i32 = lambda x: jnp.asarray(x, jnp.int32)  # noqa: E731
        return JaxGrammarTables(
            *(i32(getattr(self, name)) for name in JaxGrammarTables._fields[:7]),
            text0=i32(self.layout.text0),
            max_text_chars=i32(self.layout.max_text_chars),
            max_element=i32(self.layout.max_element),
        )


class JaxGrammarTables(NamedTuple):
    """`GrammarTables` on the device: what `allowed` and `advance` read (see its fields)."""

    ids: jax.Array
    next_state: jax.Array
    closes: jax.Array
    reach: jax.Array
    plain_len: jax.Array
    close_len: jax.Array
    close_next: jax.Array
    text0: jax.Array
    max_text_chars: jax.Array
    max_element: jax.Array


def token_texts(tokenizer: DecoderTokenizer, vocab_size: int | None = None) -> list[str | None]:
    """Each id's text as it reads inside generated text (leading spaces included), None for special tokens,
    partial UTF-8 bytes (U+FFFD) and empty texts; padded with None to `vocab_size` (the model's logits may
    outnumber the tokenizer's ids). Each id is decoded after an anchor token and the anchor's text removed,
    so a decoder that strips the first token's leading space (SentencePiece) still gives the true text."""
    inner = tokenizer.tokenizer
    size = inner.get_vocab_size(with_added_tokens=True)
    special = {i for i, added in inner.get_added_tokens_decoder().items() if added.special}
    anchor = inner.encode("a", add_special_tokens=False).ids[-1:]
    head = inner.decode(anchor, skip_special_tokens=False)
    decoded = inner.decode_batch([[*anchor, i] for i in range(size)], skip_special_tokens=False)
    texts: list[str | None] = [
        None if i in special or not text.startswith(head) else text[len(head) :]
        for i, text in enumerate(decoded)
    ]
    texts = [None if not text or "\ufffd" in text else text for text in texts]
    if vocab_size is not None:
        if vocab_size < size:
            raise ValueError(f"vocab_size {vocab_size} is smaller than the tokenizer's {size} ids")
        texts += [None] * (vocab_size - size)
    return texts


def build_tables(
    token_texts: Sequence[str | None],
    eos_id: int,
    max_text_chars: int,
    max_element: int = DEFAULT_MAX_ELEMENT,
) -> GrammarTables:
    """The grammar's tables over a vocabulary: token_texts[i] is token i's text (None: never allowed, as for
    special tokens; text with U+FFFD is treated as None); eos_id ends an action (its text is ignored)."""
    if not 0 <= eos_id < len(token_texts):
        raise ValueError(f"eos_id {eos_id} is outside the vocabulary of {len(token_texts)} tokens")
    if max_text_chars < 1 or max_element < 0:
        raise ValueError(
            f"max_text_chars must be >= 1 and max_element >= 0, got {max_text_chars}, {max_element}"
        )
    texts = [None if not text or "\ufffd" in text else text for text in token_texts]
    texts[eos_id] = None
    layout = _layout(max_element, max_text_chars)
    rows = _sparse_rows(layout, texts, eos_id)
    plain_len, close_len, close_next = _text_features(texts)
    reach = _reach(layout, rows, plain_len, close_len, close_next)
    need = reach[:, -1]
    finish = np.where(need < BIG, np.argmax(reach <= need[:, None], axis=1), BIG).astype(np.int32)
    ids, next_state, closes = _pad_rows(rows, layout.num_states)
    return GrammarTables(
        ids, next_state, closes, reach, need, finish, plain_len, close_len, close_next, eos_id, layout
    )


def _sparse_rows(layout: _Layout, texts: list[str | None], eos_id: int) -> list[list[tuple[int, int, int]]]:
    """Per non-text state, (token, next state, closed number) for every token the grammar allows there.
    Only tokens whose first character can follow the state are walked (tokens indexed by first character)."""
    by_first: dict[str, list[tuple[int, str]]] = {}
    for token, text in enumerate(texts):
        if text is not None and text[0] in _ASCII:
            by_first.setdefault(text[0], []).append((token, text))
    words = {state: word for word, state in layout.prefixes.items()}
    rows: list[list[tuple[int, int, int]]] = [[] for _ in range(layout.text0)]
    rows[ACCEPT] = [(eos_id, END, -1)]
    for state in range(layout.text0):
        if state in (ACCEPT, END, DEAD):
            continue
        for ch in _ASCII:
            if _step(layout, words, state, ch)[0] == DEAD:
                continue
            for token, text in by_first.get(ch, ()):
                after, closed = _walk(layout, words, state, text)
                if after != DEAD:
                    rows[state].append((token, after, closed))
    return rows


def _text_features(texts: list[str | None]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """plain_len, close_len, close_next (see `GrammarTables`)."""
    size = len(texts)
    plain_len, close_len = np.full(size, BIG, np.int32), np.full(size, BIG, np.int32)
    close_next = np.full(size, DEAD, np.int32)
    for token, text in enumerate(texts):
        if text is None:
            continue
        body, after = text, None
        if text.endswith('")'):
            body, after = text[:-2], ACCEPT
        elif text.endswith('"'):
            body, after = text[:-1], AFTER_QUOTE
        if not all(legal_text_char(ch) for ch in body):
            continue
        if after is None:
            plain_len[token] = len(body)
        else:
            close_len[token], close_next[token] = len(body), after
    return plain_len, close_len, close_next


def _edges(layout, rows, plain_len, close_len, close_next) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(from, to, closed number) of every distinct move: the sparse rows, and text moves by length."""
    moves = {(state, after, closed) for state, row in enumerate(rows) for _, after, closed in row}
    lengths = np.unique(plain_len[plain_len < BIG])
    closings = {(int(n), int(after)) for n, after in zip(close_len, close_next, strict=True) if n < BIG}
    top = layout.max_text_chars
    for count in range(top + 1):
        here = layout.text0 + count
        moves |= {(here, here + int(n), -1) for n in lengths if count + n <= top}
        moves |= {(here, after, -1) for n, after in closings if 1 <= count + n <= top}
    src, dst, closed = (np.array(column, np.int64) for column in zip(*sorted(moves), strict=True))
    return src, dst, closed


def _reach(layout, rows, plain_len, close_len, close_next) -> np.ndarray:
    """reach[S, f] (see `GrammarTables`): f = 0 only END finishes; then reach_f[S] = min over moves of
    max(closed + 1, reach_{f-1}[to]), until a column repeats (the limit)."""
    src, dst, closed = _edges(layout, rows, plain_len, close_len, close_next)
    column = np.full(layout.num_states, BIG, np.int64)
    column[END] = 0
    columns = [column]
    while True:
        previous = columns[-1]
        column = previous.copy()
        np.minimum.at(column, src, np.maximum(closed + 1, previous[dst]))
        if np.array_equal(column, previous):
            return np.stack(columns, axis=1).astype(np.int32)
        columns.append(column)


def _pad_rows(rows: list[list[tuple[int, int, int]]], num_states: int) -> tuple[np.ndarray, ...]:
    """The sparse rows as [S, K] arrays (text states get empty rows)."""
    width = max(1, max(len(row) for row in rows))
    ids = np.full((num_states, width), -1, np.int32)
    next_state = np.full((num_states, width), DEAD, np.int32)
    closes = np.full((num_states, width), -1, np.int32)
    for state, row in enumerate(rows):
        for k, (token, after, closed) in enumerate(row):
            ids[state, k], next_state[state, k], closes[state, k] = token, after, closed
    return ids, next_state, closes


# ---- device side: masks and transitions -------------------------------------------------------------------


def start_state(shape: tuple[int, ...] = ()) -> jax.Array:
    """START for a batch of rows."""
    return jnp.full(shape, START, jnp.int32)


def allowed(tables: JaxGrammarTables, state, n_elements, remaining) -> jax.Array:
    """bool [..., V]: the tokens that keep each row inside the grammar and let it finish (eos included)
    within `remaining - 1` further tokens (`remaining` counts this token), with any element number the
    token closes, and some number still reachable, < n_elements. ACCEPT allows only eos; END and DEAD
    nothing (the caller pads). Batches over the broadcast leading dims of the three arguments."""
    rows = _Rows.of(tables, state, n_elements, remaining)
    vocab = tables.plain_len.shape[0]
    picked = jnp.where(rows.sparse_ok(tables), tables.ids[rows.state], vocab)
    index = jnp.arange(rows.state.shape[0])[:, None]
    sparse = jnp.zeros((rows.state.shape[0], vocab), bool).at[index, picked].set(True, mode="drop")
    dense = rows.finishes(tables, _text_next(tables, rows.state[:, None], jnp.arange(vocab)[None, :]))
    return (sparse | dense).reshape(*rows.shape, vocab)


def token_allowed(tables: JaxGrammarTables, state, n_elements, remaining, token) -> jax.Array:
    """bool [...]: `allowed(tables, state, n_elements, remaining)[..., token]` without building the [..., V]
    mask (the learner checks stored actions with it). Batches over the broadcast dims of the arguments."""
    state, token = jnp.broadcast_arrays(jnp.asarray(state, jnp.int32), jnp.asarray(token, jnp.int32))
    rows = _Rows.of(tables, state, n_elements, remaining)
    vocab = tables.plain_len.shape[0]
    token = token.reshape(-1)
    sparse = jnp.any(rows.sparse_ok(tables) & (tables.ids[rows.state] == token[:, None]), axis=-1)
    after = _text_next(tables, rows.state[:, None], jnp.clip(token, 0, vocab - 1)[:, None])
    dense = rows.finishes(tables, after)[:, 0]
    return ((sparse | dense) & (token >= 0) & (token < vocab)).reshape(rows.shape)


class _Rows(NamedTuple):
    """`allowed`'s arguments broadcast and flattened to rows: state [R], elements and budget [R, 1]."""

    shape: tuple[int, ...]
    state: jax.Array
    elements: jax.Array
    budget: jax.Array

    @staticmethod
    def of(tables: JaxGrammarTables, state, n_elements, remaining) -> _Rows:
        state, n_elements, remaining = jnp.broadcast_arrays(
            jnp.asarray(state, jnp.int32),
            jnp.asarray(n_elements, jnp.int32),
            jnp.asarray(remaining, jnp.int32),
        )
        return _Rows(
            state.shape,
            jnp.clip(state.reshape(-1), 0, tables.reach.shape[0] - 1),
            jnp.clip(n_elements.reshape(-1), 0, tables.max_element + 1)[:, None],
            remaining.reshape(-1)[:, None] - 1,
        )

    def finishes(self, tables: JaxGrammarTables, after: jax.Array) -> jax.Array:
        """[R, X] whether each next state can still finish within the budget with these elements."""
        column = jnp.clip(self.budget, 0, tables.reach.shape[1] - 1)
        return (self.budget >= 0) & (tables.reach[after, column] <= self.elements)

    def sparse_ok(self, tables: JaxGrammarTables) -> jax.Array:
        """[R, X] which of each state's listed (sparse) tokens are allowed."""
        return self.finishes(tables, tables.next_state[self.state]) & (
            tables.closes[self.state] < self.elements
        )


def advance(tables: JaxGrammarTables, state, token) -> jax.Array:
    """int32 [...]: the state after `token` (DEAD when the grammar does not allow it there; the budget and
    element count are `allowed`'s business). Batches over the broadcast dims of state and token."""
    state, token = jnp.broadcast_arrays(jnp.asarray(state, jnp.int32), jnp.asarray(token, jnp.int32))
    vocab = tables.plain_len.shape[0]
    state = jnp.clip(state, 0, tables.reach.shape[0] - 1)
    match = tables.ids[state] == token[..., None]
    sparse = jnp.max(jnp.where(match, tables.next_state[state], -1), axis=-1)
    after = jnp.where(sparse >= 0, sparse, _text_next(tables, state, jnp.clip(token, 0, vocab - 1)))
    return jnp.where((token >= 0) & (token < vocab), after, DEAD)


def _text_next(tables: JaxGrammarTables, state, token) -> jax.Array:
    """The state after `token` from a text state (broadcast), DEAD from any other state."""
    count = state - tables.text0
    top = tables.max_text_chars
    plain = count + tables.plain_len[token]
    closing = count + tables.close_len[token]
    after = jnp.where(
        plain <= top,
        tables.text0 + plain,
        jnp.where((closing >= 1) & (closing <= top), tables.close_next[token], DEAD),
    )
    return jnp.where((count >= 0) & (count <= top), after, DEAD)
