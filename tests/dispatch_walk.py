"""The dispatches over registered names, found by reading the code: what tests/test_dispatch_walk.py checks.

The registered names (`registered_names`): the reducers (REDUCERS), the quantization methods (src.quant.METHODS),
the variants' optimizers (src.optim.variant.OPTIMIZERS), the variants (conf/variant/) and the communication
benchmark's cases (src.bench.comm_cases.BY_NAME). A name set is a string
constant among them, a tuple, list or set of such constants, or a module-level collection (resolved in the module
as it is imported: `SCALED`, `BASELINE_KEYS`) holding one, that names some but not all of a set (a membership test
of the whole registry, `name in REDUCERS`, is a lookup). `dispatches(path)` parses a file and returns every use of
one:

- a comparison with a name set (`==`, `!=`, `in`, `not in`), by where it sits:
  - the test of an `if`/`elif`: closed when its body ends in a `raise` (a guard refusing a case), when the chain
    ends in `else: raise`, when the statement after the chain (and after any `if` over names that follows it)
    is a `raise`, or when one of those ifs refuses the rest (`if kind != "lion_cub": raise ...`), each of these
    raises naming what was compared (`{kind!r}` in its message); else open: every name it does not name falls
    through to what comes next, or is refused without its name;
  - a conditional expression (`a if m == "l1" else b`): open, its `else` takes every other name;
  - a comprehension's filter: closed for `==` and `in` (it selects the named items; no other name is affected),
    open for `!=` and `not in` (every name it does not name is kept);
  - anywhere else (an argument, an assignment, a return, a boolean operator outside an `if` test): open, a flag
    that takes one value for the names it names and the other for every other name (`kernel(..., method != "l1")`);
- a `match` whose cases name registered names: closed when its last case is `case _:` ending in a `raise`;
- a `.get(key, default)` on a registered name set: open, every name it does not hold takes the default.

Each is a `Dispatch(path, line, function, kind, text, closed)`. Plain functions of source text: the tests run them
on src/ and on constructed modules.
"""
from __future__ import annotations

import ast
import importlib
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COLLECTIONS = (tuple, list, set, frozenset, dict, type({}.keys()))


def registered_names() -> tuple[frozenset[str], ...]:
    """The registered name sets: reducers, quantization methods, variants' optimizers, variants, and the
    communication benchmark's cases (src.bench.comm_cases, named like the variants)."""
    from src.comm.reducers.registry import REDUCERS
    from src.optim.variant import OPTIMIZERS
    from src.quant import METHODS

    from src.bench.comm_cases import BY_NAME

    variants = {p.stem for p in (REPO / "conf" / "variant").glob("*.yaml")}
    return tuple(frozenset(names) for names in (REDUCERS, METHODS, OPTIMIZERS, variants, BY_NAME))


@dataclass(frozen=True)
class Dispatch:
    path: str
    line: int
    function: str  # the enclosing function's qualified name ("" at module level)
    kind: str      # if, conditional, filter, value, match, get
    text: str
    closed: bool

    def __str__(self) -> str:
        state = "closed" if self.closed else "OPEN"
        return f"{self.path}:{self.line} {self.function or '<module>'}: {self.kind} `{self.text}` ({state})"


def _resolve(node: ast.expr, namespace: dict):
    """The value of a Name or dotted Attribute in `namespace` (the module's globals), else None."""
    if isinstance(node, ast.Name):
        return namespace.get(node.id)
    if isinstance(node, ast.Attribute):
        owner = _resolve(node.value, namespace)
        return getattr(owner, node.attr, None) if owner is not None else None
    return None


class _Walk(ast.NodeVisitor):
    def __init__(self, path: str, namespace: dict, names: tuple[frozenset[str], ...]):
        self.path, self.namespace, self.names = path, namespace, names
        self.found: list[Dispatch] = []
        self.scope: list[str] = []
        self.parents: dict[ast.AST, ast.AST] = {}
        self.handled: set[ast.AST] = set()  # comparisons already classified by their `if` or comprehension

    # --- what is a name set -----------------------------------------------------------------------------------
    def strings(self, node: ast.expr) -> set[str]:
        """The string constants `node` stands for: a constant, a literal collection, a module-level collection."""
        if isinstance(node, ast.Constant):
            return {node.value} if isinstance(node.value, str) else set()
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return set().union(*(self.strings(e) for e in node.elts))
        value = _resolve(node, self.namespace)
        if isinstance(value, COLLECTIONS) and not isinstance(value, str):
            return {v for v in value if isinstance(v, str)}
        return set()

    def is_names(self, node: ast.expr) -> bool:
        """Whether `node` names some but not all of a registered name set (all of one is a lookup in the registry,
        e.g. `name not in REDUCERS`: a check, not a dispatch)."""
        found = self.strings(node)
        hit = [names for names in self.names if found & names]
        return bool(hit) and not any(names <= found for names in hit)

    def over_names(self, node: ast.Compare) -> bool:
        return any(self.is_names(side) for side in (node.left, *node.comparators))

    def compares(self, test: ast.expr) -> list[ast.Compare]:
        return [n for n in ast.walk(test) if isinstance(n, ast.Compare) and self.over_names(n)]

    def add(self, node: ast.AST, kind: str, text: str, closed: bool) -> None:
        self.found.append(Dispatch(self.path, node.lineno, ".".join(self.scope), kind, text, closed))

    # --- scopes -----------------------------------------------------------------------------------------------
    def visit_FunctionDef(self, node) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_AsyncFunctionDef = visit_ClassDef = visit_FunctionDef

    # --- the uses ---------------------------------------------------------------------------------------------
    def visit_If(self, node: ast.If) -> None:
        compares = self.compares(node.test)
        if compares:
            self.handled.update(compares)
            self.add(node, "if", ast.unparse(node.test), _raises(node.body) or self.chain_closed(node))
        self.generic_visit(node)

    def chain_closed(self, node: ast.If) -> bool:
        """Whether the if/elif chain of `node`, with the ifs over names right after it, refuses what it does not
        name: an `else: raise`, a `raise` after it, or an `if x != name` / `if x not in names` that raises."""
        chain = [node]
        while len(chain[-1].orelse) == 1 and isinstance(chain[-1].orelse[0], ast.If):
            chain.append(chain[-1].orelse[0])
        block = _block_of(node, self.parents)
        rest = block[block.index(node) + 1:] if block is not None and not chain[-1].orelse else []
        while rest and isinstance(rest[0], ast.If) and self.compares(rest[0].test):
            chain.append(rest[0])
            rest = rest[1:]
        subjects = {ast.unparse(c.left) for n in chain for c in self.compares(n.test)}
        refusals = [n.body for n in chain if self.refuses_rest(n)]
        refusals += [chain[-1].orelse] if chain[-1].orelse else [rest[:1]] if rest else []
        return any(_raises(body) and _names_one_of(body[-1], subjects) for body in refusals)

    def refuses_rest(self, node: ast.If) -> bool:
        """`if x != name: raise` or `if x not in names: raise` (any of them joined by `or`)."""
        tests = node.test.values if isinstance(node.test, ast.BoolOp) and isinstance(node.test.op, ast.Or) else [
            node.test]
        negated = [t for t in tests if isinstance(t, ast.Compare) and self.over_names(t)
                   and all(isinstance(op, (ast.NotEq, ast.NotIn)) for op in t.ops)]
        return _raises(node.body) and bool(negated)

    def visit_IfExp(self, node: ast.IfExp) -> None:
        compares = self.compares(node.test)
        if compares:
            self.handled.update(compares)
            self.add(node, "conditional", ast.unparse(node.test), False)
        self.generic_visit(node)

    def visit_comprehension(self, node: ast.comprehension) -> None:
        for condition in node.ifs:
            for compare in self.compares(condition):
                self.handled.add(compare)
                selects = all(isinstance(op, (ast.Eq, ast.In)) for op in compare.ops)
                self.add(compare, "filter", ast.unparse(compare), selects)
        self.generic_visit(node)

    def visit_Compare(self, node: ast.Compare) -> None:
        if node not in self.handled and self.over_names(node):
            self.add(node, "value", ast.unparse(node), False)
        self.generic_visit(node)

    def visit_Match(self, node: ast.Match) -> None:
        named = any(self.is_names(p.value) for case in node.cases for p in ast.walk(case.pattern)
                    if isinstance(p, ast.MatchValue))
        if named:
            last = node.cases[-1]
            closed = isinstance(last.pattern, ast.MatchAs) and last.pattern.pattern is None and _raises(last.body)
            self.add(node, "match", ast.unparse(node.subject), closed)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        function = node.func
        if (isinstance(function, ast.Attribute) and function.attr == "get" and len(node.args) == 2
                and self.is_names(function.value)):
            self.add(node, "get", ast.unparse(node), False)
        self.generic_visit(node)


def _raises(body: list[ast.stmt]) -> bool:
    return bool(body) and isinstance(body[-1], ast.Raise)


def _names_one_of(statement: ast.stmt, subjects: set[str]) -> bool:
    """Whether the raise names what was compared (one of `subjects` appears in it: `{kind!r}`, `unscaled(method)`)."""
    return any(isinstance(n, (ast.Name, ast.Attribute, ast.Subscript)) and ast.unparse(n) in subjects
               for n in ast.walk(statement))


def _block_of(node: ast.stmt, parents: dict) -> list[ast.stmt] | None:
    """The statement list that holds `node` (a body, an else, a module)."""
    parent = parents.get(node)
    for field in ("body", "orelse", "finalbody", "handlers"):
        block = getattr(parent, field, None)
        if isinstance(block, list) and node in block:
            return block
    return None


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def dispatches(path: Path, namespace: dict | None = None, names: tuple[frozenset[str], ...] | None = None) -> list[Dispatch]:
    """Every use of a registered name set in the file at `path` (its module's globals resolve the names: the
    module is imported when `namespace` is None)."""
    tree = ast.parse(path.read_text())
    if namespace is None:
        namespace = vars(importlib.import_module(module_name(path)))
    walk = _Walk(str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path), namespace,
                 names if names is not None else registered_names())
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            walk.parents[child] = node
    walk.visit(tree)
    return sorted(walk.found, key=lambda d: d.line)
