"""FlashButterfly (ssmhub.ops.butterfly): Butterfly-matmul DFTs, the real-input trick, the convolution,
the three-pass algorithm, and the learned Butterfly extension, against torch.fft and the dense reference."""

import math

import pytest
import torch
from comparisons import scaled_close
from fftconv_helpers import assert_fp32_conv_under_autocast

from ssmhub.layers.longconv import LearnedButterflyConv, LongConvKernel
from ssmhub.ops.butterfly import (
    BLOCK_SIZES,
    _forward_stages,
    butterfly_conv,
    butterfly_factors,
    butterfly_fft,
    butterfly_ifft,
    butterfly_irfft,
    butterfly_plan,
    butterfly_rfft,
)
from ssmhub.ops.fftconv import fft_conv, fft_conv_ref
from ssmhub.ops.longconv import causal_conv


# ----------------------------------------------------------------------------- transforms
def test_factors_and_plan():
    assert butterfly_factors(1, 16) == ()
    assert butterfly_factors(8192, 16) == (16, 16, 16, 2)
    assert butterfly_factors(4096, 256) == (256, 16)
    assert math.prod(butterfly_factors(2**15, 32)) == 2**15
    plan = butterfly_plan(64, 4)
    assert sorted(plan.natural_index.tolist()) == list(range(64))
    assert torch.equal(plan.natural_index[plan.storage_index], torch.arange(64))  # integer permutations
    # the partner of stored frequency k holds frequency (M - k) mod M
    assert torch.equal(plan.natural_index[plan.partner], (64 - plan.natural_index) % 64)


@pytest.mark.parametrize("size", [1, 2, 8, 64, 1024, 4096])
@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_fft_matches_torch(size, block_size):
    gen = torch.Generator().manual_seed(size + block_size)
    x = torch.randn(3, size, dtype=torch.complex64, generator=gen)
    scaled_close(butterfly_fft(x, block_size), torch.fft.fft(x.to(torch.complex128)), rel=2e-6)
    scaled_close(butterfly_ifft(x, block_size), torch.fft.ifft(x.to(torch.complex128)), rel=2e-6)


@pytest.mark.parametrize("n", [2, 4, 32, 1024, 8192])
@pytest.mark.parametrize("block_size", [2, 16, 256])
def test_real_input_trick_matches_rfft(n, block_size):
    """App. C.2: a real length-n signal as a complex length-n/2 one, untangled with the partner bins."""
    gen = torch.Generator().manual_seed(n)
    x = torch.randn(2, 3, n, generator=gen)
    scaled_close(butterfly_rfft(x, block_size=block_size), torch.fft.rfft(x.double()), rel=2e-6)
    short = x[..., : n // 2 + 1]  # zero padded to n, as rfft(x, n) does
    scaled_close(butterfly_rfft(short, n, block_size=block_size), torch.fft.rfft(short.double(), n=n), rel=2e-6)
    spectrum = torch.fft.rfft(x)
    scaled_close(butterfly_irfft(spectrum, n, block_size=block_size), torch.fft.irfft(spectrum.cdouble(), n=n))


def test_transform_bad_sizes_raise():
    with pytest.raises(ValueError, match="size"):
        butterfly_fft(torch.zeros(3, 12, dtype=torch.complex64))
    with pytest.raises(ValueError, match="n must be a power of two"):
        butterfly_rfft(torch.zeros(10), n=12)
    with pytest.raises(ValueError, match="block_size"):
        butterfly_fft(torch.zeros(16, dtype=torch.complex64), block_size=12)


# ----------------------------------------------------------------------------- convolution
@pytest.mark.parametrize("seq_len", [1, 2, 16, 100, 257, 1000])
@pytest.mark.parametrize("kernel_len", ["same", "shorter", "longer"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_conv_matches_reference(seq_len, kernel_len, bidirectional):
    gen = torch.Generator().manual_seed(seq_len)
    k_len = {"same": seq_len, "shorter": max(1, seq_len // 3), "longer": 2 * seq_len + 5}[kernel_len]
    u = torch.randn(2, 3, seq_len, generator=gen)
    kernel = torch.randn(3, k_len, generator=gen)
    backward = torch.randn(3, k_len, generator=gen) if bidirectional else None
    expected = fft_conv_ref(u.double(), kernel.double(), None if backward is None else backward.double())
    scaled_close(butterfly_conv(u, kernel, backward), expected)


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("chunk_size", [None, 64])
def test_every_block_size_and_three_pass(block_size, chunk_size):
    gen = torch.Generator().manual_seed(block_size)
    u = torch.randn(2, 3, 1000, generator=gen)
    kernel = torch.randn(3, 1000, generator=gen)
    backward = torch.randn(3, 300, generator=gen)
    expected = fft_conv_ref(u.double(), kernel.double(), backward.double())
    got = butterfly_conv(u, kernel, backward, block_size=block_size, chunk_size=chunk_size)
    scaled_close(got, expected)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_gradients_match_reference(bidirectional):
    """Autograd through the matmul form (complex matmuls, twiddles, the partner gather) gives the
    reference's gradients, single-pass and three-pass."""
    gen = torch.Generator().manual_seed(0)
    u = torch.randn(3, 4, 300, generator=gen, requires_grad=True)
    kernel = torch.randn(4, 300, generator=gen, requires_grad=True)
    backward = torch.randn(4, 50, generator=gen, requires_grad=True) if bidirectional else None
    weight = torch.randn(3, 4, 300, generator=gen)
    inputs = [t for t in (u, kernel, backward) if t is not None]
    expected = torch.autograd.grad((fft_conv_ref(u, kernel, backward) * weight).sum(), inputs)
    for options in ({}, {"block_size": 4, "chunk_size": 32}):
        got = torch.autograd.grad((butterfly_conv(u, kernel, backward, **options) * weight).sum(), inputs)
        for a, b in zip(got, expected):
            scaled_close(a, b)


def test_three_pass_structure():
    """Algorithm 2 / App. C.1: with N = m·l, pass 1 is the Butterfly matrix B whose m×m blocks are diagonal
    l×l matrices, ``B[k·l + τ, j·l + τ] = exp(−2πi·k(j·l + τ)/N)``, and pass 2 never leaves a chunk."""
    size, chunk = 32, 8
    plan = butterfly_plan(size, block_size=4, chunk_size=chunk)
    m = size // chunk
    assert plan.factors[: plan.outer_stages] == (m,)
    eye = torch.eye(size, dtype=torch.complex64)
    outer = _forward_stages(eye, plan.stages[: plan.outer_stages]).T  # column j = B e_j
    k, tau, j = torch.meshgrid(torch.arange(m), torch.arange(chunk), torch.arange(m), indexing="ij")
    expected = torch.zeros(size, size, dtype=torch.complex128)
    phase = (k * (j * chunk + tau)).double() / size
    expected[k * chunk + tau, j * chunk + tau] = torch.exp(-2j * math.pi * phase)
    torch.testing.assert_close(outer.to(torch.complex128), expected, atol=1e-6, rtol=0)
    inner = _forward_stages(eye, plan.stages[plan.outer_stages :]).T.abs() > 1e-6  # (out, in)
    chunk_of = torch.arange(size) // chunk
    assert not (inner & (chunk_of[:, None] != chunk_of[None, :])).any()


def test_fp32_under_autocast():
    """The Butterfly matmuls run in float32 / complex64 under bf16 autocast and for bf16 inputs (the small,
    long kernel tail resolved to float32 round-off; see assert_fp32_conv_under_autocast)."""
    assert_fp32_conv_under_autocast(butterfly_conv)


def test_conv_bad_arguments_raise():
    u, kernel = torch.zeros(2, 3, 10), torch.zeros(3, 10)
    with pytest.raises(ValueError, match="block_size"):
        butterfly_conv(u, kernel, block_size=12)
    with pytest.raises(ValueError, match="block_size"):
        butterfly_conv(u, kernel, block_size=512)
    with pytest.raises(ValueError, match="chunk_size"):
        butterfly_conv(u, kernel, chunk_size=100)
    with pytest.raises(ValueError, match="FFT size"):
        butterfly_conv(u, kernel, n=16)  # < L + K - 1 = 19: would wrap around
    with pytest.raises(ValueError, match="shape \\(H, K\\)"):
        butterfly_conv(u, torch.zeros(4, 10))


# ----------------------------------------------------------------------------- learned Butterfly
@pytest.mark.parametrize("block_size", [4, 16, 32])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_learned_at_init_equals_fixed_and_torch(block_size, bidirectional):
    """§3.2.1: initialized at the DFT, the learned Butterfly is the fixed Butterfly is the torch.fft conv."""
    gen = torch.Generator().manual_seed(block_size)
    heads, length = 3, 200
    learned = LearnedButterflyConv(heads, length, block_size, learn=("input", "kernel", "output"))
    u = torch.randn(2, heads, 150, generator=gen)
    kernel = torch.randn(heads, 150, generator=gen)
    backward = torch.randn(heads, 40, generator=gen) if bidirectional else None
    skip = torch.randn(heads, generator=gen)
    fixed = butterfly_conv(u, kernel, backward, block_size=block_size, n=learned.fft_size)
    torch_fft = fft_conv(u, kernel, backward)
    got = learned(u, kernel, backward, skip=skip)
    scaled_close(got, fixed + skip[:, None] * u, rel=1e-6)
    scaled_close(got - skip[:, None] * u, torch_fft)


def test_learned_blocks_are_parameters():
    heads, length, r = 2, 100, 16  # n = 256, M = 128 = 16 · 8
    learned = LearnedButterflyConv(heads, length, r)
    assert learned.fft_size == 256
    names = dict(learned.named_parameters())
    assert set(names) == {"ssm.input_16", "ssm.input_8", "ssm.output_16", "ssm.output_8"}
    assert learned.num_extra_parameters == 2 * (2 * heads * (16**2 + 8**2))  # two transforms, (re, im)
    gen = torch.Generator().manual_seed(0)
    u = torch.randn(3, heads, length, generator=gen)
    kernel = torch.randn(heads, length, generator=gen)
    before = learned(u, kernel).detach()
    with torch.no_grad():
        learned.ssm.input_16.add_(0.01 * torch.randn(learned.ssm.input_16.shape, generator=gen))
    assert not torch.allclose(learned(u, kernel), before, atol=1e-3)
    with pytest.raises(ValueError, match="max_length"):
        learned(torch.zeros(1, heads, length + 1), kernel)
    with pytest.raises(ValueError, match="learn"):
        LearnedButterflyConv(heads, length, r, learn=("inputs",))
    with pytest.raises(ValueError, match="block_size"):
        LearnedButterflyConv(heads, length, 24)


def dense_butterfly(factors, blocks, head, inverse=False):
    """The (M, M) complex128 matrix of one Butterfly transform of size M = prod(factors) (arXiv 2302.06646
    App. C.1, in decimation-in-frequency order): stage s, of block f with a = f₁⋯f_{s−1} groups in front and R = M/(a·f)
    behind, is ``diag(T) · (I_a ⊗ B_f ⊗ I_R)`` with twiddles ``T[k₁, n₂] = exp(−2πi·k₁n₂/(f·R))`` repeated over
    the a groups. The inverse (unnormalised) runs the stages in reverse, twiddle conjugated before the block.
    ``blocks[f]`` (H, f, f) are the learned blocks, the same for every stage of size f."""
    size = math.prod(factors)
    matrix, outer = torch.eye(size, dtype=torch.complex128), 1
    stages = []
    for block in factors:
        rest = size // (outer * block)
        mix = torch.kron(torch.eye(outer), torch.kron(blocks[block][head], torch.eye(rest)))
        phase = torch.outer(torch.arange(block), torch.arange(rest)).double() / (block * rest)
        twiddle = torch.polar(torch.ones_like(phase), -2 * math.pi * phase).reshape(-1).repeat(outer)
        stages.append(torch.diag(twiddle) @ mix if not inverse else mix @ torch.diag(twiddle.conj()))
        outer *= block
    for stage in stages if not inverse else reversed(stages):
        matrix = stage @ matrix
    return matrix


def learned_butterfly_conv_fp64(u, kernel, kernel_backward, blocks, plan, n):
    """Float64 reference of the learned Butterfly convolution (arXiv 2302.06646 §3.2.1 on App. C.2's real-input
    FFT), written
    out unfused with dense transforms: pack the real input (length n) as z[j] = x[2j] + i·x[2j+1], transform
    (learned ``input`` blocks), untangle into the half spectra X[k] = E − Q and X̄[M−k] = E + Q, the same for the
    kernel's circulant (``kernel`` blocks), multiply, re-tangle, inverse transform (``output`` blocks), unpack.
    ``blocks`` maps a transform to {f: (H, f, f) complex128} (a missing transform uses the DFT); ``plan`` only
    gives the bookkeeping of the stored (digit-reversed) order: each position's frequency and its partner's."""
    heads, length, half = u.shape[-2], u.shape[-1], n // 2
    dft = {f: torch.fft.fft(torch.eye(f, dtype=torch.complex128)).expand(heads, f, f) for f in set(plan.factors)}
    fixed = {"input": dft, "kernel": dft, "output": {f: block.conj() for f, block in dft.items()}}
    transforms = {
        name: torch.stack(
            [dense_butterfly(plan.factors, blocks.get(name, chosen), h, name == "output") for h in range(heads)]
        )
        for name, chosen in fixed.items()
    }  # (H, M, M) each
    circulant = torch.zeros(heads, n, dtype=torch.float64)
    circulant[:, : min(length, kernel.shape[-1])] = kernel[:, :length]
    if kernel_backward is not None and length > 1:
        taps = kernel_backward[:, : length - 1]
        circulant[:, n - taps.shape[-1] :] = taps.flip(-1)
    omega = torch.polar(torch.ones(half, dtype=torch.float64), -math.pi * plan.natural_index.double() / half)

    def half_spectra(x, transform):  # real (..., H, ≤ n) -> X[k], X̄[M − k] at the stored positions
        x = torch.nn.functional.pad(x, (0, n - x.shape[-1]))
        z = torch.einsum("hkj,...hj->...hk", transform, torch.complex(x[..., 0::2], x[..., 1::2]))
        partner = z[..., plan.partner].conj()
        even, odd = (z + partner) / 2, 0.5j * omega * (z - partner)
        return even - odd, even + odd

    x, x_mirror = half_spectra(u, transforms["input"])
    k, k_mirror = half_spectra(circulant, transforms["kernel"])
    y, y_mirror = x * k, x_mirror * k_mirror
    packed = (y + y_mirror) / 2 + 0.5j * omega.conj() * (y - y_mirror)
    z = torch.einsum("hkj,...hj->...hk", transforms["output"], packed) / half
    return torch.stack([z.real, z.imag], dim=-1).flatten(-2)[..., :length]


# (block size, chunk size): factors (16, 8); (4, 4, 4, 2), one block shared by three stages; three-pass (4, 16, 2)
LEARNED_PLANS = [(16, None), (4, None), (16, 64)]


@pytest.mark.parametrize(("block_size", "chunk_size"), LEARNED_PLANS)
def test_learned_reference_at_dft_blocks_is_the_convolution(block_size, chunk_size):
    """learned_butterfly_conv_fp64 is itself right: at the DFT blocks it is the dense Toeplitz convolution, outputs
    and gradients, so at initialization the learned Butterfly's gradients must be the FFT convolution's."""
    gen = torch.Generator().manual_seed(block_size)
    learned = LearnedButterflyConv(2, 100, block_size, chunk_size=chunk_size)
    plan = butterfly_plan(learned.fft_size // 2, block_size, None if chunk_size is None else chunk_size // 2)
    inputs = [torch.randn(shape, generator=gen, dtype=torch.float64) for shape in ((3, 2, 80), (2, 80), (2, 30))]
    inputs = [t.requires_grad_() for t in inputs]  # u, kernel, kernel_backward
    weight = torch.randn(3, 2, 80, generator=gen, dtype=torch.float64)
    got = learned_butterfly_conv_fp64(*inputs, {}, plan, learned.fft_size)
    expected = fft_conv_ref(*inputs)
    torch.testing.assert_close(got, expected, atol=1e-12, rtol=0)
    for a, b in zip(*(torch.autograd.grad((y * weight).sum(), inputs) for y in (got, expected))):
        torch.testing.assert_close(a, b, atol=1e-11, rtol=0)


@pytest.mark.parametrize("moved", [False, True], ids=["at-init", "blocks-moved"])
@pytest.mark.parametrize(("block_size", "chunk_size"), LEARNED_PLANS)
def test_learned_gradients_match_float64_dense_reference(block_size, chunk_size, moved):
    """LearnedButterflyConv's output and every gradient (input, both kernels, skip, and the learned blocks of all
    three transforms, shared by the stages of equal size) against autograd through the float64 dense reference,
    at the DFT blocks (where the map is the FFT convolution) and with the blocks moved away from it."""
    gen = torch.Generator().manual_seed(block_size + (chunk_size or 0))
    heads, length = 2, 80
    learned = LearnedButterflyConv(heads, 100, block_size, learn=("input", "kernel", "output"), chunk_size=chunk_size)
    if moved:
        with torch.no_grad():
            for parameter in learned.parameters():
                parameter.add_(0.3 * torch.randn(parameter.shape, generator=gen))
    u = torch.randn(3, heads, length, generator=gen, requires_grad=True)
    kernel = torch.randn(heads, length, generator=gen, requires_grad=True)
    backward = torch.randn(heads, 30, generator=gen, requires_grad=True)
    skip = torch.randn(heads, generator=gen, requires_grad=True)
    weight = torch.randn(3, heads, length, generator=gen)
    names, parameters = zip(*learned.named_parameters())
    inputs = (u, kernel, backward, skip, *parameters)
    y = learned(u, kernel, backward, skip=skip)
    got = torch.autograd.grad((y * weight).sum(), inputs)

    inputs64 = [t.detach().double().requires_grad_() for t in inputs]
    u64, kernel64, backward64, skip64, *parameters64 = inputs64
    blocks = {}
    for name, parameter in zip(names, parameters64):  # "ssm.{transform}_{f}": (H, f, f, 2) (re, im)
        transform, size = name.removeprefix("ssm.").split("_")
        blocks.setdefault(transform, {})[int(size)] = torch.view_as_complex(parameter)
    plan = butterfly_plan(learned.fft_size // 2, block_size, None if chunk_size is None else chunk_size // 2)
    expected_y = learned_butterfly_conv_fp64(u64, kernel64, backward64, blocks, plan, learned.fft_size)
    expected_y = expected_y + skip64[:, None] * u64
    scaled_close(y, expected_y)
    expected = torch.autograd.grad((expected_y * weight.double()).sum(), inputs64)
    for name, a, b in zip(("u", "kernel", "kernel_backward", "skip", *names), got, expected):
        scaled_close(a, b, what=f"gradient of {name}")


def test_long_conv_kernel_backends_and_learned_flag():
    """LongConvKernel.convolve: every backend gives causal_conv's numbers (prefill included); the learned
    Butterfly equals them at init and refuses a recurrent state."""
    gen = torch.Generator().manual_seed(3)
    torch.manual_seed(3)
    base = LongConvKernel(4, 64)
    u = torch.randn(2, 4, 40, generator=gen)
    history = torch.randn(2, 4, 63, generator=gen)
    expected, expected_state = causal_conv(u, base(64), base.skip, initial_state=history, return_final_state=True)
    for backend in ("torch", "butterfly", "auto"):
        other = LongConvKernel(4, 64, fft_backend=backend, butterfly_block_size=8)
        other.load_state_dict(base.state_dict())
        y, state = other.convolve(u, initial_state=history, return_final_state=True)
        scaled_close(y, expected)
        torch.testing.assert_close(state, expected_state)
    learned = LongConvKernel(4, 64, learned_butterfly=True, butterfly_block_size=8)
    learned.load_state_dict(base.state_dict(), strict=False)
    assert any(".ssm." in f".{name}" for name, _ in learned.butterfly.named_parameters(prefix="butterfly"))
    y, state = learned.convolve(u)
    assert state is None
    scaled_close(y, base.convolve(u)[0])
    with pytest.raises(ValueError, match="no recurrent state"):
        learned.convolve(u, initial_state=history)
    with pytest.raises(ValueError, match="fft_backend"):
        LongConvKernel(4, 64, fft_backend="cufft")


def test_plan_cached_under_inference_mode_serves_autograd():
    """The cached DFT blocks and twiddles are normal tensors even when first built in inference mode."""
    from ssmhub.ops.butterfly import _plan_cached

    _plan_cached.cache_clear()
    gen = torch.Generator().manual_seed(0)
    u, kernel, weight = (torch.randn(shape, generator=gen) for shape in ((1, 2, 40), (2, 40), (1, 2, 40)))
    with torch.inference_mode():
        butterfly_conv(u, kernel, block_size=8)
    kernel.requires_grad_()
    (got,) = torch.autograd.grad((butterfly_conv(u, kernel, block_size=8) * weight).sum(), kernel)
    (expected,) = torch.autograd.grad((fft_conv_ref(u.double(), kernel.double()) * weight).sum(), kernel)
    scaled_close(got, expected.double())
