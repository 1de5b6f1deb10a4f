"""The import graph of ``src/ssmhub`` runs one way, and no module reaches into another's private names.

Read from the source with :mod:`ast`, not by importing, so that lazy imports count: every ``import`` and
``from … import`` anywhere in a module (at the top, inside a function, under ``if TYPE_CHECKING``) is an
edge. Relative imports are resolved against the importing module's package, and ``from package import name``
is an edge to ``package.name`` when that is a submodule (to ``package`` itself otherwise). Names built at
run time (``importlib.import_module(some_string)``) are not seen.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

SOURCE_ROOT = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "ssmhub"


def _module_name(path: Path) -> str:
    parts = path.relative_to(SOURCE_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted((SOURCE_ROOT / PACKAGE).rglob("*.py"))}


MODULES = _modules()


def _is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def _resolve_from(module: str, node: ast.ImportFrom) -> str:
    """The absolute name of the module that ``node`` (a ``from … import`` in ``module``) imports from."""
    if node.level == 0:
        return node.module or ""
    package = module if _is_package(module) else module.rpartition(".")[0]
    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
    return f"{base}.{node.module}" if node.module else base


def imports_of(module: str, source: str | None = None) -> list[tuple[str, str | None, int]]:
    """Every ssmhub import in ``module``: (imported module, name taken from it or None, line number).

    ``source`` is the module's text (default: read from its file). A name that is itself a submodule
    (``from . import fftconv``) is reported as that module, with name None.
    """
    if source is None:
        source = MODULES[module].read_text()
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(alias.name, None, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            origin = _resolve_from(module, node)
            for alias in node.names:
                submodule = f"{origin}.{alias.name}"
                if submodule in MODULES:
                    found.append((submodule, None, node.lineno))
                else:
                    found.append((origin, alias.name, node.lineno))
    return [(target, name, line) for target, name, line in found if target in MODULES]


def import_graph() -> dict[str, set[str]]:
    """module -> the ssmhub modules it imports (self-imports dropped)."""
    return {module: {target for target, _, _ in imports_of(module)} - {module} for module in MODULES}


def tangles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan): each holds at least one cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def cycle_through(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A closed path start -> … -> start inside one strongly connected component (breadth-first, shortest)."""
    start = min(component)
    paths = {succ: [start, succ] for succ in sorted(graph[start] & component)}
    frontier = list(paths)
    while start not in paths:
        next_frontier = []
        for node in frontier:
            for succ in sorted(graph[node] & component):
                if succ not in paths:
                    paths[succ] = paths[node] + [succ]
                    next_frontier.append(succ)
        frontier = next_frontier
    return paths[start]


def test_the_walk_sees_lazy_relative_and_submodule_imports():
    source = (
        "import torch\n"
        "from . import butterfly\n"
        "def f():\n"
        "    from .triton import can_run\n"
        "    if True:\n"
        "        import ssmhub.models.inputs\n"
    )
    assert imports_of("ssmhub.ops.fftconv", source) == [
        ("ssmhub.ops.butterfly", None, 2),
        ("ssmhub.ops.triton", "can_run", 4),
        ("ssmhub.models.inputs", None, 6),
    ]


def test_tangles_and_the_cycle_named():
    graph = {"a": {"b"}, "b": {"c", "a"}, "c": {"a"}, "d": {"a"}}
    assert tangles(graph) == [{"a", "b", "c"}]
    assert cycle_through(graph, {"a", "b", "c"}) == ["a", "b", "a"]
    assert tangles({"a": {"b"}, "b": set()}) == []


def test_resolve_relative_imports():
    def resolve(module: str, statement: str) -> str:
        return _resolve_from(module, ast.parse(statement).body[0])

    assert resolve("ssmhub.ops.triton", "from ..fftconv import fft_conv") == "ssmhub.ops.fftconv"  # a package
    assert resolve("ssmhub.ops.butterfly", "from . import fftconv") == "ssmhub.ops"
    assert resolve("ssmhub.models.h3.modeling_h3", "from ...ops.fftconv import fft_conv") == "ssmhub.ops.fftconv"
    assert resolve("ssmhub.models.h3.modeling_h3", "from ssmhub.ops import fft_conv") == "ssmhub.ops"


def test_no_import_cycles():
    graph = import_graph()
    report = [
        f"{' -> '.join(cycle_through(graph, component))}   (all of: {', '.join(sorted(component))})"
        for component in tangles(graph)
    ]
    assert not report, "import cycles in src/ssmhub (lazy imports count):\n" + "\n".join(report)


def _private_reach(module: str, target: str, name: str | None) -> bool:
    """Whether ``module`` importing ``name`` from ``target`` (or ``target`` itself, name None) reaches into
    another module's private parts: an underscore name from another module, or a private submodule
    (``pkg._kernels``) from outside the package that owns it."""
    if name is not None:
        return name.startswith("_") and target != module
    parts = target.split(".")
    for depth, part in enumerate(parts):
        if part.startswith("_"):
            owner = ".".join(parts[:depth])
            return module != owner and not module.startswith(owner + ".")
    return False


def test_private_reach_rules():
    assert _private_reach("ssmhub.ops.butterfly", "ssmhub.ops.fftconv", "_check_conv_args")
    assert not _private_reach("ssmhub.ops.butterfly", "ssmhub.ops.circulant", "check_conv_args")
    assert _private_reach("ssmhub.ops.fftconv", "ssmhub.ops.triton._kernels", None)
    assert not _private_reach("ssmhub.ops.triton", "ssmhub.ops.triton._kernels", None)


def test_no_private_names_imported_from_other_modules():
    offences = [
        f"{MODULES[module].relative_to(SOURCE_ROOT)}:{line}: from {target} import {name}"
        if name is not None
        else f"{MODULES[module].relative_to(SOURCE_ROOT)}:{line}: import {target}"
        for module in MODULES
        for target, name, line in imports_of(module)
        if _private_reach(module, target, name)
    ]
    assert not offences, "private names imported across ssmhub modules:\n" + "\n".join(offences)


@pytest.mark.parametrize(
    ("module", "name"),
    [
        *[("ssmhub.ops.fftconv", name) for name in ("fft_conv", "fft_conv_ref", "fft_size", "smooth_fft_size")],
        *[("ssmhub.ops.fftconv", name) for name in ("conv_circulant", "BACKENDS", "BackendFallbackWarning")],
        *[("ssmhub.ops.butterfly", name) for name in ("butterfly_conv", "dft_matrix", "BLOCK_SIZES")],
        *[("ssmhub.ops.triton", name) for name in ("triton_conv", "can_run", "MAX_FFT_SIZE")],
        *[
            ("ssmhub.models.serpent.convert_mamba", name)
            for name in ("convert_mamba_checkpoint", "is_mamba_checkpoint", "mamba_state_dict_to_serpent")
        ],
        ("ssmhub.models.serpent.convert_mamba", "serpent_config_from_mamba"),
    ],
)
def test_public_names_stay_where_they_were(module, name):
    """Moving shared helpers to leaf modules keeps every public name importable where it was."""
    assert hasattr(importlib.import_module(module), name)
