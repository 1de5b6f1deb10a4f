"""The fused largest-column normalisation against its autograd composition (torch.linalg.vector_norm)."""

from __future__ import annotations

import pytest
import torch

from ssmhub.ops.block_norm import normalize_by_largest_column, normalize_by_largest_column_ref


@pytest.mark.parametrize("p", [1.0, 1.2, 2.0, 3.5])
@pytest.mark.parametrize("eps", [0.0, 0.3])
def test_values_and_gradients_match_the_composition(p, eps):
    torch.manual_seed(0)
    G = torch.randn(3, 5, 4, 8, 8, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(3, 5, 4, 8, 8, dtype=torch.float64)
    A = normalize_by_largest_column(G, p, eps)
    A_ref = normalize_by_largest_column_ref(G, p, eps)
    torch.testing.assert_close(A, A_ref, rtol=1e-12, atol=1e-12)
    (g,) = torch.autograd.grad(A, G, grad)
    (g_ref,) = torch.autograd.grad(A_ref, G, grad)
    torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-12)


def test_the_largest_column_has_unit_norm_and_columns_sum_to_zero():
    torch.manual_seed(1)
    A = normalize_by_largest_column(torch.randn(64, 8, 8), 1.2)
    norms = torch.linalg.vector_norm(A.double(), ord=1.2, dim=-2)
    torch.testing.assert_close(norms.amax(-1), torch.ones(64, dtype=torch.float64), rtol=1e-6, atol=0)
    assert (norms <= 1 + 1e-6).all()
    torch.testing.assert_close(A.sum(-2), torch.zeros(64, 8), atol=1e-6, rtol=0)


def test_gradcheck_and_a_zero_entry_in_the_largest_column():
    torch.manual_seed(2)
    G = torch.randn(2, 3, 4, 4, dtype=torch.float64)
    G[0, 0, :, 1] = torch.tensor([5.0, -5.0, 2.0, 2.0])  # column 1 is the largest; after centring it has zeros
    G.requires_grad_()
    assert torch.autograd.gradcheck(lambda g: normalize_by_largest_column(g, 1.2), (G,))
    grad = torch.randn_like(G)
    (g,) = torch.autograd.grad(normalize_by_largest_column(G, 1.2), G, grad)
    (g_ref,) = torch.autograd.grad(normalize_by_largest_column_ref(G, 1.2), G, grad)
    torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-12)


def test_float32_agrees_with_float64():
    torch.manual_seed(3)
    G = torch.randn(128, 40, 8, 8, 8)
    torch.testing.assert_close(
        normalize_by_largest_column(G, 1.2),
        normalize_by_largest_column_ref(G.double(), 1.2).float(),
        rtol=1e-5,
        atol=1e-6,
    )


BAD_ARGUMENTS = [
    ((torch.randn(4, 4), 0.5), "p must be >= 1"),
    ((torch.randn(4, 4), 1.2, -1.0), "eps must be non-negative"),
    ((torch.randn(4, 3), 1.2), r"G must have shape \(..., b, b\); got \(4, 3\)"),
]


@pytest.mark.parametrize(("args", "message"), BAD_ARGUMENTS)
def test_bad_arguments_are_named(args, message):
    with pytest.raises(ValueError, match=message):
        normalize_by_largest_column(*args)
