"""Success predicates for SimPhone tasks: a small expression language over the phone's JSON-like state.

Tasks are data files, so their success checks are text; this module compiles that text once (at task
load, where errors surface with a column and a caret) into closures that are cheap to run after every
step. It never uses Python's eval/exec/ast.

## Values and literals

- Numbers: `42`, `-3`, `2.5`, `1e3` (ints and floats compare equal by value: `1 == 1.0`).
- Strings: `"double"` or `'single'` quoted; the only escapes are `\\"`, `\\'` and `\\\\`.
- `true`, `false`, `null`. Booleans are not numbers: `true == 1` is false.

## Paths

Names are ASCII letters, digits and `_`, not starting with a digit. Whitespace (newlines included) may
separate any two tokens. After a dot a name may be a keyword (`x.in`); a path cannot start with one.

- `settings.wifi` looks up dict keys; `contacts[0].name` and `messages[-1].text` index lists (negative
  counts from the end); `["Wi-Fi"]` looks up a key that is not a plain name.
- `clock.alarms[*].time` is a wildcard: the list of `time` of every alarm. Elements where the rest of
  the path is missing are skipped, and nested wildcards flatten into one list. A wildcard path always
  gives a list (empty if nothing matched).
- A path that does not exist gives MISSING: it is unequal to everything (itself included, so `==` is
  false and `!=` is true), every ordering comparison with it is false, and it is false as a condition.
  `x == null` holds only when the key exists and holds null. Evaluation never raises.

## Operators, loosest binding first

1. `a or b`
2. `a and b`
3. comparisons, not chainable (`1 < x < 3` is an error; write `1 < x and x < 3`):
   - `==`, `!=`: deep equality; values of different types are unequal.
   - `<`, `<=`, `>`, `>=`: numbers with numbers, strings with strings; any other pair is false.
   - `a in b`: `b` is a list holding an element equal to `a`, or `a` and `b` are strings and `a` is a
     substring of `b`. `b contains a` means exactly `a in b`.
4. `not a`: binds tightest, to the one operand after it. Since `not a == b` would thus mean
   `(not a) == b`, a comparison right after a `not` operand is rejected: write `not (a == b)` or `a != b`.

Parentheses group. A wildcard path on the left of a comparison means "some element satisfies it"
(false for an empty list): `browser.tabs[*].incognito == true` is "some tab is incognito", so
`!=` is "some tab is not"; "no tab is" is `not (browser.tabs[*].incognito == true)`. On the right a
wildcard is allowed only after `in` (`"Gym" in clock.alarms[*].label`), where it is the plain list.

## Functions

- `len(x)`: length of a list or string, else MISSING.
- `lower(x)`: lower-cased string; on a list it lower-cases the string elements (keeping wildcard
  meaning); anything else gives MISSING.
- `any(LIST, COND)`, `all(LIST, COND)`, `count(LIST, COND)`: LIST is a path; COND is evaluated once per
  element with every path in it relative to the element (`any(clock.alarms, time == "15:00" and
  enabled == true)`), and `$` is the element itself (`any(browser.history, $ contains "chile")`,
  `$.name`). The outer state is not reachable inside COND; in nested quantifiers `$` is the innermost
  element. `all` of an empty list is true. If LIST is not a list, `any` and `all` are false and `count`
  is MISSING. `count` gives a number: `count(shop.cart, true) == 2`.

## Conditions

The operands of `and`, `or`, `not`, the COND of a quantifier and the whole predicate must be conditions.
Comparisons, quantifiers, `true` and `false` are; a bare path counts as true only if its value is the
boolean `true` (a wildcard path: if any element is `true`). Numbers, strings, `null`, `len()` and
`count()` there are compile errors, as are other mismatches visible before evaluation (`count(x, true)
== "2"`, `x < true`, `x in 3`, a wildcard right of `==`, `$` outside a quantifier).

## Grammar

    predicate = or_expr ;
    or_expr   = and_expr { "or" and_expr } ;
    and_expr  = cmp_expr { "and" cmp_expr } ;
    cmp_expr  = unary [ cmp_op unary ] ;   (* left unary may not be a bare "not ..." *)
    unary     = "not" unary | atom ;
    atom      = [ "-" ] number | string | "true" | "false" | "null" | path | "(" or_expr ")"
              | ( "len" | "lower" ) "(" or_expr ")"
              | ( "any" | "all" | "count" ) "(" path "," or_expr ")" ;
    path      = ( name | "$" ) { "." name | "[" ( [ "-" ] integer | "*" | string ) "]" } ;
    cmp_op    = "==" | "!=" | "<" | "<=" | ">" | ">=" | "in" | "contains" ;

`Predicate.paths` lists the state paths used outside quantifier conditions (including each outermost
quantifier's LIST), with every index written `[*]`: `contacts[0].name` is reported as
`contacts[*].name`, `any(clock.alarms, ...)` as `clock.alarms`.
"""

from __future__ import annotations

import json
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

__all__ = ["MISSING", "Predicate", "PredicateError", "compile_predicate"]


class _Missing:
    """The value of a path that does not exist (see the module docstring for how it compares)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False


MISSING: Any = _Missing()


class _Many(list):
    """Values gathered by a wildcard path; on the left of a comparison it means "any element"."""

    __slots__ = ()


class PredicateError(ValueError):
    """A malformed predicate; the message names the column and draws a caret under the problem."""

    def __init__(self, message: str, source: str, pos: int):
        self.message, self.source, self.pos = message, source, pos
        self.line, self.column = source.count("\n", 0, pos) + 1, _column(source, pos)
        end = source.find("\n", pos)
        line_text = source[pos - self.column + 1 : end if end >= 0 else len(source)]
        super().__init__(f"{message} (at {_where(source, pos)})\n  {line_text}\n  {' ' * (self.column - 1)}^")


def _column(source: str, pos: int) -> int:
    return pos - source.rfind("\n", 0, pos)  # 1-based: rfind gives -1 on the first line


def _where(source: str, pos: int) -> str:
    line, column = source.count("\n", 0, pos) + 1, _column(source, pos)
    return f"line {line}, column {column}" if "\n" in source else f"column {column}"


# --- values -------------------------------------------------------------------------------------------

_NUMS = (int, float)


def _is_num(v: Any) -> bool:
    return isinstance(v, _NUMS) and not isinstance(v, bool)


def _eq(a: Any, b: Any) -> bool:
    ta, tb = type(a), type(b)
    if ta is tb:
        if ta is list:
            return len(a) == len(b) and all(map(_eq, a, b))
        if ta is dict:
            return a.keys() == b.keys() and all(_eq(v, b[k]) for k, v in a.items())
        return ta is not _Missing and a == b
    return ta in _NUMS and tb in _NUMS and a == b  # int vs float; bool is neither, by `type`


def _ordered(cmp: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool]:
    def op(a: Any, b: Any) -> bool:
        if isinstance(a, str):
            return isinstance(b, str) and cmp(a, b)
        return _is_num(a) and _is_num(b) and cmp(a, b)

    return op


def _in(a: Any, b: Any) -> bool:
    if isinstance(b, list):
        return any(_eq(a, x) for x in b)
    return isinstance(a, str) and isinstance(b, str) and a in b


_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "==": _eq,
    "!=": lambda a, b: not _eq(a, b),
    "<": _ordered(operator.lt),
    "<=": _ordered(operator.le),
    ">": _ordered(operator.gt),
    ">=": _ordered(operator.ge),
    "in": _in,
    "contains": lambda a, b: _in(b, a),
}


def _get(cur: Any, keys: tuple[str | int, ...]) -> Any:
    for k in keys:
        if isinstance(k, str):
            if not isinstance(cur, dict):
                return MISSING
            cur = cur.get(k, MISSING)
            if cur is MISSING:
                return MISSING
        elif isinstance(cur, list) and -len(cur) <= k < len(cur):
            cur = cur[k]
        else:
            return MISSING
    return cur


def _lower(v: Any) -> Any:
    if isinstance(v, str):
        return v.lower()
    if isinstance(v, list):
        return type(v)(x.lower() if isinstance(x, str) else x for x in v)  # a _Many stays a _Many
    return MISSING


# --- tokens -------------------------------------------------------------------------------------------


class _Tok(NamedTuple):
    kind: str  # "num", "str", "name", "op" or "eof"
    text: str
    pos: int
    value: Any = None


_TOKEN = re.compile(
    r"""(?P<ws>\s+)|(?P<num>\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)|(?P<name>[A-Za-z_]\w*)
    |(?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')|(?P<op>==|!=|<=|>=|[<>()\[\].,*$-])""",
    re.VERBOSE | re.DOTALL | re.ASCII,
)
_HINTS = {"=": "; use '==' to compare", "!": "; use 'not' or '!='", "&": "; use 'and'", "|": "; use 'or'"}
_KEYWORDS = {"and", "or", "not", "in", "contains", "true", "false", "null"}
_CMP = {"==", "!=", "<", "<=", ">", ">=", "in", "contains"}
_BOOL_BP = {"and": 2, "or": 1}
_CONSTS = {"true": True, "false": False, "null": None}
_KINDS = {bool: "boolean", int: "number", float: "number", str: "string", type(None): "null"}
_NAME = re.compile(r"[A-Za-z_]\w*", re.ASCII)


def _tokenize(src: str) -> list[_Tok]:
    toks, pos = [], 0
    while pos < len(src):
        m = _TOKEN.match(src, pos)
        if m is None:
            if src[pos] in "\"'":
                raise PredicateError("unterminated string", src, pos)
            raise PredicateError(f"unexpected character {src[pos]!r}{_HINTS.get(src[pos], '')}", src, pos)
        kind, text = m.lastgroup or "", m.group()
        if kind == "num":
            toks.append(_Tok(kind, text, pos, int(text) if text.isdigit() else float(text)))
        elif kind == "str":
            toks.append(_Tok(kind, text, pos, _unescape(src, pos, text)))
        elif kind != "ws":
            toks.append(_Tok(kind, text, pos))
        pos = m.end()
    return [*toks, _Tok("eof", "", len(src))]


def _unescape(src: str, pos: int, text: str) -> str:
    def one(m: re.Match[str]) -> str:
        if m.group(1) not in "\"'\\":
            raise PredicateError(
                f"unknown escape '\\{m.group(1)}' (only \\\" \\' \\\\)", src, pos + 1 + m.start()
            )
        return m.group(1)

    return re.sub(r"\\(.)", one, text[1:-1], flags=re.DOTALL)


# --- parser -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Node:
    fn: Callable[[Any], Any]  # evaluates against the scope: the state, or the element inside a quantifier
    kind: str  # "boolean", "number", "string", "null", or "any" when only known at run time
    pos: int
    wild: bool = False  # gives a _Many (a wildcard path, or lower() of one)


class _Parser:
    """Recursive descent with precedence climbing: or = 1, and = 2, comparisons = 3, `not` operand = atom."""

    def __init__(self, src: str):
        self.src, self.toks, self.i, self.depth = src, _tokenize(src), 0, 0
        self.paths: set[str] = set()

    def error(self, message: str, pos: int) -> PredicateError:
        return PredicateError(message, self.src, pos)

    def peek(self) -> _Tok:
        return self.toks[self.i]

    def take(self) -> _Tok:
        self.i += 1
        return self.toks[self.i - 1]

    def at(self, text: str) -> bool:
        tok = self.peek()
        return tok.text == text and tok.kind in ("op", "name")

    def expect(self, text: str, what: str) -> None:
        if not self.at(text):
            raise self.error(f"expected {what}, found {_describe(self.peek())}", self.peek().pos)
        self.i += 1

    def expr(self, min_bp: int) -> _Node:
        bare_not, left, chained = self.at("not"), self.atom(), False
        while True:
            tok = self.peek()
            op = tok.text if tok.kind in ("op", "name") else ""
            bp = 3 if op in _CMP else _BOOL_BP.get(op, 0)
            if bp <= min_bp:
                return left
            if bp == 3 and bare_not:
                raise self.error(f"'not' applies only to the operand after it: write not (a {op} b)", tok.pos)
            if bp == 3 and chained:
                raise self.error("comparisons cannot be chained; join them with 'and'", tok.pos)
            self.take()
            right = self.expr(bp)
            if bp == 3:
                left, chained = self.compare(op, left, right), True
            else:
                lf, rf = self.cond(left, f"the left of '{op}'"), self.cond(right, f"the right of '{op}'")
                left, chained = _Node(_AND_OR[op](lf, rf), "boolean", left.pos), False
            bare_not = False

    def atom(self) -> _Node:
        tok = self.take()
        if tok.kind in ("num", "str"):
            return _const(tok.value, tok.pos)
        if tok.kind == "op" and tok.text == "-" and self.peek().kind == "num":
            return _const(-self.take().value, tok.pos)
        if tok.kind == "op" and tok.text == "(":
            node = self.expr(0)
            self.expect(")", f"')' to close the '(' at {_where(self.src, tok.pos)}")
            return node
        if tok.kind == "op" and tok.text == "$":
            return self.path(tok)
        if tok.kind == "name" and tok.text == "not":
            f = self.cond(self.expr(3), "the operand of 'not'")
            return _Node(lambda s: not f(s), "boolean", tok.pos)
        if tok.kind == "name" and tok.text in _CONSTS:
            return _const(_CONSTS[tok.text], tok.pos)
        if tok.kind == "name" and tok.text not in _KEYWORDS:
            return self.call(tok) if self.at("(") else self.path(tok)
        raise self.error(f"expected a value, found {_describe(tok)}", tok.pos)

    def path(self, tok: _Tok) -> _Node:
        if tok.text == "$" and self.depth == 0:
            raise self.error("'$' is only defined inside the condition of any(), all() or count()", tok.pos)
        chunks: list[list[Any]] = [[] if tok.text == "$" else [tok.text]]  # keys, split at each [*]
        shown = "$" if tok.text == "$" else tok.text
        while self.at(".") or self.at("["):
            if self.take().text == ".":
                name = self.take()
                if name.kind != "name":
                    raise self.error(f"expected a name after '.', found {_describe(name)}", name.pos)
                chunks[-1].append(name.text)
                shown += "." + name.text
                continue
            idx = self.take()
            if idx.text == "-" and self.peek().kind == "num":
                num = self.take()
                idx = num._replace(pos=idx.pos, value=-num.value)
            if idx.kind == "str":
                chunks[-1].append(idx.value)
                shown += "." + idx.value if _NAME.fullmatch(idx.value) else f"[{json.dumps(idx.value)}]"
            elif idx.text == "*":
                chunks.append([])
                shown += "[*]"
            elif idx.kind == "num" and isinstance(idx.value, int):
                chunks[-1].append(idx.value)
                shown += "[*]"
            else:
                raise self.error(
                    f'expected an index ([0], [-1], [*] or ["key"]), found {_describe(idx)}', idx.pos
                )
            self.expect("]", "']'")
        if self.depth == 0:
            self.paths.add(shown)
        head, *rest = (tuple(c) for c in chunks)
        if not rest:
            return _Node(lambda s: _get(s, head), "any", tok.pos)

        def get_all(s: Any) -> _Many:
            vals = [_get(s, head)]
            for chunk in rest:
                vals = [_get(e, chunk) for v in vals if isinstance(v, list) for e in v]
                vals = [v for v in vals if v is not MISSING]
            return _Many(vals)

        return _Node(get_all, "any", tok.pos, wild=True)

    def call(self, tok: _Tok) -> _Node:
        name = tok.text
        self.take()  # "("
        if name in ("len", "lower"):
            arg = self.expr(0)
            self.expect(")", f"')' to close {name}(")
            if arg.kind not in ("any", "string"):
                raise self.error(f"{name}() needs a list or a string, not a {arg.kind}", arg.pos)
            f = arg.fn
            if name == "lower":
                return _Node(lambda s: _lower(f(s)), arg.kind, tok.pos, arg.wild)
            return _Node(
                lambda s: len(v) if isinstance(v := f(s), list | str) else MISSING, "number", tok.pos
            )
        if name not in ("any", "all", "count"):
            raise self.error(f"unknown function '{name}' (known: len, lower, any, all, count)", tok.pos)
        first = self.take()
        if not (first.text == "$" or (first.kind == "name" and first.text not in _KEYWORDS)):
            raise self.error(f"the first argument of {name}() must be a path to a list", first.pos)
        lst = self.path(first).fn
        if self.at(")"):
            raise self.error(f"{name}() needs a condition: {name}(LIST, CONDITION)", self.peek().pos)
        self.expect(",", f"',' after the list path of {name}()")
        self.depth += 1
        cond = self.cond(self.expr(0), f"the condition of {name}()")
        self.depth -= 1
        self.expect(")", f"')' to close {name}(")
        if name == "count":
            return _Node(
                lambda s: sum(map(cond, v)) if isinstance(v := lst(s), list) else MISSING, "number", tok.pos
            )
        agg = any if name == "any" else all
        return _Node(lambda s: isinstance(v := lst(s), list) and agg(map(cond, v)), "boolean", tok.pos)

    def compare(self, op: str, left: _Node, right: _Node) -> _Node:
        lk, rk = left.kind, right.kind
        if right.wild and op != "in":
            raise self.error(
                f"a wildcard list cannot be on the right of '{op}' (put it on the left)", right.pos
            )
        if op in ("==", "!=") and "any" not in (lk, rk) and lk != rk:
            raise self.error(f"a {lk} and a {rk} are never equal", left.pos)
        if op in ("<", "<=", ">", ">="):
            for node in (left, right):
                if node.kind not in ("any", "number", "string"):
                    raise self.error(f"'{op}' compares numbers or strings, not a {node.kind}", node.pos)
            if "any" not in (lk, rk) and lk != rk:
                raise self.error(f"'{op}' between a {lk} and a {rk} is always false", left.pos)
        if op in ("in", "contains"):
            whole, part = (right, left) if op == "in" else (left, right)
            if whole.kind not in ("any", "string"):
                raise self.error(f"'{op}' needs a list or a string here, not a {whole.kind}", whole.pos)
            if whole.kind == "string" and part.kind not in ("any", "string"):
                raise self.error(f"a {part.kind} is never part of a string", part.pos)
        fn, lf, rf = _OPS[op], left.fn, right.fn
        if left.wild:

            def any_element(s: Any) -> bool:
                r = rf(s)
                return any(fn(x, r) for x in lf(s))

            return _Node(any_element, "boolean", left.pos)
        return _Node(lambda s: fn(lf(s), rf(s)), "boolean", left.pos)

    def cond(self, node: _Node, where: str) -> Callable[[Any], bool]:
        """The node as a condition: booleans as is; a path only when its value is `true`."""
        if node.kind == "boolean":
            return node.fn
        if node.kind != "any":
            raise self.error(f"{where} must be a condition (true or false), not a {node.kind}", node.pos)
        f = node.fn
        if node.wild:
            return lambda s: any(v is True for v in f(s))
        return lambda s: f(s) is True


_AND_OR: dict[str, Callable[[Callable[[Any], bool], Callable[[Any], bool]], Callable[[Any], bool]]] = {
    "and": lambda lf, rf: lambda s: lf(s) and rf(s),
    "or": lambda lf, rf: lambda s: lf(s) or rf(s),
}


def _const(value: Any, pos: int) -> _Node:
    return _Node(lambda s: value, _KINDS[type(value)], pos)


def _describe(tok: _Tok) -> str:
    return "end of input" if tok.kind == "eof" else repr(tok.text)


# --- API ----------------------------------------------------------------------------------------------


class Predicate:
    """A compiled predicate: compile once when the task loads, then `evaluate(state)` after every step."""

    __slots__ = ("_check", "paths", "source")

    def __init__(self, source: str, paths: frozenset[str], check: Callable[[Any], bool]):
        self.source, self.paths, self._check = source, paths, check

    def evaluate(self, state: Any) -> bool:
        """True when the state satisfies the predicate; never raises on missing or mistyped state."""
        return self._check(state)

    def __repr__(self) -> str:
        return f"Predicate({self.source!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return compile_predicate, (self.source,)  # closures do not pickle; the source recompiles


def compile_predicate(text: str) -> Predicate:
    """Parse and check `text`; raises PredicateError (a ValueError) with a column and caret if malformed."""
    parser = _Parser(text)
    try:
        node = parser.expr(0)
    except RecursionError:
        raise PredicateError("the predicate is nested too deeply", text, 0) from None
    tok = parser.peek()
    if tok.kind != "eof":
        what = (
            "unbalanced ')'" if tok.text == ")" else f"unexpected {_describe(tok)} after a complete predicate"
        )
        raise parser.error(what, tok.pos)
    return Predicate(text, frozenset(parser.paths), parser.cond(node, "the predicate"))
