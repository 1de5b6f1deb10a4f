"""Write a family's code next to its weights, so a saved folder loads with ``trust_remote_code=True``.

transformers' remote-code loader only follows single-dot relative imports between files that sit
flat in one folder (``from .modeling_x import X``). ssmhub's code lives in tiers
(``ssmhub/ops``, ``ssmhub/layers``, ``ssmhub/models``), so this module collects every ssmhub module
the family's config and model classes import, transitively, writes each as one flat file and
rewrites their ssmhub imports to point at the flat names. It then records ``auto_map`` in
``config.json``. Every file is written under a temporary name and renamed into place.
"""

from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path

from ..fileio import write_json_atomic, write_text_atomic
from .auto import FAMILIES

__all__ = ["bundle_sources", "push_saved_folder", "write_remote_code"]

PACKAGE = "ssmhub"


def _source_path(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ImportError(f"cannot find the source of module {module}")
    return Path(spec.origin)


def _is_package(module: str) -> bool:
    return _source_path(module).name == "__init__.py"


def _resolve(module: str, node: ast.ImportFrom) -> str | None:
    """Absolute name of the ssmhub module an ``from ... import`` statement reads, or None if outside ssmhub."""
    if node.level == 0:
        name = node.module or ""
        return name if name == PACKAGE or name.startswith(PACKAGE + ".") else None
    package = module if _is_package(module) else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def _ssmhub_imports(module: str) -> list[tuple[ast.ImportFrom, str]]:
    tree = ast.parse(_source_path(module).read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == PACKAGE for a in node.names):
            raise ValueError(f"{module}: 'import {PACKAGE}...' cannot be bundled; use 'from ... import name'")
        if isinstance(node, ast.ImportFrom) and (target := _resolve(module, node)) is not None:
            found.append((node, target))
    return found


def _flat_name(module: str) -> str:
    base = module.rpartition(".")[2]
    if base.startswith(("configuration_", "modeling_")):
        return base
    return "_".join(module.split("."))


def bundle_sources(root_modules: list[str]) -> dict[str, str]:
    """Flat file name (without .py) -> rewritten source, for ``root_modules`` and all they import from ssmhub."""
    modules, pending = [], list(root_modules)
    while pending:
        module = pending.pop()
        if module in modules:
            continue
        modules.append(module)
        pending.extend(target for _, target in _ssmhub_imports(module))
    flat = {module: _flat_name(module) for module in modules}
    if len(set(flat.values())) != len(flat):
        raise ValueError(f"two modules share a flat file name: {sorted(flat.items())}")

    sources = {}
    for module in modules:
        lines = _source_path(module).read_text().splitlines(keepends=True)
        # replace from the bottom so earlier line numbers stay valid
        for node, target in sorted(_ssmhub_imports(module), key=lambda item: -item[0].lineno):
            names = ", ".join(a.name if a.asname is None else f"{a.name} as {a.asname}" for a in node.names)
            if any(a.name != "*" and f"{target}.{a.name}" in flat for a in node.names):
                raise ValueError(f"{module}: import names from {target}, not its submodules")
            indent = " " * node.col_offset
            lines[node.lineno - 1 : node.end_lineno] = [f"{indent}from .{flat[target]} import {names}\n"]
        sources[flat[module]] = "".join(lines)
    return sources


def write_remote_code(model_class: type, save_directory: str) -> dict[str, str]:
    """Write the flat code bundle of ``model_class``'s family into ``save_directory`` and set
    ``auto_map`` in its ``config.json``. Returns the auto_map."""
    model_type = model_class.config_class.model_type
    if model_type not in FAMILIES:
        raise ValueError(f"model_type {model_type!r} is not a registered ssmhub family")
    classes = FAMILIES[model_type]
    sources = bundle_sources(sorted({cls.__module__ for cls in classes.values()}))
    directory = Path(save_directory)
    for name, text in sources.items():
        write_text_atomic(directory / f"{name}.py", text)
    auto_map = {auto: f"{_flat_name(cls.__module__)}.{cls.__name__}" for auto, cls in classes.items()}
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text())
    config["auto_map"] = auto_map
    write_json_atomic(config_path, config, sort_keys=True)
    return auto_map


def push_saved_folder(
    folder,
    repo_id: str | None = None,
    token=None,
    commit_message: str | None = None,
    create_pr: bool = False,
    private: bool | None = None,
) -> str:
    """Upload a folder that ``save_pretrained(..., push_to_hub=True, save_code=True)`` wrote, code included
    (transformers' own upload runs before the code is written); ``repo_id`` defaults to the folder's name,
    as in transformers. Returns the commit URL."""
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    repo_id = api.create_repo(repo_id or Path(folder).name, private=private, exist_ok=True).repo_id
    return str(
        api.upload_folder(folder_path=str(folder), repo_id=repo_id, commit_message=commit_message, create_pr=create_pr)
    )
