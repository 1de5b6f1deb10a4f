"""diagonal_step (real arithmetic on the complex state's real view) against the complex128 recurrence it writes out,
and polar_parts against torch.polar in float64."""

import torch
from comparisons import EPS32

from ssmhub.ops.diagonal_step import diagonal_step, polar_parts


def test_polar_parts_are_the_float64_polar_rounded():
    gen = torch.Generator().manual_seed(0)
    log_modulus, phase = -torch.rand(3, 5, generator=gen), 100 * torch.randn(3, 5, generator=gen)
    re, im = polar_parts(log_modulus, phase)
    expected = torch.polar(torch.exp(log_modulus.double()), phase.double()).to(torch.complex64)
    # not the same op: torch.polar's and torch.cos/sin's float64 kernels (vectorised or scalar, per instruction
    # set or device) may differ in the last float64 bit, which moves the float32 rounding by one ulp (≤ EPS32 of
    # each part) where it straddles a midpoint
    got = torch.view_as_real(torch.complex(re, im))
    torch.testing.assert_close(got, torch.view_as_real(expected), rtol=EPS32, atol=0)


def test_a_step_is_the_complex_recurrence():
    gen = torch.Generator().manual_seed(1)
    batch, channels, modes = 2, 3, 4
    lam = torch.polar(torch.rand(channels, modes, generator=gen), torch.randn(channels, modes, generator=gen))
    c = torch.complex(torch.randn(channels, modes, generator=gen), torch.randn(channels, modes, generator=gen))
    state = torch.complex(torch.randn(batch, channels, modes, generator=gen), torch.randn(batch, channels, modes))
    u = torch.randn(batch, channels, generator=gen)
    z_re, z_im, new_state = diagonal_step(state, (lam.real, lam.imag), u, (c.real, c.imag))
    expected_state = lam.cdouble() * state.cdouble() + u.double().unsqueeze(-1)  # (B, H, N)
    expected_z = (expected_state * c.cdouble()).sum(-1)  # (B, H)
    assert new_state.dtype == torch.complex64
    torch.testing.assert_close(new_state.cdouble(), expected_state, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(z_re.double(), expected_z.real, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(z_im.double(), expected_z.imag, atol=1e-5, rtol=1e-5)
