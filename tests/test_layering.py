"""The layering rules of services/, checked from the code's own imports (ast, every import statement,
including those made lazily inside functions and those under TYPE_CHECKING: a type-only import still
ties two modules together):

- no import cycles anywhere in services/;
- services/common imports no service;
- the gateway and the placer import nothing from the worker;
- the worker's model code imports nothing from its engine;
- the scheduler and the scheduling policy import no torch, not even through another module.

`from package import name` depends on package.name when that is a module, else on the package.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterable
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SERVICES = ("services.gateway", "services.placer", "services.worker", "services.telemetry", "services.mesh")


@cache
def modules() -> dict[str, Path]:
    found = {}
    for path in (ROOT / "services").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


@cache
def imports_of(module: str) -> frozenset[str]:
    """Every module (of services/, or the top-level name of any other) module imports."""
    path = modules()[module]
    known = modules()
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, module, path.name == "__init__.py")
            submodules = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in known]
            found.update(submodules)
            if len(submodules) < len(node.names):
                found.add(base)
    return frozenset(name if name in known else name.split(".")[0] for name in found) - {module}


def _absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".") if is_package else module.split(".")[:-1]
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join([*parts, *([node.module] if node.module else [])])


def _within(name: str, packages: Iterable[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def import_cycles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    graph = {m: sorted(d for d in imports_of(m) if d in modules()) for m in modules()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(graph[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(graph[nxt])))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        cycles.append(sorted(component))
    return cycles


def reachable(module: str) -> set[str]:
    seen: set[str] = set()
    todo = [module]
    while todo:
        for dep in imports_of(todo.pop()):
            if dep not in seen:
                seen.add(dep)
                if dep in modules():
                    todo.append(dep)
    return seen


def test_no_import_cycles() -> None:
    assert import_cycles() == []


@pytest.mark.parametrize(
    ("importers", "forbidden"),
    [
        (("services.common",), SERVICES),
        (("services.gateway", "services.placer"), ("services.worker",)),
        (("services.worker.models",), ("services.worker.engine",)),
        (("services",), ("sim", "bench")),  # the simulator and the benchmarks use the services, not back
    ],
)
def test_layers_import_only_downwards(importers: tuple[str, ...], forbidden: tuple[str, ...]) -> None:
    wrong = sorted(
        f"{m} -> {d}"
        for m in modules()
        if _within(m, importers)
        for d in imports_of(m)
        if _within(d, forbidden)
    )
    assert wrong == []


@pytest.mark.parametrize("package", ["services.worker.engine.scheduler", "services.worker.engine.policy"])
def test_scheduling_needs_no_torch(package: str) -> None:
    for module in (m for m in modules() if _within(m, (package,))):
        assert "torch" not in reachable(module), module


def test_scheduling_loads_no_torch_when_imported() -> None:
    """What Python does on import, parent packages' __init__ included (which the walk above does not
    follow): a fresh interpreter importing every scheduler and policy module has no torch loaded."""
    wanted = sorted(
        m
        for m in modules()
        if _within(m, ("services.worker.engine.scheduler", "services.worker.engine.policy"))
    )
    script = (
        f"import importlib, sys\nfor m in {wanted!r}: importlib.import_module(m)\n"
        "print('torch' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "False"


def test_the_checks_see_real_imports() -> None:
    """The rules above are only as good as the import reader: it must see what Python would."""
    assert "services.common.errors" in imports_of("services.gateway.router")
    assert "grpc" in imports_of("services.common.errors")
    assert "torch" in reachable("services.worker.engine.llm_engine")
    assert len(modules()) > 100


@pytest.mark.parametrize(
    "module",
    [f"services.worker.server.{m}" for m in ("servicer", "streams", "heartbeat", "metrics", "model_builder")],
)
def test_event_loop_readers_use_the_engine_snapshot(module: str) -> None:
    """The worker's event-loop side reads AsyncLLM.snapshot (engine/snapshot.py), published by the
    engine thread, never the scheduler's, block manager's or stats' live structures it mutates."""
    tree = ast.parse(modules()[module].read_text())
    touched = sorted(
        ast.unparse(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and (
            node.attr in ("scheduler", "block_manager")
            or (node.attr == "stats" and ast.unparse(node.value).endswith("engine"))
        )
    )
    assert touched == [], touched
