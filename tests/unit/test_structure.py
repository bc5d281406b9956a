"""The structure DESIGN.md asks for, checked on the source (no imports run): small files and functions, no
import cycle between our modules, no module reaching into another object's private attributes."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("orchestrator", "actors")
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60
# Private names of other libraries that have no public spelling, each with why it is used.
ALLOWED_PRIVATE = {
    "argparse._SubParsersAction",  # the type of add_subparsers(); argparse has no public name for it
    "p._actions",  # argparse: a parser's options, to check which ones a user gave (plan memory --config)
    "internal_kv._internal_kv_put", "internal_kv._internal_kv_get", "internal_kv._internal_kv_del",  # Ray's KV
    "result._replace",  # NamedTuple's public copy-with-changes method (underscore by namedtuple convention)
    "model.config._attn_implementation",  # transformers' attention switch (no public setter)
    "getattr(config, '_attn_implementation', None)",  # the same, read
    "getattr(model, '_no_split_modules', None)",  # transformers: the decoder-layer classes FSDP wraps one by one
    "from vllm import _custom_ops",  # vLLM's kernels (scaled_fp8_quant) have no other name; its own layers use it
    "getattr(body, '_no_split_modules', None)",  # the same, of the PPO critic's decoder body (actors/critic.py)
    "torch._C",  # torch._C.set_num_threads: vLLM's CPU worker replaces torch.set_num_threads by a no-op (stream.py)
}


def _sources() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def _module(path: Path) -> str:
    name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    return name[: -len(".__init__")] if name.endswith(".__init__") else name


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_files_and_functions_stay_small(path):
    source = path.read_text()
    assert len(source.splitlines()) <= MAX_FILE_LINES, f"{path.name}: over {MAX_FILE_LINES} lines: split it"
    long = [f"{n.name} ({n.end_lineno - n.lineno + 1} lines)" for n in ast.walk(ast.parse(source))
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"{path.name}: functions over {MAX_FUNCTION_LINES} lines: {long}"


def _is_own(node: ast.Attribute) -> bool:
    """`self._x`, `cls._x`, `super()._x`: an object's own private state."""
    v = node.value
    return (isinstance(v, ast.Name) and v.id in ("self", "cls")) or (
        isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and v.func.id == "super")


def test_no_module_reaches_into_private_state():
    bad = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):  # `from x import _y`: another module's private name
                bad += [f"{path.relative_to(ROOT)}:{node.lineno} from {node.module} import {a.name}"
                        for a in node.names if a.name.startswith("_") and not a.name.startswith("__")
                        and f"from {node.module} import {a.name}" not in ALLOWED_PRIVATE]
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "setattr") \
                    and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) \
                    and str(node.args[1].value).startswith("_") and not str(node.args[1].value).startswith("__") \
                    and ast.unparse(node) not in ALLOWED_PRIVATE:
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)}")
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and not _is_own(node) and ast.unparse(node) not in ALLOWED_PRIVATE):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)}")
    assert not bad, "private attributes used from outside their object:\n" + "\n".join(bad)


def _import_graph() -> dict[str, set[str]]:
    modules = {_module(p): p for p in _sources()}

    def resolve(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):  # module-level and function-level imports alike
            if isinstance(node, ast.Import):
                deps |= {resolve(a.name) for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                deps |= {resolve(f"{node.module}.{a.name}") for a in node.names}
        graph[name] = deps - {"", name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle():
    assert _cycles(_import_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
