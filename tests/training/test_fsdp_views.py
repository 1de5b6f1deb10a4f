"""No unit that :func:`ssmhub.training.fsdp.shard_model` makes returns a view (:func:`outputs_without_views`).

FSDP2 all-gathers a unit's parameters for its backward in a hook on the unit's output tensors; an in-place op on an
output that is a view moves its autograd history onto the view's base and that hook never runs. Under the bf16
policy the projections of a mixer are units of their own, and ``nn.Linear`` with a bias returns a view for a
(B, L, ·) input (DLR's ``output_linear``, BDLRNN's output projection). One process (gloo, world size 1) is enough:
the hook and the view do not depend on the number of ranks.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

from ssmhub.models import FAMILIES
from ssmhub.training.fsdp import BF16_POLICY, shard_model

MODEL_CONFIG = {"vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 2, "intermediate_size": 32}


@pytest.fixture
def process_group_of_one():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def sharded(family: str):
    torch.manual_seed(0)
    model = FAMILIES[family]["AutoModelForCausalLM"](FAMILIES[family]["AutoConfig"](**MODEL_CONFIG))
    return shard_model(model, mp_policy=BF16_POLICY)


def _tensors(output) -> list[torch.Tensor]:
    if isinstance(output, torch.Tensor):
        return [output]
    values = output.values() if isinstance(output, dict) else output if isinstance(output, (tuple, list)) else []
    return [tensor for value in values for tensor in _tensors(value)]


def _ids() -> torch.Tensor:
    return torch.randint(64, (2, 12), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_no_sharded_unit_returns_a_view(family, process_group_of_one):
    """Every unit's outputs, as the code after it sees them (a hook after FSDP2's), are no views; FSDP2 warns of
    none."""
    model = sharded(family)
    views = []
    for name, module in model.named_modules():
        if isinstance(module, FSDPModule):
            module.register_forward_hook(
                lambda _m, _args, out, name=name: views.extend(name for t in _tensors(out) if t._is_view())
            )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model(input_ids=_ids(), labels=_ids()).loss.backward()
    assert views == []
    assert [str(w.message) for w in caught if "view tensor" in str(w.message)] == []


def test_an_in_place_op_on_a_unit_output_keeps_the_gradients(process_group_of_one):
    """An in-place op on a projection unit's output (× 1, exact) leaves every gradient as it was, bit for bit (the
    same ops on the same inputs): FSDP2's pre-backward hook still gathers the unit's parameters for its backward."""
    grads = []
    for in_place in (False, True):
        model = sharded("dlr")
        if in_place:
            for block in model.base_model.layers:
                block.mixer.output_linear.register_forward_hook(lambda _m, _args, out: out.mul_(1.0))
        model(input_ids=_ids(), labels=_ids()).loss.backward()
        grads.append({name: p.grad.full_tensor() for name, p in model.named_parameters()})
    assert grads[0].keys() == grads[1].keys()
    for name, grad in grads[0].items():
        assert torch.equal(grads[1][name], grad), name
