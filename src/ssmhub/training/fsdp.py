"""FSDP2 (``torch.distributed.fsdp.fully_shard``) for ssmhub models, with the recurrence kept in float32.

FSDP2 shards each group of parameters across the data-parallel ranks and all-gathers a group in the
``param_dtype`` of its :class:`~torch.distributed.fsdp.MixedPrecisionPolicy` before the forward of the module it
was applied to (https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html). A bf16 policy on a whole block
would therefore hand the mixer bfloat16 recurrence parameters (a |λ| of 0.9997 is 1.0 in bfloat16), which ssmhub
otherwise keeps in float32 (``_keep_in_fp32_modules_strict = ["ssm"]``, :mod:`ssmhub.ops.precision`).

:func:`shard_model` shards bottom-up so that every group has one dtype:

1. in each mixer that owns a recurrence submodule (``ssm``), every largest submodule without one whose forward
   runs (the projections; found by one probe forward, :func:`called_modules`) gets the caller's policy;
2. the mixer itself gets a float32 policy: its group is what remains, the ``ssm`` parameters. The ``ssm``
   module cannot be the unit: FSDP2 unshards in forward hooks, and mixers read ``self.ssm.<name>``
   without calling ``ssm``'s forward, so its parameters would stay sharded DTensors ("mixed torch.Tensor and
   DTensor"). A child read but never called (Mamba's ``conv1d`` taps) stays in this float32 group too;
3. each block (``model.base_model.layers[i]``: norms, MLP) and the root (embeddings, final norm, tied head)
   get the caller's policy; the root's leaves the model's floating inputs as they come
   (``cast_forward_inputs=False``): a loss normaliser such as ``num_items_in_batch`` must not round to bf16, and
   the blocks cast their own inputs.

0-d parameters (SeRpEnt's ``log_grid_step``), which ``fully_shard`` refuses, stay whole on every rank
(:func:`replicate_scalar_parameters`).

No unit returns a view (:func:`outputs_without_views`). FSDP2 registers its pre-backward hook (the all-gather of the
unit's parameters before the unit's backward) on the output tensors; an in-place op on an output that is a view
rebases its autograd history onto the view's base and skips that hook, so the backward would run on sharded
parameters. ``nn.Linear`` with a bias on a (B, L, ·) input returns a view (PyTorch computes it as a 2-D ``addmm``
and views the result back), and so does every unit whose output is such a Linear's (DLR's mixer, BDLRNN's
output projection); such outputs are copied once before FSDP2 sees them.

The result computes what ``model.to(torch.bfloat16)`` computes (ssmhub's ``_apply`` keeps ``ssm`` in float32),
with float32 master weights and optimizer state. Test: tests/training/test_fsdp2.py (two CPU processes, gloo).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

__all__ = [
    "BF16_POLICY",
    "RECURRENCE_MODULE",
    "called_modules",
    "clip_grad_norm_",
    "float32_policy",
    "half_precision_parts",
    "load_sharded_checkpoint",
    "outputs_without_views",
    "recurrence_units",
    "replicate_scalar_parameters",
    "save_sharded_checkpoint",
    "shard_model",
    "unsharded_copy",
    "watch_recurrence_dtypes",
]

RECURRENCE_MODULE = "ssm"  # the submodule of a mixer that holds its recurrence parameters (RecurrentPreTrainedModel)

# bf16 compute, float32 gradient reduction: the usual FSDP2 choice (a sum of bf16 gradients over ranks rounds each).
BF16_POLICY = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def float32_policy() -> MixedPrecisionPolicy:
    """The policy of a recurrence group: all-gathered and reduced in float32, and its module's inputs left as they
    come (a bf16 activation, as in a bf16 model), since ssmhub's recurrence ops cast to float32 themselves."""
    return MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32, cast_forward_inputs=False)


def _holds_recurrence(module: nn.Module) -> bool:
    return any(name.rpartition(".")[2] == RECURRENCE_MODULE for name, _ in module.named_modules() if name)


def recurrence_units(model: nn.Module) -> list[nn.Module]:
    """The mixers of ``model``'s blocks that own a recurrence submodule (attention mixers own none)."""
    return [block.mixer for block in model.base_model.layers if _holds_recurrence(block.mixer)]


def called_modules(model: nn.Module, num_tokens: int = 8) -> set[int]:
    """ids of the modules whose forward runs in a forward of ``num_tokens`` tokens (no cache, no gradient; the
    random state is restored after it, so dropout draws are unchanged). FSDP2 gathers a group in the forward hooks
    of its module, so only such a module can hold a group of its own: a mixer may read a child's weight without
    calling it (Mamba's depthwise convolution taps)."""
    called: set[int] = set()
    hooks = [module.register_forward_pre_hook(lambda m, _args: called.add(id(m))) for module in model.modules()]
    device = next(model.parameters()).device
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            model(input_ids=torch.zeros(1, num_tokens, dtype=torch.long, device=device), use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
    return called


def half_precision_parts(module: nn.Module, called: set[int]) -> list[nn.Module]:
    """The largest submodules of ``module`` that hold parameters but no recurrence submodule and whose forward
    runs (ids in ``called``), in order. The parameters of the others stay in ``module``'s float32 group."""
    parts = []
    for name, child in module.named_children():
        if name == RECURRENCE_MODULE:
            continue
        if _holds_recurrence(child):
            parts += half_precision_parts(child, called)
        elif id(child) in called and next(child.parameters(), None) is not None:
            parts.append(child)
    return parts


def shard_model(
    model: nn.Module,
    mesh=None,
    mp_policy: MixedPrecisionPolicy | None = None,
    reshard_after_forward: bool | None = None,
) -> nn.Module:
    """Apply ``fully_shard`` to an ssmhub model in place (module docstring): per block, with ``mp_policy``
    (default: no mixed precision), except that the recurrence parameters keep a float32 group of their own.

    ``mesh``: a 1-D DeviceMesh (default: FSDP2's, over the default process group). ``reshard_after_forward``:
    as ``fully_shard``'s; None frees gathered parameters after forward except the root's. Build the optimizer
    after this call: sharding replaces the parameters with DTensors.
    """
    policy = mp_policy or MixedPrecisionPolicy()
    scalars = replicate_scalar_parameters(model, mesh)
    shard = dict(mesh=mesh, reshard_after_forward=reshard_after_forward, ignored_params=scalars or None)
    split = policy.param_dtype not in (None, torch.float32)
    called = called_modules(model) if split else set()
    for block in model.base_model.layers:
        if split and _holds_recurrence(block.mixer):
            for part in half_precision_parts(block.mixer, called):
                _shard_unit(part, mp_policy=policy, **shard)
            _shard_unit(block.mixer, mp_policy=float32_policy(), **shard)
        _shard_unit(block, mp_policy=policy, **shard)
    _shard_unit(model, mp_policy=dataclasses.replace(policy, cast_forward_inputs=False), **shard)
    return model


def _shard_unit(module: nn.Module, **options) -> None:
    """``fully_shard(module, **options)``, its outputs first made views of nothing (:func:`outputs_without_views`,
    a forward hook registered before FSDP2's, so it runs first)."""
    module.register_forward_hook(lambda _module, _args, output: outputs_without_views(output))
    fully_shard(module, **options)


def outputs_without_views(output):
    """``output`` (a tensor, or tuples, lists and dicts of them: a ``ModelOutput`` is changed in place) with every
    tensor that requires grad and is a view replaced by a copy of it (module docstring: FSDP2's pre-backward hook
    survives in-place ops on a unit's outputs only if they are no views). Other values are returned as they are."""
    if isinstance(output, torch.Tensor):
        return output.clone() if output.requires_grad and output._is_view() else output
    if isinstance(output, list):
        return [outputs_without_views(value) for value in output]
    if isinstance(output, tuple):
        values = [outputs_without_views(value) for value in output]
        return type(output)(*values) if hasattr(output, "_fields") else tuple(values)
    if isinstance(output, dict):
        for key, value in output.items():
            output[key] = outputs_without_views(value)
    return output


def replicate_scalar_parameters(model: nn.Module, mesh=None) -> set[nn.Parameter]:
    """The 0-d parameters of ``model`` (SeRpEnt's ``log_grid_step``), which ``fully_shard`` refuses ("doesn't
    support scalar parameters"): they stay whole and float32 on every rank (``ignored_params``, which FSDP2 neither
    casts nor reduces), and a hook averages each one's gradient over the ranks once it is accumulated, as DDP would.
    """
    scalars = {param for param in model.parameters() if param.dim() == 0 and param.requires_grad}
    group = mesh.get_group() if mesh is not None else None
    for param in scalars:
        param.register_post_accumulate_grad_hook(lambda p: _average_over_ranks(p.grad, group))
    return scalars


def _average_over_ranks(tensor: torch.Tensor, group) -> None:
    dist.all_reduce(tensor, group=group)  # gloo has no ReduceOp.AVG: sum, then divide
    tensor.div_(dist.get_world_size(group))


@contextmanager
def watch_recurrence_dtypes(model: nn.Module) -> Iterator[dict[str, set]]:
    """Record, at each recurrent mixer's forward, the dtype of every recurrence parameter it reads (or "sharded"
    for a DTensor shard), by name: the check that sharding left them float32 and gathered. The hooks run after
    FSDP2's pre-forward all-gather (registered earlier), so they see the parameters the mixer computes with."""
    seen: dict[str, set] = {}

    def record(prefix):
        def hook(mixer, _args):
            for name, param in mixer.named_parameters():
                if f".{RECURRENCE_MODULE}." in f".{name}":
                    dtype = "sharded" if isinstance(param, DTensor) else param.dtype
                    seen.setdefault(f"{prefix}.{name}", set()).add(dtype)

        return hook

    names = {id(module): name for name, module in model.named_modules()}
    handles = [mixer.register_forward_pre_hook(record(names[id(mixer)])) for mixer in recurrence_units(model)]
    try:
        yield seen
    finally:
        for handle in handles:
            handle.remove()


def save_sharded_checkpoint(checkpoint_dir: str, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Each rank writes its shards of the model and optimizer state with ``torch.distributed.checkpoint``
    (https://pytorch.org/tutorials/recipes/distributed_checkpoint_recipe.html); any world size can load them."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=checkpoint_dir)


def load_sharded_checkpoint(checkpoint_dir: str, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Load :func:`save_sharded_checkpoint`'s files into a model sharded as the saved one was and its optimizer
    (built, no step taken): DCP reads in place into this rank's shards, then ``set_state_dict`` installs them."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optimizer": optimizer_state}
    dcp.load(state, checkpoint_id=checkpoint_dir)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])


def clip_grad_norm_(parameters: Iterable[nn.Parameter], max_norm: float) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` (2-norm) over a sharded model's gradients: the DTensor shards' squares
    summed over the ranks, the whole (replicated, already averaged) 0-d parameters' counted once; every gradient
    scaled by ``min(1, max_norm / (norm + 1e-6))`` as torch does. Returns the total norm (float32)."""
    grads = [param.grad for param in parameters if param.grad is not None]
    shards = [grad.to_local() for grad in grads if isinstance(grad, DTensor)]  # views of each rank's shard
    whole = [grad for grad in grads if not isinstance(grad, DTensor)]
    device = (shards or whole)[0].device if grads else torch.device("cpu")
    squares = torch.zeros((), dtype=torch.float32, device=device)
    for shard in shards:
        squares += shard.float().pow(2).sum()
    if shards:
        mesh = next(grad for grad in grads if isinstance(grad, DTensor)).device_mesh
        dist.all_reduce(squares, group=mesh.get_group())
    for grad in whole:
        squares += grad.float().pow(2).sum().to(device)
    norm = squares.sqrt()
    scale = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for grad in (*shards, *whole):
        grad.mul_(scale.to(grad.device, grad.dtype))
    return norm


def unsharded_copy(model: nn.Module) -> nn.Module | None:
    """On rank 0, a plain (unsharded, float32 on the CPU) model of ``model``'s class and config holding its full
    weights, e.g. to ``save_pretrained``; None on the other ranks. Every rank must call it (it all-gathers)."""
    weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.get_rank() != 0:
        return None
    plain_class = next(cls for cls in type(model).__mro__ if not issubclass(cls, FSDPModule))
    plain = plain_class(model.config)
    plain.load_state_dict(weights)
    return plain
