"""SimPhone success predicates: every literal, operator, path form, quantifier and error of the language.

The property tests compare the compiled evaluator against a direct Python reference on random flat
states, and check that evaluation never raises whatever the state looks like.
"""

from __future__ import annotations

import operator
import pickle
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.envs.simphone.expr import MISSING, Predicate, PredicateError, compile_predicate

STATE: dict[str, Any] = {
    "settings": {
        "wifi": True,
        "bluetooth": False,
        "airplane_mode": False,
        "dark_theme": False,
        "brightness": 40,
    },
    "clock": {"alarms": [{"time": "15:00", "label": "Gym", "enabled": True}]},
    "contacts": [{"name": "Ada Lovelace", "phone": "555-0100"}],
    "messages": [{"to": "Ada Lovelace", "text": "hello"}, {"to": "Bob", "text": "bye"}],
    "browser": {
        "url": "newegg.com",
        "query": "macbook air",
        "tabs": [{"url": "a.com", "incognito": False}, {"url": "b.com", "incognito": False}],
        "history": ["Chile weather", "tokyo"],
    },
    "shop": {
        "cart": [{"name": "MacBook Air 13", "price": 999.0}, {"name": "Mouse", "price": 25}],
        "page": "product",
    },
    "app": "Settings",
    "nothing": None,
    "empty": [],
    "odd": {"Wi-Fi": "on", "in": 1, "quote": 'say "hi"', "apos": "it's", "backslash": "a\\b"},
    "groups": [{"members": [{"n": "a"}, {"n": "b"}]}, {"members": [{"n": "c"}]}, {"other": 1}],
    "chats": [{"with": "Ada", "msgs": [{"text": "hi"}, {"text": "bye"}]}, {"with": "Bob", "msgs": []}],
    "matrix": [[1, 2], [3]],
    "nums": [1, 2, 3, 4],
}


def ev(text: str, state: Any = STATE) -> bool:
    result = compile_predicate(text).evaluate(state)
    assert type(result) is bool
    return result


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # literals: ints, floats, exponents, negatives, strings in both quotes, true/false/null
        ("settings.brightness == 40", True),
        ("settings.brightness == 40.0", True),
        ("settings.brightness == 4e1", True),
        ("settings.brightness == 41", False),
        ("shop.cart[0].price == 999", True),
        ("-1 < settings.brightness", True),
        ("settings.brightness > -41.5", True),
        ("settings.brightness < -1", False),
        ("app == 'Settings'", True),
        ('app == "Settings"', True),
        ('app == "settings"', False),
        ("settings.wifi == true", True),
        ("settings.bluetooth == false", True),
        ("settings.wifi == false", False),
        ("nothing == null", True),
        ("app == null", False),
        ("true", True),
        ("false", False),
        # booleans are not numbers, also inside containers
        ("settings.wifi == 1", False),
        ("settings.wifi != 1", True),
        ("settings.bluetooth == 0", False),
        # every comparison operator, on numbers and on strings, both outcomes
        ("settings.brightness != 40", False),
        ("settings.brightness != 39", True),
        ("settings.brightness < 41", True),
        ("settings.brightness < 40", False),
        ("settings.brightness <= 40", True),
        ("settings.brightness <= 39.9", False),
        ("settings.brightness > 39", True),
        ("settings.brightness > 40", False),
        ("settings.brightness >= 40", True),
        ("settings.brightness >= 40.1", False),
        ('clock.alarms[0].time < "16:00"', True),
        ('clock.alarms[0].time >= "16:00"', False),
        ('"apple" < "banana"', True),
        # ordering across types is false, never an error at run time
        ("app < 3", False),
        ("app >= 3", False),
        ("settings.wifi > 0", False),
        ("nothing < 1", False),
        # in / contains: substrings of strings and members of lists
        ('"mac" in browser.query', True),
        ('"MAC" in browser.query', False),
        ('"tokyo" in browser.history', True),
        ('"Chile" in browser.history', False),
        ('browser.query contains "air"', True),
        ('browser.query contains "pro"', False),
        ('browser.history contains "Chile weather"', True),
        ('browser.history contains "Chile"', False),
        ("nums contains 3.0", True),
        ("nums contains true", False),
        ('"wifi" in settings', False),
        ("1 in app", False),
        ('settings.brightness in "4040"', False),
        ('"4040" contains settings.brightness', False),
        ("app contains nothing", False),
        ('settings contains "wifi"', False),
        # lower
        ('lower(shop.cart[0].name) == "macbook air 13"', True),
        ('lower(browser.history) contains "chile weather"', True),
        ('lower(browser.history) contains "Chile weather"', False),
        ("lower(settings.brightness) == 40", False),
        ("lower(settings.brightness) != 40", True),
        # len
        ("len(contacts) == 1", True),
        ("len(app) == 8", True),
        ("len(empty) == 0", True),
        ("len(settings.brightness) == 0", False),
        ("len(settings) == 5", False),
        ("len(nowhere) >= 0", False),
        # deep equality between paths
        ("contacts == contacts", True),
        ("contacts[0] == contacts[-1]", True),
        ("messages[0] == messages[1]", False),
        ("settings == settings", True),
    ],
)
def test_literals_and_operators(text: str, expected: bool) -> None:
    assert ev(text) is expected


def test_equality_is_deep_and_keeps_booleans_apart_from_numbers() -> None:
    state = {
        "a": [1, True, {"x": None}],
        "b": [1.0, True, {"x": None}],
        "c": [1, 1, {"x": None}],
        "d": {"k": 1},
    }
    assert ev("a == b", state)
    assert not ev("a == c", state)
    assert not ev("a == d", state)
    assert ev("d == d", state)
    assert not ev("d == a[2]", state)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('odd.quote == "say \\"hi\\""', True),
        ("odd.quote == 'say \"hi\"'", True),
        ("odd.apos == 'it\\'s'", True),
        ('odd.apos == "it\\\'s"', True),
        ('odd.backslash == "a\\\\b"', True),
        ("odd.backslash == 'a\\\\b'", True),
        ('odd.backslash == "ab"', False),
        ('"" in app', True),
        ('"and or not" == "and or not"', True),
    ],
)
def test_string_escapes(text: str, expected: bool) -> None:
    assert ev(text) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('contacts[0].name == "Ada Lovelace"', True),
        ('messages[-1].text == "bye"', True),
        ('messages[-2].text == "hello"', True),
        ("messages[2].text == null", False),
        ("messages[-3].text != null", True),
        ('odd["Wi-Fi"] == "on"', True),
        ("odd['Wi-Fi'] == 'on'", True),
        ("odd.in == 1", True),
        ('settings ["wifi"] == true', True),
        ("matrix[1][0] == 3", True),
        ("matrix[0][-1] == 2", True),
        # stepping through the wrong type gives MISSING, not an exception
        ("app.name == null", False),
        ("settings[0] == null", False),
        ("contacts.name == null", False),
        ("nums[0].x == null", False),
        # wildcards, nested wildcards flatten, elements without the rest of the path are skipped
        ('"Ada Lovelace" in contacts[*].name', True),
        ('"c" in groups[*].members[*].n', True),
        ("len(groups[*].members[*].n) == 3", True),
        ("len(groups[*].members) == 2", True),
        ("len(nowhere[*].x) == 0", True),
        ("len(matrix[*]) == 2", True),
        ("len(matrix[*][*]) == 3", True),
        # a wildcard on the left means "some element"
        ('groups[*].members[*].n == "b"', True),
        ('groups[*].members[*].n == "z"', False),
        ('browser.tabs[*].url == "b.com"', True),
        ('browser.tabs[*].url != "a.com"', True),
        ('clock.alarms[*].label != "Gym"', False),
        ('lower(contacts[*].name) == "ada lovelace"', True),
        ('contacts[*].name contains "Love"', True),
        ('contacts[*].name in "Ada Lovelace, Bob"', True),
        ("matrix[*] contains 3", True),
        ("matrix[*][*] >= 3", True),
        ("matrix[*][*] > 3", False),
        ("empty[*] == null", False),
        ("empty[*] != null", False),
        ("not (browser.tabs[*].incognito == true)", True),
        ("clock.alarms[*].enabled", True),
        ("browser.tabs[*].incognito", False),
        ("(groups[*].members[*].n) == 'a'", True),
    ],
)
def test_paths(text: str, expected: bool) -> None:
    assert ev(text) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("nope == 1", False),
        ("nope != 1", True),
        ("nope == null", False),
        ("nope == nope", False),
        ("nope != nope", True),
        ("nope < 1", False),
        ("nope <= 1", False),
        ("nope > 1", False),
        ("nope >= 1", False),
        ('nope < "a"', False),
        ('"a" in nope', False),
        ('nope contains "a"', False),
        ("nope in nums", False),
        ("nope", False),
        ("not nope", True),
        ("settings.nope.deeper[3] == 0", False),
        # a bare path is a condition only when its value is the boolean true
        ("settings.wifi", True),
        ("settings.bluetooth", False),
        ("settings.brightness", False),
        ("app", False),
        ("nothing", False),
        ("not settings.bluetooth", True),
    ],
)
def test_missing_paths_and_bare_paths(text: str, expected: bool) -> None:
    assert ev(text) is expected


def test_missing_value_is_exported() -> None:
    assert repr(MISSING) == "MISSING"
    assert not MISSING


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('any(clock.alarms, time == "15:00" and enabled == true)', True),
        ('any(clock.alarms, time == "15:00" and enabled == false)', False),
        ('any(clock.alarms, time == "16:00")', False),
        ('all(contacts, phone contains "555")', True),
        ('all(messages, to == "Bob")', False),
        ('all(shop.cart, price > 10 and lower(name) != "")', True),
        ("all(shop.cart, price > 100)", False),
        ("count(shop.cart, true) == 2", True),
        ("count(shop.cart, price > 100) == 1", True),
        ("count(shop.cart, price > 100) >= 2", False),
        ("count(nums, $ > 2) == 2", True),
        ("count(empty, true) == 0", True),
        ('any(browser.history, $ contains "Chile")', True),
        ('any(browser.history, lower($) contains "chile")', True),
        ('any(browser.history, $ == "chile")', False),
        ('any(contacts, $.name == name and $["phone"] == phone)', True),
        # empty and non-list inputs
        ("all(empty, false)", True),
        ("any(empty, true)", False),
        ("any(nowhere, true)", False),
        ("all(nowhere, true)", False),
        ("count(nowhere, true) == 0", False),
        ("count(nowhere, true) >= 0", False),
        ("any(settings, true)", False),
        ("all(app, true)", False),
        # paths inside the condition are relative to the element; the outer state is out of reach
        ('any(contacts, app == "Settings")', False),
        ('any(contacts, name == "Ada Lovelace")', True),
        ("any(nums, len(contacts) == 1)", False),
        # nesting: $ is the innermost element
        ('any(chats, with == "Ada" and any(msgs, text == "bye"))', True),
        ('any(chats, with == "Bob" and any(msgs, true))', False),
        ('count(chats, any(msgs, $.text == "hi")) == 1', True),
        ("all(chats, count(msgs, true) <= 2)", True),
        ("any(matrix, any($, $ == 3))", True),
        ("any(matrix, all($, $ < 3))", True),
        ("all(matrix, all($, $ < 3))", False),
        ("count(matrix, len($) == 2) == 1", True),
        ('any(groups, any(members[*].n, $ == "c"))', True),
        ('any(groups[*].members, n == "b")', False),  # the elements are the member lists
        ('any(groups[*].members[*], n == "b")', True),
        ('all(groups[*].members[*].n, $ in "abc")', True),
        ("any(clock.alarms[*].enabled, $)", True),
    ],
)
def test_quantifiers(text: str, expected: bool) -> None:
    assert ev(text) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # and binds tighter than or: a or (b and c)
        ("t or f and f", True),
        ("f and f or t", True),
        ("(t or f) and f", False),
        # not binds tightest: (not f) or t, (not t) and f
        ("not f or t", True),
        ("not (f or t)", False),
        ("not t and f", False),
        ("not (t and f)", True),
        ("not not t", True),
        ("(not f) == true", True),
        ("(not t) == true", False),
        # comparisons bind tighter than and / or
        ("n == 1 and t == true", True),
        ("n == 2 or t == false", False),
        ("n == 2 or n == 1 and t", True),
        ("(t == true) == (f == false)", True),
        ("t and\n  n >= 1", True),
    ],
)
def test_precedence(text: str, expected: bool) -> None:
    assert ev(text, {"t": True, "f": False, "n": 1}) is expected


def test_a_long_and_or_chain_evaluates_every_operand() -> None:
    """Each operand of a chain keeps its own closure (a late-binding bug would recurse or reuse the last)."""
    state = {f"k{i}": i for i in range(6)}
    every = " and ".join(f"k{i} == {i}" for i in range(6))
    assert ev(every, state)
    for i in range(6):
        assert not ev(every, {**state, f"k{i}": -1})
        assert ev(" or ".join(f"k{j} == {j if j == i else -1}" for j in range(6)), state)
    assert not ev(" or ".join(f"k{j} == -1" for j in range(6)), state)


@pytest.mark.parametrize(
    ("text", "message", "column"),
    [
        ("", "expected a value, found end of input", 1),
        ("   ", "expected a value, found end of input", 4),
        ("settings.wifi = true", "unexpected character '='; use '=='", 15),
        ("settings.wifi == true && x", "unexpected character '&'; use 'and'", 23),
        ("settings.wifi ! true", "unexpected character '!'", 15),
        ("settings.wifi == #", "unexpected character '#'", 18),
        ("(settings.wifi == true", "expected ')' to close the '(' at column 1, found end of input", 23),
        ("((a) or (b)", "expected ')' to close the '(' at column 1", 12),
        ("settings.wifi == true)", "unbalanced ')'", 22),
        ("settings.wifi == true false", "unexpected 'false' after a complete predicate", 23),
        ("any(clock.alarms)", "any() needs a condition: any(LIST, CONDITION)", 17),
        ("count(shop.cart) == 2", "count() needs a condition", 16),
        ("all(clock.alarms true)", "expected ',' after the list path of all()", 18),
        ("any(clock.alarms, true", "expected ')' to close any(", 23),
        ('app == "Settings', "unterminated string", 8),
        ("app == 'Settings", "unterminated string", 8),
        ('app == "a\\nb"', "unknown escape '\\n'", 10),
        ("settings. == 1", "expected a name after '.', found '=='", 11),
        ("settings.3", "expected a name after '.'", 10),
        ("contacts[x].name", "expected an index", 10),
        ("contacts[0.5].name", "expected an index", 10),
        ("contacts[0.name", "expected ']'", 11),
        ("contacts[", 'expected an index ([0], [-1], [*] or ["key"]), found end of input', 10),
        ("$ == 1", "'$' is only defined inside the condition", 1),
        ("foo(1)", "unknown function 'foo'", 1),
        ("42", "the predicate must be a condition (true or false), not a number", 1),
        ('"yes"', "not a string", 1),
        ("null", "not a null", 1),
        ("len(contacts)", "the predicate must be a condition (true or false), not a number", 1),
        ("count(shop.cart, true)", "not a number", 1),
        ("settings.wifi ==", "expected a value, found end of input", 17),
        ("settings.wifi == and", "expected a value, found 'and'", 18),
        ("x == -", "expected a value, found '-'", 6),
        ("1 < x < 3", "comparisons cannot be chained", 7),
        ("not settings.wifi == true", "'not' applies only to the operand after it: write not (a == b)", 19),
        ('not app in "x"', "write not (a in b)", 9),
        ("x == clock.alarms[*].time", "a wildcard list cannot be on the right of '=='", 6),
        ("x contains lower(a[*].b)", "a wildcard list cannot be on the right of 'contains'", 12),
        ('count(shop.cart, true) == "2"', "a number and a string are never equal", 1),
        ("true != 1", "a boolean and a number are never equal", 1),
        ("x < true", "'<' compares numbers or strings, not a boolean", 5),
        ("null >= x", "not a null", 1),
        ('1 > "a"', "'>' between a number and a string is always false", 1),
        ("x in 3", "'in' needs a list or a string here, not a number", 6),
        ("3 contains x", "'contains' needs a list or a string here, not a number", 1),
        ('1 in "abc"', "a number is never part of a string", 1),
        ("any(3, true)", "the first argument of any() must be a path to a list", 5),
        ("all(true, true)", "the first argument of all() must be a path", 5),
        ("x and 1", "the right of 'and' must be a condition", 7),
        ('"s" or x', "the left of 'or' must be a condition", 1),
        ("not 2", "the operand of 'not' must be a condition", 5),
        ("any(clock.alarms, 1)", "the condition of any() must be a condition", 19),
        ("len(1) == 1", "len() needs a list or a string, not a number", 5),
        ("lower(true) == 1", "lower() needs a list or a string, not a boolean", 7),
        ("and", "expected a value, found 'and'", 1),
        ("contains", "expected a value, found 'contains'", 1),
    ],
)
def test_errors_name_the_column_and_draw_a_caret(text: str, message: str, column: int) -> None:
    with pytest.raises(PredicateError) as info:
        compile_predicate(text)
    err = info.value
    assert isinstance(err, ValueError)
    assert message in err.message
    assert err.column == column
    first, source_line, caret_line = str(err).split("\n")
    assert f"(at column {column})" in first
    assert source_line == "  " + text
    assert caret_line == "  " + " " * (column - 1) + "^"


def test_errors_in_multiline_predicates_name_the_line() -> None:
    with pytest.raises(PredicateError) as info:
        compile_predicate("settings.wifi == true and\n  settings.bluetooth = false")
    err = info.value
    assert (err.line, err.column) == (2, 22)
    assert str(err).split("\n")[1:] == ["    settings.bluetooth = false", "  " + " " * 21 + "^"]
    assert "(at line 2, column 22)" in str(err)
    with pytest.raises(PredicateError, match=r"close the '\(' at line 1, column 6"):
        compile_predicate("a or (b and\n c")


@pytest.mark.parametrize(
    ("text", "paths"),
    [
        (
            "settings.wifi == true and settings.airplane_mode == false",
            {"settings.wifi", "settings.airplane_mode"},
        ),
        ('any(clock.alarms, time == "15:00" and enabled == true)', {"clock.alarms"}),
        (
            'contacts[0].name == other and messages[-1].text == "x"',
            {"contacts[*].name", "other", "messages[*].text"},
        ),
        ('clock.alarms[*].time == "15:00"', {"clock.alarms[*].time"}),
        ('len(contacts) > 0 and lower(app) == "x"', {"contacts", "app"}),
        ("count(chats, any(msgs, $.text == x)) == 1", {"chats"}),
        ('settings["Wi-Fi"] or settings["wifi"]', {'settings["Wi-Fi"]', "settings.wifi"}),
        ("matrix[0][-1] == 2", {"matrix[*][*]"}),
        ("true", set()),
    ],
)
def test_paths_reports_state_paths_outside_quantifier_conditions(text: str, paths: set[str]) -> None:
    predicate = compile_predicate(text)
    assert isinstance(predicate, Predicate)
    assert predicate.paths == frozenset(paths)
    assert isinstance(predicate.paths, frozenset)
    assert predicate.source == text


def test_compiled_once_evaluated_against_each_new_state() -> None:
    predicate = compile_predicate("settings.wifi == true and settings.airplane_mode == false")
    assert predicate.evaluate(STATE)
    assert not predicate.evaluate({**STATE, "settings": {**STATE["settings"], "airplane_mode": True}})
    assert predicate.evaluate(STATE)
    assert repr(predicate) == "Predicate('settings.wifi == true and settings.airplane_mode == false')"


def test_predicates_pickle_by_source_for_other_processes() -> None:
    predicate = compile_predicate('any(clock.alarms, time == "15:00") and settings.wifi')
    copy = pickle.loads(pickle.dumps(predicate))
    assert (copy.source, copy.paths) == (predicate.source, predicate.paths)
    assert copy.evaluate(STATE) and not copy.evaluate({})


def test_absurd_nesting_is_a_predicate_error() -> None:
    with pytest.raises(PredicateError, match="nested too deeply"):
        compile_predicate("(" * 2000 + "true" + ")" * 2000)
    assert ev("(" * 50 + "true" + ")" * 50)


# --- property tests -------------------------------------------------------------------------------------

KEYS = ("k0", "k1", "k2", "k3")
ABSENT = object()
ORDER = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}
OPS = ("==", "!=", "<", "<=", ">", ">=", "in", "contains")

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2, 2),
    st.sampled_from([-1.0, 0.0, 1.0, 2.5]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(alphabet="ab1'\"\\ ", max_size=3),
)
flat_states = st.dictionaries(st.sampled_from(KEYS), st.one_of(scalars, st.lists(scalars, max_size=3)))
operands = st.one_of(st.tuples(st.just("path"), st.sampled_from(KEYS)), st.tuples(st.just("lit"), scalars))
leaves = st.tuples(st.just("cmp"), st.sampled_from(OPS), operands, operands, st.sampled_from("\"'")).filter(
    lambda leaf: "path" in (leaf[2][0], leaf[3][0])
)
trees = st.recursive(
    leaves,
    lambda sub: st.one_of(
        st.tuples(st.sampled_from(["and", "or"]), sub, sub), st.tuples(st.just("not"), sub)
    ),
    max_leaves=6,
)


def kind(v: Any) -> str:
    if v is ABSENT:
        return "absent"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int | float):
        return "num"
    return {str: "str", type(None): "null", list: "list"}[type(v)]


def ref_eq(a: Any, b: Any) -> bool:
    if kind(a) != kind(b) or kind(a) == "absent":
        return False
    if kind(a) == "list":
        return len(a) == len(b) and all(ref_eq(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def ref_compare(op: str, a: Any, b: Any) -> bool:
    if op == "==":
        return ref_eq(a, b)
    if op == "!=":
        return not ref_eq(a, b)
    if op in ORDER:
        return kind(a) == kind(b) and kind(a) in ("num", "str") and ORDER[op](a, b)
    whole, part = (b, a) if op == "in" else (a, b)
    if kind(whole) == "list":
        return any(ref_eq(part, x) for x in whole)
    return kind(whole) == kind(part) == "str" and part in whole


def literal_ok(op: str, side: int, value: Any) -> bool:
    """The compile-time check the language promises for a literal compared with a path."""
    if op in ORDER:
        return kind(value) in ("num", "str")
    if (op, side) in (("in", 1), ("contains", 0)):
        return kind(value) == "str"
    return True


def render_literal(value: Any, quote: str) -> str:
    if isinstance(value, str):
        return quote + value.replace("\\", "\\\\").replace(quote, "\\" + quote) + quote
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else repr(value)


def render(tree: tuple) -> tuple[str, bool]:
    """Source text, and whether the reference expects it to compile."""
    if tree[0] == "cmp":
        _, op, left, right, quote = tree
        texts, ok = [], True
        for side, (what, value) in enumerate((left, right)):
            texts.append(value if what == "path" else render_literal(value, quote))
            ok = ok and (what == "path" or literal_ok(op, side, value))
        return f"{texts[0]} {op} {texts[1]}", ok
    if tree[0] == "not":
        text, ok = render(tree[1])
        return f"not ({text})", ok
    (a, ok_a), (b, ok_b) = render(tree[1]), render(tree[2])
    return f"({a}) {tree[0]} ({b})", ok_a and ok_b


def reference(tree: tuple, state: dict[str, Any]) -> bool:
    if tree[0] == "cmp":
        _, op, left, right, _ = tree
        a, b = ((state.get(v, ABSENT) if w == "path" else v) for w, v in (left, right))
        return ref_compare(op, a, b)
    if tree[0] == "not":
        return not reference(tree[1], state)
    if tree[0] == "and":
        return reference(tree[1], state) and reference(tree[2], state)
    return reference(tree[1], state) or reference(tree[2], state)


@settings(derandomize=True, max_examples=400, deadline=None)
@given(trees, st.lists(flat_states, min_size=1, max_size=4))
def test_evaluator_matches_a_python_reference(tree: tuple, states: list[dict[str, Any]]) -> None:
    text, ok = render(tree)
    if not ok:
        with pytest.raises(PredicateError):
            compile_predicate(text)
        return
    predicate = compile_predicate(text)
    for state in states:
        assert predicate.evaluate(state) is reference(tree, state), (text, state)


VALID = [
    "settings.wifi == true and settings.airplane_mode == false",
    'any(clock.alarms, time == "15:00" and enabled == true)',
    'all(contacts, phone contains "555") or count(shop.cart, price > 10) >= 2',
    'messages[-1].text == "bye" and contacts[0].name in messages[*].to',
    'clock.alarms[*].time == "15:00" and not (browser.tabs[*].incognito == true)',
    'any(browser.history, lower($) contains "chile") and len(browser.tabs) < 3',
    "any(chats, any(msgs, $.text == 'hi') and count(msgs, true) > 1)",
    'lower(shop.cart[*].name) contains "air" and shop.page != "cart"',
    'settings["wifi"] and not settings.bluetooth and "tt" in app',
    "len(matrix[*][*]) > 2 or any(matrix, all($, $ >= 1))",
    "count(nums, $ > 2) == 2 and nums[1] <= 2.5",
]

json_trees = st.recursive(
    scalars,
    lambda sub: st.one_of(
        st.lists(sub, max_size=3),
        st.dictionaries(st.sampled_from([*STATE, "alarms", "time", "name", "msgs", "text", "wifi"]), sub),
    ),
    max_leaves=12,
)


@pytest.mark.parametrize("state", [{}, None, [], "phone", 42, {"settings": None}, {"settings": [1, 2]}])
def test_evaluation_never_raises_on_states_missing_the_paths(state: Any) -> None:
    for text in VALID:
        assert compile_predicate(text).evaluate(state) is False


@settings(derandomize=True, max_examples=300, deadline=None)
@given(json_trees)
def test_evaluation_never_raises_on_arbitrary_json(state: Any) -> None:
    for text in VALID:
        assert type(compile_predicate(text).evaluate(state)) is bool
    for text in VALID:
        assert type(compile_predicate(text).evaluate({**STATE, "settings": state, "clock": state})) is bool


def test_all_valid_examples_hold_on_the_example_state() -> None:
    assert {text: ev(text) for text in VALID} == dict.fromkeys(VALID, True)
