"""The layering of DESIGN.md §1: no import runs up a layer, no cycle between files."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "andante"

#: Lower ranks sit lower; a module may import its own package or any lower rank.
RANKS = {
    "core": 0,
    "kv": 1, "metrics": 1, "workload": 1,
    "perf": 2,
    "models": 3,
    "exec": 4,
    "engine": 5,
    "policies": 6,
    "llm": 7, "vllm": 7,  # vllm: the optional adapter into vLLM (nothing imports it)
    "cluster": 8,
    "runtime": 9,
    "sim": 10,
    "client": 11,
    "bench": 12,
    "server": 13,
    "cli": 14,
    "__main__": 15,
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, module: str, is_package: bool, files: set[str]) -> set[str]:
    found: set[str] = set()
    stack = list(ast.iter_child_nodes(tree))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("andante"))
        elif isinstance(node, ast.ImportFrom):
            found.update(_from_targets(node, module, is_package, files))
        stack.extend(ast.iter_child_nodes(node))
    return found


def _from_targets(
    node: ast.ImportFrom, module: str, is_package: bool, files: set[str]
) -> set[str]:
    """The modules `from X import a, b` reads: X.a where it is a module, else X."""
    if node.level:
        base = module.split(".")
        base = base[: len(base) - node.level + (1 if is_package else 0)]
        name = ".".join([*base, node.module] if node.module else base)
    else:
        name = node.module or ""
    if not name.startswith("andante"):
        return set()
    submodules = {f"{name}.{a.name}" for a in node.names} & files
    return submodules if len(submodules) == len(node.names) else submodules | {name}


def _graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        targets = _imports(tree, name, path.name == "__init__.py", set(files))
        graph[name] = {t for t in targets if t in files and t != name}
    return graph


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "andante"


def test_every_top_level_area_has_a_rank() -> None:
    areas = {p.stem if p.is_file() else p.name for p in PACKAGE.iterdir()
             if (p.is_dir() and (p / "__init__.py").exists()) or p.suffix == ".py"}
    assert areas - {"__init__"} <= set(RANKS), sorted(areas - set(RANKS) - {"__init__"})


def test_no_import_runs_up_a_layer() -> None:
    upward = []
    for module, targets in _graph().items():
        layer = _layer(module)
        if layer == "andante":
            continue
        for target in targets:
            other = _layer(target)
            if other != "andante" and other != layer and RANKS[other] >= RANKS[layer]:
                upward.append(f"{module} -> {target}")
    assert not upward, "\n".join(sorted(upward))


def test_no_cycle_between_files() -> None:
    graph = _graph()
    cycles = [scc for scc in _strongly_connected(graph) if len(scc) > 1]
    assert not cycles, cycles


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    result: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    scc = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        scc.append(top)
                        if top == node:
                            break
                    result.append(scc)
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return result


def test_only_the_vllm_adapter_imports_vllm() -> None:
    """vLLM stays out of andante's core: only andante/vllm/ imports it."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if path.is_relative_to(PACKAGE / "vllm"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level \
                else []
            if any(n == "vllm" or n.startswith("vllm.") for n in names):
                offenders.append(str(path.relative_to(PACKAGE)))
    assert offenders == []
