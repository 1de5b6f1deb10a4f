"""layers/stacking.py: the batched linear maps of a decode step against ``F.linear`` on each module's own slice."""

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from ssmhub.layers.stacking import linear_maps, row_linear

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _assert_linear(y, x, weight, bias):
    """y within float32's bound of x Wᵀ + b computed in float64: n·eps·(|x| |W|ᵀ + |b|) for n = fan_in + 1 terms."""
    bias = torch.zeros(weight.shape[0]) if bias is None else bias
    exact = F.linear(x.double(), weight.double(), bias.double())
    bound = (weight.shape[1] + 1) * torch.finfo(torch.float32).eps * F.linear(x.abs(), weight.abs(), bias.abs())
    assert ((y.double() - exact).abs() <= bound.double()).all()


@pytest.mark.parametrize("shape", [(7,), (1, 7), (2, 3, 7), (1, 1, 7)])
@pytest.mark.parametrize("bias", [True, False])
def test_row_linear_is_f_linear(shape, bias):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=gen)
    weight = torch.randn(5, 7, generator=gen)
    b = torch.randn(5, generator=gen) if bias else None
    y = row_linear(x, weight, b)
    assert y.shape == (*shape[:-1], 5)
    _assert_linear(y, x, weight, b)


def test_stacked_maps_apply_each_module_to_its_own_slice():
    torch.manual_seed(0)
    linears = [nn.Linear(6, 4), nn.Linear(6, 4), nn.Linear(6, 4)]
    x = torch.randn(3, 2, 6)  # (R, B, in)
    y = linear_maps(linears)(x).detach()  # (R, B, out)
    for y_r, linear, x_r in zip(y, linears, x):
        _assert_linear(y_r, x_r, linear.weight.detach(), linear.bias.detach())


class _Wrapped(nn.Module):  # a linear module that is not a plain nn.Linear (as a quantized one): run as itself
    def __init__(self, linear):
        super().__init__()
        self.linear = linear

    def forward(self, x):
        return self.linear(x)


@pytest.mark.parametrize("wrap", [False, True])
def test_a_map_of_one_module_serves_every_leading_row(wrap):
    # one module's map takes x (N, B, in) for any N (a shared Mamba stepped as N one-row mixers): each row through
    # the one module, its weight broadcast (plain) or the module called on all of them (any other linear module)
    torch.manual_seed(0)
    linear = nn.Linear(6, 4)
    x = torch.randn(5, 1, 6)  # (N, 1, in)
    y = linear_maps([_Wrapped(linear) if wrap else linear])(x)
    assert y.shape == (5, 1, 4)
    _assert_linear(y.detach(), x, linear.weight.detach(), linear.bias.detach())
