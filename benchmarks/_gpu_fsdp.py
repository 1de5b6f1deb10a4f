"""Step g of ``gpu_suite.py``: one process of FSDP2 (``torch.distributed.fsdp.fully_shard``, world size 1: nccl on a
GPU, gloo in a smoke run on the CPU) per family, sharded by :func:`ssmhub.training.fsdp.shard_model` with the bf16
``MixedPrecisionPolicy``: a few AdamW steps, each loss finite, the recurrence parameters float32 inside every mixer's
forward (``watch_recurrence_dtypes``) and float32 in the master weights, the blocks' norms bf16 (the policy at
work). Without CUDA (and without ``--smoke``) the step says so and runs nothing."""

from __future__ import annotations

import math
import time
from contextlib import contextmanager

import torch
import torch.distributed as dist
from _gpu_common import Context, Section, failure, free_memory
from _gpu_decode import FAMILIES, VOCAB, build

STEPS = 3


@contextmanager
def process_group_of_one(device: torch.device):
    """A process group of one process (FSDP2 needs one), removed afterwards; an existing one is used as it is."""
    created = not dist.is_initialized()
    if created:
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, device_id=_device_id(device))
    try:
        yield
    finally:
        if created:
            dist.destroy_process_group()


def _device_id(device: torch.device) -> torch.device | None:
    """The CUDA device nccl binds to (None for gloo)."""
    if device.type != "cuda":
        return None
    return torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)


def train_sharded(ctx: Context, name: str) -> dict:
    """``STEPS`` AdamW steps of the family's model sharded with the bf16 policy; what they showed."""
    from torch.distributed.device_mesh import init_device_mesh

    from ssmhub.training.fsdp import BF16_POLICY, shard_model, watch_recurrence_dtypes

    width, layers = ctx.plan["model_width"]
    model = build(name, width, layers, ctx.device).train()
    shard_model(model, mesh=init_device_mesh(ctx.device.type, (1,)), mp_policy=BF16_POLICY)
    optimizer = torch.optim.AdamW(model.optimizer_param_groups(weight_decay=0.1), lr=1e-4)
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(0, VOCAB, (ctx.plan["train_batch"], ctx.plan["fsdp_length"]), generator=generator)
    ids = ids.to(ctx.device)
    norms = set()
    for block in model.base_model.layers:
        block.register_forward_pre_hook(lambda b, _args: norms.add(b.mixer_norm.weight.dtype))
    losses, start = [], 0.0
    with watch_recurrence_dtypes(model) as seen:
        for _ in range(STEPS):
            ctx.sync()
            start = time.perf_counter()
            loss = model(ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
    ms = 1e3 * (time.perf_counter() - start)
    masters = {p.dtype for n, p in model.named_parameters() if ".ssm." in n}
    return {"losses": losses, "seen": seen, "norms": norms, "masters": masters, "ms": ms}


def fsdp_row(ctx: Context, name: str) -> list[str]:
    try:
        got = train_sharded(ctx, name)
    except Exception as error:
        return [name, "–", "–", "–", "–", "–", failure(error)]
    finally:
        free_memory(ctx.device)
    finite = all(math.isfinite(loss) for loss in got["losses"])
    inside = set().union(*got["seen"].values()) if got["seen"] else set()
    ok = finite and inside == {torch.float32} and got["masters"] == {torch.float32} and got["norms"] == {torch.bfloat16}
    losses = ", ".join(f"{loss:.4f}" for loss in got["losses"])
    dtypes = lambda found: ", ".join(sorted(str(d).removeprefix("torch.") for d in found)) or "none"  # noqa: E731
    verdict = "ok" if ok else "failed: a loss not finite or a dtype off"
    return [name, losses, dtypes(inside), dtypes(got["masters"]), dtypes(got["norms"]), f"{got['ms']:.1f}", verdict]


def step_fsdp(ctx: Context, section: Section) -> None:
    """One row per family; a failed row fails the step after the table."""
    if ctx.device.type != "cuda" and not ctx.args.smoke:
        section.text("not run: no CUDA device (FSDP2 on the CPU is tested by tests/training/test_fsdp*.py)")
        return
    width, layers = ctx.plan["model_width"]
    section.text(
        f"One process (world size 1, {'nccl' if ctx.device.type == 'cuda' else 'gloo'}), width {width} × {layers} "
        f"layers, batch {ctx.plan['train_batch']} × L {ctx.plan['fsdp_length']}; `shard_model(model, "
        f"mp_policy=BF16_POLICY)`, {STEPS} AdamW steps. Recurrence dtypes: seen inside each mixer's forward, and of "
        "the master weights; block norms: the dtype the blocks compute with. ms: the last step."
    )
    headers = ["family", "losses", "recurrence in forward", "recurrence masters", "block norms", "step ms", "check"]
    table = section.table(headers)
    with process_group_of_one(ctx.device):
        for name in FAMILIES:
            table.add(*fsdp_row(ctx, name))
    if any(row[-1] != "ok" for row in table.rows):
        raise RuntimeError("an FSDP2 row failed (above)")
