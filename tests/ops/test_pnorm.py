"""vector_p_norm against its oracle, torch.linalg.vector_norm: values and gradients."""

import math

import pytest
import torch

from ssmhub.ops.pnorm import vector_p_norm


@pytest.mark.parametrize("p", [1.2, 1.5, 3.0, 1.0, 2.0, math.inf])
@pytest.mark.parametrize("dim,keepdim", [(-2, False), (-2, True), (0, False), (-1, True)])
def test_matches_torch_values_and_gradients(p, dim, keepdim):
    """float64 values and gradients equal torch's, with exact zeros in some entries and one all-zero vector."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 4, generator=g, dtype=torch.float64)
    x[0, 1, 2] = 0.0  # a zero entry: |x|^p = 0, gradient 0
    x[1, :, 3] = 0.0  # an all-zero column (dim = -2): norm 0, gradient 0
    ours_x, ref_x = x.clone().requires_grad_(), x.clone().requires_grad_()
    ours = vector_p_norm(ours_x, p, dim=dim, keepdim=keepdim)
    ref = torch.linalg.vector_norm(ref_x, ord=p, dim=dim, keepdim=keepdim)
    assert ours.shape == ref.shape
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
    weights = torch.randn(ref.shape, generator=g, dtype=torch.float64)
    (ours * weights).sum().backward()
    (ref * weights).sum().backward()
    assert torch.isfinite(ours_x.grad).all()
    torch.testing.assert_close(ours_x.grad, ref_x.grad, rtol=1e-10, atol=1e-12)


def test_float32_close_to_torch():
    x = torch.randn(64, 8, 8, generator=torch.Generator().manual_seed(1)) * 10
    torch.testing.assert_close(vector_p_norm(x, 1.2, dim=-2), torch.linalg.vector_norm(x, ord=1.2, dim=-2))


def test_bad_p():
    with pytest.raises(ValueError, match="p must be >= 1"):
        vector_p_norm(torch.ones(3), 0.5)
