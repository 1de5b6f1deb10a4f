"""fft_conv(backend=...): every backend gives the reference's numbers and gradients, from L = 16 to 65,536, and
each case checks that the backend it is named for is the one that ran (spied on); fallbacks warn once and never
change the answer; "auto" is torch.fft on a CPU; invalid arguments raise ValueErrors naming them."""

import contextlib
import functools
import os
import warnings

import pytest
import torch
from comparisons import scaled_close
from fftconv_helpers import assert_fp32_conv_under_autocast

import ssmhub.ops.fftconv as fftconv_module
import ssmhub.ops.triton as triton_ops
from ssmhub.ops.fftconv import BackendFallbackWarning, fft_conv, fft_conv_ref, fft_size

if not torch.cuda.is_available():  # the Triton backend runs CPU tensors in its interpreter (read at the first call)
    os.environ.setdefault("TRITON_INTERPRET", "1")

LENGTHS = [16, 100, 1000, 4096, 65536]  # 65,536: FFT size 131,072, the three-pass algorithm with m = 16 chunks
TRITON_RUNS, TRITON_MISSING = triton_ops.can_run(torch.device("cpu"), triton_ops.MIN_FFT_SIZE)
needs_triton = pytest.mark.skipif(not TRITON_RUNS, reason=f"Triton cannot run CPU tensors here: {TRITON_MISSING}")


def conv_fp64(u, kernel, kernel_backward=None):
    """Float64 FFT convolution of size 2L (no wrap-around): the oracle where the dense reference's O(L²)
    matrix is too large; test_fp64_oracle_is_the_reference ties the two together."""
    length = u.shape[-1]
    n = 2 * length
    circulant = torch.zeros(kernel.shape[0], n, dtype=torch.float64)
    taps = kernel[:, :length].double()
    circulant[:, : taps.shape[-1]] = taps
    if kernel_backward is not None and length > 1:
        back = kernel_backward[:, : length - 1].double()
        circulant[:, n - back.shape[-1] :] = back.flip(-1)
    return torch.fft.irfft(torch.fft.rfft(u.double(), n=n) * torch.fft.rfft(circulant, n=n), n=n)[..., :length]


@pytest.fixture(autouse=True)
def fresh_fallback_warnings():
    """Fallback warnings are once per process; each test starts from none given."""
    fftconv_module._WARNED.clear()
    yield
    fftconv_module._WARNED.clear()


@pytest.fixture
def backends_run(monkeypatch):
    """The implementations that computed this test's fft_conv calls, in call order: spies on the three that
    fft_conv hands a call to, under the names the dispatcher calls them by (torch.fft's autograd Function,
    butterfly_conv, triton_conv)."""
    ran = []

    def spy(name, owner, attribute):
        original = getattr(owner, attribute)

        @functools.wraps(original)
        def recorded(*args, **kwargs):
            ran.append(name)
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, attribute, recorded)

    spy("torch", fftconv_module._CirculantConv, "apply")
    spy("butterfly", fftconv_module, "butterfly_conv")
    spy("triton", fftconv_module, "triton_conv")
    return ran


@contextlib.contextmanager
def fallback_warning(match):
    """Expect a BackendFallbackWarning whose message matches ``match``; with ``match=None``, none at all."""
    if match is None:
        with warnings.catch_warnings():
            warnings.simplefilter("error", BackendFallbackWarning)
            yield
    else:
        with pytest.warns(BackendFallbackWarning, match=match):
            yield


def make_inputs(seq_len, bidirectional, seed=0, requires_grad=False):
    gen = torch.Generator().manual_seed(seed)
    batch, heads = (2, 3) if seq_len <= 1000 else (1, 1)  # large L: tiny batch, the default run stays fast
    u = torch.randn(batch, heads, seq_len, generator=gen)
    kernel = torch.randn(heads, seq_len, generator=gen)
    backward = torch.randn(heads, seq_len // 2 + 1, generator=gen) if bidirectional else None
    tensors = [t.requires_grad_(requires_grad) for t in (u, kernel, backward) if t is not None]
    return u, kernel, backward, tensors, torch.randn(batch, heads, seq_len, generator=gen)


def test_fp64_oracle_is_the_reference():
    for seq_len in (16, 1000):
        u, kernel, backward, _, _ = make_inputs(seq_len, True)
        torch.testing.assert_close(conv_fp64(u, kernel, backward), fft_conv_ref(u.double(), kernel, backward.double()))


def backend_cases():
    """(requested backend, L, the backend that must run, the fallback warning expected), named for what runs:
    Triton takes FFT sizes up to its on-chip limit; past it (L >= 4096 here, a kernel as long as the input
    needs an FFT of fft_size(2L)) the call falls back to the Butterfly backend with a warning."""
    for seq_len in LENGTHS:
        yield pytest.param("torch", seq_len, "torch", None, id=f"torch-L{seq_len}")
        yield pytest.param("butterfly", seq_len, "butterfly", None, id=f"butterfly-L{seq_len}")
        if fft_size(2 * seq_len) <= triton_ops.MAX_FFT_SIZE:
            yield pytest.param("triton", seq_len, "triton", None, id=f"triton-L{seq_len}", marks=needs_triton)
        else:
            fallback = ("triton", seq_len, "butterfly", "on-chip limit")
            yield pytest.param(*fallback, id=f"triton-falls-back-to-butterfly-L{seq_len}", marks=needs_triton)


@pytest.mark.parametrize(("requested", "seq_len", "runs", "warning"), list(backend_cases()))
@pytest.mark.parametrize("bidirectional", [False, True], ids=["causal", "bidirectional"])
def test_backends_match_reference(backends_run, requested, seq_len, runs, warning, bidirectional):
    """The backend a case is named for computes it (warning only when it is a fallback), with the float64
    reference's outputs and gradients."""
    u, kernel, backward, inputs, weight = make_inputs(seq_len, bidirectional, seed=seq_len, requires_grad=True)
    if seq_len <= 1000:
        expected = fft_conv_ref(u.double(), kernel.double(), None if backward is None else backward.double())
    else:
        expected = conv_fp64(u, kernel, backward)
    with fallback_warning(warning):
        y = fft_conv(u, kernel, backward, backend=requested)
    assert backends_run == [runs]
    assert y.dtype == torch.float32 and y.shape == u.shape
    scaled_close(y, expected)
    # gradients through the backend against the float64 oracle's autograd
    got = torch.autograd.grad((y * weight).sum(), inputs)
    want = torch.autograd.grad((conv_fp64(u, kernel, backward) * weight).sum(), inputs)
    for a, b in zip(got, want):
        scaled_close(a, b)


@pytest.mark.parametrize("seq_len", LENGTHS, ids=[f"L{length}" for length in LENGTHS])
@pytest.mark.parametrize("bidirectional", [False, True], ids=["causal", "bidirectional"])
def test_auto_resolves_to_torch(backends_run, seq_len, bidirectional):
    """On a CPU "auto" is torch.fft at every length (see fftconv._select_backend), silently: the same
    implementation runs and the result is bit for bit backend="torch"'s (promised: _select_backend returns "torch"
    for "auto" on every device, and fft_conv then runs the very code of backend="torch" on the same tensors)."""
    u, kernel, backward, _, _ = make_inputs(seq_len, bidirectional, seed=seq_len)
    with fallback_warning(None):
        y = fft_conv(u, kernel, backward, backend="auto")
    assert backends_run == ["torch"]
    torch.testing.assert_close(y, fft_conv(u, kernel, backward, backend="torch"), atol=0, rtol=0)  # same op, inputs


@needs_triton
@pytest.mark.parametrize(
    ("seq_len", "runs", "warning"),
    [(triton_ops.MAX_FFT_SIZE // 2, "triton", None), (triton_ops.MAX_FFT_SIZE // 2 + 1, "butterfly", "on-chip limit")],
    ids=["largest-fft-runs-triton", "one-past-falls-back-to-butterfly"],
)
def test_triton_takes_fft_sizes_up_to_its_on_chip_limit(backends_run, seq_len, runs, warning):
    """The hand-over happens exactly at MAX_FFT_SIZE: an input and kernel of L = MAX_FFT_SIZE / 2 need an FFT of
    that size and run on Triton; one more position doubles it and falls back to the Butterfly backend."""
    u, kernel, _, _, _ = make_inputs(seq_len, False)
    with fallback_warning(warning):
        y = fft_conv(u, kernel, backend="triton")
    assert backends_run == [runs]
    scaled_close(y, conv_fp64(u, kernel))


@pytest.mark.parametrize("block_size", [2, 32, 256])
def test_butterfly_block_sizes_through_fft_conv(backends_run, block_size):
    u, kernel, backward, _, _ = make_inputs(1000, True)
    with fallback_warning(None):
        y = fft_conv(u, kernel, backward, backend="butterfly", block_size=block_size)
    assert backends_run == ["butterfly"]
    scaled_close(y, conv_fp64(u, kernel, backward))


def test_default_is_torch_and_unchanged(backends_run):
    u, kernel, _, _, _ = make_inputs(300, False)
    with fallback_warning(None):
        y = fft_conv(u, kernel)
    assert backends_run == ["torch"]
    torch.testing.assert_close(y, fft_conv(u, kernel, backend="torch"), atol=0, rtol=0)  # the same call, twice


def test_block_size_not_a_power_of_two_falls_back_once(backends_run):
    """A block size the Butterfly backend cannot use hands the call to torch.fft with one warning per block size."""
    u, kernel, backward, _, _ = make_inputs(100, True)
    with pytest.warns(BackendFallbackWarning, match="block_size=12"):
        y = fft_conv(u, kernel, backward, backend="butterfly", block_size=12)
    assert backends_run == ["torch"]
    scaled_close(y, conv_fp64(u, kernel, backward))
    with fallback_warning(None):  # the second call is silent
        fft_conv(u, kernel, backward, backend="butterfly", block_size=12)
    with fallback_warning("block_size=512"):
        fft_conv(u, kernel, backend="butterfly", block_size=512)
    assert backends_run == ["torch"] * 3


def test_triton_unavailable_falls_back_to_butterfly(backends_run, monkeypatch):
    """Without triton the call goes to the Butterfly backend, and on to torch.fft when the block size cannot be
    used either (two warnings); the answer stays the reference's."""
    monkeypatch.setattr(triton_ops, "triton_available", lambda: False)
    u, kernel, _, _, _ = make_inputs(100, False)
    with fallback_warning("not installed"):
        y = fft_conv(u, kernel, backend="triton")
    assert backends_run == ["butterfly"]
    scaled_close(y, conv_fp64(u, kernel))
    fftconv_module._WARNED.clear()
    with pytest.warns(BackendFallbackWarning) as record:
        y = fft_conv(u, kernel, backend="triton", block_size=3)
    handed_on_by = [str(w.message).split(":")[0] for w in record]
    assert handed_on_by == ["fft_conv(backend='triton')", "fft_conv(backend='butterfly')"]
    assert backends_run == ["butterfly", "torch"]
    scaled_close(y, conv_fp64(u, kernel))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"backend": "cufft"}, "backend must be one of"),
        ({"backend": None}, "backend must be one of"),
        ({"backend": "butterfly", "block_size": 0}, "block_size"),
        ({"backend": "butterfly", "block_size": 1}, "block_size"),
        ({"backend": "butterfly", "block_size": 16.0}, "block_size"),
        ({"backend": "butterfly", "block_size": True}, "block_size"),
    ],
)
def test_invalid_arguments_raise(kwargs, message):
    with pytest.raises(ValueError, match=message):
        fft_conv(torch.zeros(2, 3, 8), torch.zeros(3, 8), **kwargs)


@pytest.mark.parametrize("backend", ["butterfly", pytest.param("triton", marks=needs_triton)])
def test_backends_keep_fp32_under_autocast(backends_run, backend):
    """The backend itself (not a fallback) computes in float32 under bf16 autocast and for bf16 inputs: the
    kernel's small long tail resolved to float32 round-off (see assert_fp32_conv_under_autocast)."""
    with fallback_warning(None):
        assert_fp32_conv_under_autocast(functools.partial(fft_conv, backend=backend))
    assert set(backends_run) == {backend}
