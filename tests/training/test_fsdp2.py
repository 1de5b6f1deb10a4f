"""FSDP2 (``fully_shard``) over two CPU processes (gloo) with a bf16 policy: :func:`ssmhub.training.fsdp.shard_model`.

One ``torch.multiprocessing.spawn`` of two ranks trains a tiny causal LM for ``STEPS`` AdamW steps, each rank on its
half of a global batch, saving a sharded checkpoint (DCP) after step ``SAVE_AT``; then a fresh sharded model and
optimizer load it and train on. The parent process trains the same model unsharded on the whole batch with the
computation the policy promises: a bf16 copy of the float32 master weights (``model.to(torch.bfloat16)``, which
keeps the recurrence float32) runs forward and backward, the master weights take the AdamW step.

Tolerance of sharded against unsharded. Both run the same bf16 ops on the same rows; they differ where a sum is
split: each rank rounds its half-batch weight gradients to bf16 (u = 2^-8 relative) before FSDP2 averages them in
float32, where the unsharded run rounds the whole sum once. Adam divides each gradient by its own RMS, so a
relative error of u in a gradient moves an update by about u of the learning rate, and a loss averaged over the
batch's tokens by much less than u of itself: the bound is u (3.9e-3) of the loss. Measured (x86, DLR and SeRpEnt):
1e-7 at the first step, 2.6e-4 at the fourth, a margin of 15x. The losses cannot tell a bf16 recurrence apart in
so small and short a run (a per-block bf16 policy without the float32 groups stays within 6e-4); the dtypes seen
inside each mixer's forward do, and are checked.

A resumed run repeats the uninterrupted run's ops in the same processes from copied state, but two runs are not
promised the same bits (tests/comparisons.py): their losses agree within ``TRAINING_REL``; the loaded shards are
copies, so they equal the saved ones bit for bit.
"""

from __future__ import annotations

import copy
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from comparisons import same_values
from training_helpers import TRAINING_REL

from ssmhub.models import FAMILIES
from ssmhub.training.fsdp import (
    BF16_POLICY,
    load_sharded_checkpoint,
    save_sharded_checkpoint,
    shard_model,
    watch_recurrence_dtypes,
)

WORLD, STEPS, SAVE_AT, BATCH, SEQ_LEN, VOCAB, LR, SEED = 2, 4, 2, 4, 16, 64, 1e-2, 0
BF16_UNIT_ROUNDOFF = 2.0**-8
LOSS_REL = BF16_UNIT_ROUNDOFF  # see the module docstring
MODEL_CONFIG = {"vocab_size": VOCAB, "hidden_size": 16, "num_hidden_layers": 2, "intermediate_size": 32}


def build(family: str):
    """The tiny causal LM of ``family``, initialized from ``SEED`` (the same weights on every rank), and its AdamW."""
    torch.manual_seed(SEED)
    return FAMILIES[family]["AutoModelForCausalLM"](FAMILIES[family]["AutoConfig"](**MODEL_CONFIG))


def adamw(model):
    return torch.optim.AdamW(model.optimizer_param_groups(weight_decay=0.01), lr=LR)


def batch(step: int, rank: int = 0, world: int = 1) -> torch.Tensor:
    """This rank's rows of step ``step``'s global batch of random tokens."""
    ids = torch.randint(VOCAB, (BATCH, SEQ_LEN), generator=torch.Generator().manual_seed(1000 + step))
    rows = BATCH // world
    return ids[rank * rows : (rank + 1) * rows]


def sharded_step(model, optimizer, step: int, rank: int) -> float:
    """One AdamW step on this rank's half; the global loss (every rank has as many tokens: the mean of the ranks')."""
    ids = batch(step, rank, WORLD)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    total = loss.detach().clone()
    dist.all_reduce(total)
    return total.item() / WORLD


def sharded(family: str):
    model = shard_model(build(family), mp_policy=BF16_POLICY)
    return model, adamw(model)


def local_shards(model) -> dict[str, torch.Tensor]:
    return {name: getattr(p, "_local_tensor", p).detach().clone() for name, p in model.named_parameters()}


def watch_block_dtypes(model) -> set:
    """The dtype of each block's norm weight at the block's forward: the caller's bf16 policy at work."""
    seen = set()
    for block in model.base_model.layers:
        block.register_forward_pre_hook(lambda b, _args: seen.add(b.mixer_norm.weight.dtype))
    return seen


def train_with_checkpoint(family: str, checkpoint_dir: str, rank: int) -> dict:
    """``STEPS`` sharded steps, a checkpoint after ``SAVE_AT``, then a fresh model resumed from it to the end."""
    model, optimizer = sharded(family)
    block_dtypes = watch_block_dtypes(model)
    losses, saved = [], None
    with watch_recurrence_dtypes(model) as recurrence_dtypes:
        for step in range(STEPS):
            losses.append(sharded_step(model, optimizer, step, rank))
            if step + 1 == SAVE_AT:
                save_sharded_checkpoint(checkpoint_dir, model, optimizer)
                saved = local_shards(model)
    model, optimizer = sharded(family)
    load_sharded_checkpoint(checkpoint_dir, model, optimizer)
    for name, tensor in local_shards(model).items():
        assert torch.equal(tensor, saved[name]), name  # a copy of the saved shard: its bits are promised
    resumed = [sharded_step(model, optimizer, step, rank) for step in range(SAVE_AT, STEPS)]
    return {"losses": losses, "resumed": resumed, "recurrence": recurrence_dtypes, "blocks": block_dtypes}


def worker(rank: int, port: int, family: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        result = train_with_checkpoint(family, f"{out_dir}/checkpoint", rank)
        if rank == 0:
            torch.save(result, f"{out_dir}/result.pt")
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def unsharded_losses(family: str) -> list[float]:
    """The reference: one process, the whole batch, a bf16 working copy of float32 master weights per step."""
    master = build(family)
    optimizer = adamw(master)
    losses = []
    for step in range(STEPS):
        working = copy.deepcopy(master).to(torch.bfloat16)  # the recurrence stays float32 (RecurrentPreTrainedModel)
        ids = batch(step)
        loss = working(input_ids=ids, labels=ids).loss
        loss.backward()
        for param, used in zip(master.parameters(), working.parameters(), strict=True):
            param.grad = used.grad.float()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def check_family(family: str, tmp_path) -> None:
    mp.spawn(worker, args=(free_port(), family, str(tmp_path)), nprocs=WORLD)
    result = torch.load(tmp_path / "result.pt", weights_only=False)
    assert result["recurrence"] and all(d == {torch.float32} for d in result["recurrence"].values()), result
    assert result["blocks"] == {torch.bfloat16}
    losses = torch.tensor(result["losses"])
    reference = torch.tensor(unsharded_losses(family))
    torch.testing.assert_close(losses, reference, rtol=LOSS_REL, atol=0)
    same_values(torch.tensor(result["resumed"]), losses[SAVE_AT:], rel=TRAINING_REL, what="resumed losses")


def test_fsdp2_bf16_matches_one_process_and_resumes_exactly(tmp_path):
    check_family("dlr", tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["bdlrnn", "h3", "serpent"])
def test_fsdp2_other_families(family, tmp_path):
    check_family(family, tmp_path)
