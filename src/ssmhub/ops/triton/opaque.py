"""Triton launches as opaque PyTorch operators, so that ``torch.compile(fullgraph=True)`` captures a model around them.

Dynamo cannot trace a Triton launch made from Python helpers (imports, device contexts, launch grids computed on
the host): it would break the graph there. :func:`opaque_op` registers a launch as a ``torch.library.custom_op`` with
a fake (shape-only) implementation and its autograd formula, the way PyTorch documents for custom kernels: the
compiled graph calls the operator as one node and never looks inside, on a GPU and, under ``TRITON_INTERPRET=1``,
on a CPU (where the tests compile models around the interpreted kernels).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["NAMESPACE", "opaque_op"]

NAMESPACE = "ssmhub"


def opaque_op(
    name: str,
    launch: Callable,
    fake: Callable,
    backward: Callable | None = None,
    setup_context: Callable | None = None,
) -> Callable:
    """``launch`` (fully type-annotated, returning new tensors) as the operator ``ssmhub::name``, with ``fake``
    giving its outputs' shapes and, when given, ``backward`` / ``setup_context`` as its autograd formula
    (``torch.library.register_autograd``'s). An operator of that name registered already (the same module loaded
    twice, as a remote-code copy beside the installed package) is reused."""
    existing = getattr(getattr(torch.ops, NAMESPACE), name, None)  # torch.ops makes namespaces on demand
    if existing is not None:
        return existing.default
    op = torch.library.custom_op(f"{NAMESPACE}::{name}", mutates_args=())(launch)
    op.register_fake(fake)
    if backward is not None:
        op.register_autograd(backward, setup_context=setup_context)
    return op
