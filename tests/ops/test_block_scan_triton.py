"""The Triton scans of the block-diagonal LRNN (arXiv 2309.07412 Eq. 5; ssmhub.ops.triton.block_scan), sequential
(chunk_size=None) and chunked (chunk_size=C: chunks from zero, a scan over the chunk carries, chunks rerun from their
carries), against the float64 loop block_scan_ref: values and the custom reverse-time backward (A, v, x_0), padding
and document restarts written into A and v, growing (non-contractive) blocks, T = 1, chunk lengths that divide T or
leave a short last chunk, and the BDLRNN mixer with scan="triton". On a CPU-only machine it runs under
TRITON_INTERPRET=1 (tiny shapes: the interpreter is slow); skipped without triton."""

import functools
import itertools
import os

import pytest
import torch
from comparisons import FP32_REL, scaled_close

from ssmhub.ops.block_scan import block_scan_ref, block_step, restart_blocks

if not torch.cuda.is_available():  # the kernels are decorated (interpreted or compiled) at their first import
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

from ssmhub.ops.triton.block_scan import (
    CHUNK_SIZE,
    MAX_BLOCK_SIZE,
    block_scan_triton,
    block_scan_triton_chunked,
    can_run_block_scan,
)

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
pytestmark = pytest.mark.skipif(
    not can_run_block_scan(DEVICE)[0], reason="Triton cannot run here: " + can_run_block_scan(DEVICE)[1]
)

# Gradients against the float64 loop: the adjoint is a second scan of T ≤ 40 steps in reverse (≈ 4 rounded stages
# per step: a b ≤ 8 term reduction and an add) on top of the forward's states, whose own error (FP32_REL) enters
# dA through the outer product g x^T: ≈ 2× the forward's depth, hence 2 × FP32_REL of the largest entry.
GRAD_REL = 2 * FP32_REL


def _blocks(batch, seq_len, heads, block, gen, gain=1.0):
    """Column-normalised blocks (every column 1-norm ≤ 1, Eq. 6 with p = 1) times ``gain`` (> 1: growing states)."""
    raw = torch.randn(batch, seq_len, heads, block, block, generator=gen, dtype=torch.float64)
    norms = raw.abs().sum(dim=-2, keepdim=True).clamp(min=1.0)  # (..., 1, b): column 1-norms
    return (gain * raw / norms).float()


def _inputs(batch, seq_len, heads, block, state="batch", seed=0, gain=1.0):
    """float32 A (batch, T, h, b, b), v (batch, T, h, b) and x_0 (batch or 1, h, b) or None."""
    gen = torch.Generator().manual_seed(seed)
    A = _blocks(batch, seq_len, heads, block, gen, gain)
    v = torch.randn(batch, seq_len, heads, block, generator=gen)
    rows = {"none": 0, "batch": batch, "shared": 1}[state]
    x0 = torch.randn(rows, heads, block, generator=gen) if rows else None
    return A, v, x0


def _check_against_loop(A, v, x0, prepare=lambda A, v, x0: (A, v, x0), **kwargs):
    """States and gradients of every input (through ``prepare``, e.g. restart_blocks) of the Triton scan on the
    float32 inputs equal the float64 loop's on the same numbers. Returns the Triton states."""
    weight = torch.randn(v.shape, generator=torch.Generator().manual_seed(9))
    leaves = [t.to(DEVICE).requires_grad_() for t in (A, v, x0) if t is not None]
    exact = [t.detach().double().requires_grad_() for t in leaves]  # float64 leaves of the same values
    got = block_scan_triton(*prepare(*_with_none(leaves, x0)), **kwargs)
    expected = block_scan_ref(*prepare(*_with_none(exact, x0)))
    assert got.shape == v.shape and got.dtype == torch.float32
    scaled_close(got, expected, what="states")
    grads = torch.autograd.grad((got * weight.to(DEVICE)).sum(), leaves)
    grads_ref = torch.autograd.grad((expected * weight.double()).sum(), exact)
    for name, g, e in zip(("A", "v", "x0"), grads, grads_ref):
        scaled_close(g, e, GRAD_REL, what=f"gradient of {name}")
    return got.detach()


def _with_none(leaves, x0):
    return (*leaves, None) if x0 is None else tuple(leaves)


@pytest.mark.parametrize(
    ("block", "seq_len", "heads"),
    [(2, 40, 3), (4, 19, 2), (8, 11, 2), (3, 9, 3), (1, 7, 2)],  # b = 3: padded to 4 lanes, masked; b = 1: a scalar
)
@pytest.mark.parametrize("state", ["none", "batch", "shared"])
def test_values_and_gradients_match_the_loop(block, seq_len, heads, state):
    A, v, x0 = _inputs(2, seq_len, heads, block, state, seed=block)
    _check_against_loop(A, v, x0)


@pytest.mark.parametrize(
    ("block", "seq_len", "heads", "chunk_size"),
    # 3 whole chunks; a short last chunk (19 = 4·4 + 3); a chunk a step; b = 3 masked lanes; one chunk (C > T)
    [(2, 24, 3, 8), (4, 19, 2, 4), (2, 9, 3, 1), (3, 9, 3, 4), (8, 11, 2, 16)],
)
@pytest.mark.parametrize("state", ["none", "batch", "shared"])
def test_chunked_values_and_gradients_match_the_loop(block, seq_len, heads, chunk_size, state):
    A, v, x0 = _inputs(2, seq_len, heads, block, state, seed=block + seq_len)
    _check_against_loop(A, v, x0, chunk_size=chunk_size)


@pytest.mark.parametrize(("heads_per_program", "chunk_size"), [(1, None), (2, None), (4, None), (1, 2), (4, 4)])
def test_any_head_grouping_gives_the_loops_numbers(heads_per_program, chunk_size):
    """G heads per program, with h = 3 not a multiple of 2 or 4 (the last group's extra heads are masked)."""
    A, v, x0 = _inputs(2, 6, 3, 4, "batch", seed=1)
    _check_against_loop(A, v, x0, heads_per_program=heads_per_program, chunk_size=chunk_size)


def test_the_default_chunk_length_leaves_a_short_last_chunk():
    """block_scan_triton_chunked at its CHUNK_SIZE on T = CHUNK_SIZE + 5: a whole chunk, then 5 steps."""
    A, v, x0 = _inputs(1, CHUNK_SIZE + 5, 1, 2, "shared", seed=11)
    leaves = [t.to(DEVICE).requires_grad_() for t in (A, v, x0)]
    got = block_scan_triton_chunked(*leaves)
    exact = [t.detach().double().requires_grad_() for t in leaves]
    expected = block_scan_ref(*exact)
    scaled_close(got, expected, what="states")
    for name, g, e in zip(
        "A v x0".split(), torch.autograd.grad(got.sum(), leaves), torch.autograd.grad(expected.sum(), exact)
    ):
        scaled_close(g, e, GRAD_REL, what=f"gradient of {name}")


def test_one_chunk_is_the_sequential_scan_bit_for_bit():
    """chunk_size ≥ T launches the sequential kernel alone, on the same inputs: the same bits, values and gradients."""
    A, v, x0 = (t.to(DEVICE).requires_grad_() for t in _inputs(2, 7, 3, 4, "batch", seed=12))
    runs = [block_scan_triton(A, v, x0, chunk_size=size) for size in (None, 7, 100)]
    grads = [torch.autograd.grad(states.sum(), (A, v, x0)) for states in runs]
    for states, grad in zip(runs[1:], grads[1:]):
        assert torch.equal(states, runs[0])  # the same kernel on the same inputs
        assert all(torch.equal(g, g0) for g, g0 in zip(grad, grads[0]))


class _LaunchRecorder:
    """Stands in for the kernels module and records each launch's kernel name and grid."""

    def __init__(self, module):
        self.module, self.launches = module, []

    def __getattr__(self, name):
        kernel, launches = getattr(self.module, name), self.launches

        class Launch:
            def __getitem__(self, grid):
                launches.append((name, grid))
                return kernel[grid]

        return Launch()


def test_the_chunked_scan_launches_three_passes_each_way(monkeypatch):
    """T = 10, C = 4: N = 3 chunks; forward: 2 chunks from zero, the scan of their 2 carries, 3 chunks; backward:
    the 2 chunks after the first from a zero carry, the reverse scan of 2 carries, 3 chunks (b = 4, h = 3: G = 4,
    one group of heads)."""
    from ssmhub.ops.triton import block_scan as module

    recorder = _LaunchRecorder(module._kernels())
    monkeypatch.setattr(module, "_kernels", lambda: recorder)
    A, v, x0 = (t.to(DEVICE).requires_grad_() for t in _inputs(2, 10, 3, 4, "shared", seed=13))
    block_scan_triton(A, v, x0, chunk_size=4).sum().backward()
    assert recorder.launches == [
        ("block_scan_chunk_fwd_kernel", (2, 1, 2)),
        ("block_scan_fwd_kernel", (2, 1, 1)),
        ("block_scan_fwd_kernel", (2, 1, 3)),
        ("block_scan_chunk_bwd_kernel", (2, 1, 2)),
        ("block_scan_bwd_kernel", (2, 1, 1)),
        ("block_scan_bwd_kernel", (2, 1, 3)),
    ]


@pytest.mark.slow
def test_many_chunks_match_the_loop():
    """T = 200 in 13 chunks of 16 (the last of 8) at the paper's b = 8. The blocks contract (column 1-norms ≤ 1), so
    round-off does not build up over the 200 steps: FP32_REL's ≤ 40 stages still bound it."""
    A, v, x0 = _inputs(2, 200, 2, 8, "batch", seed=14)
    _check_against_loop(A, v, x0, chunk_size=16)


def _growing_inputs(batch, seq_len, heads, block, seed, gain=1.25, drive=0.1):
    """Non-contractive blocks that make every state grow, whatever the draw: ``A_k = gain·Q_k`` (Q_k orthogonal, so
    ``‖A_k x‖₂ = gain·‖x‖₂``), unit x_0 and ``‖v_k‖₂ = drive`` per head, hence
    ``‖x_k‖₂ ≥ gain^k − drive·(gain^k − 1)/(gain − 1) ≥ (1 − drive/(gain − 1))·gain^k``."""
    gen = torch.Generator().manual_seed(seed)

    def unit(*shape):
        t = torch.randn(*shape, block, generator=gen, dtype=torch.float64)
        return t / t.norm(dim=-1, keepdim=True)

    Q = torch.linalg.qr(torch.randn(batch, seq_len, heads, block, block, generator=gen, dtype=torch.float64)).Q
    return (gain * Q).float(), (drive * unit(batch, seq_len, heads)).float(), unit(batch, heads).float()


@pytest.mark.parametrize("chunk_size", [None, 4])
def test_growing_blocks_match_the_loop(chunk_size):
    """Non-contractive blocks (‖A_k x‖₂ = 1.25·‖x‖₂): the states grow by more than an order of magnitude over
    T = 16, for any draw; the error stays relative to the largest state (chunked: the chunk products grow too)."""
    A, v, x0 = _growing_inputs(2, 16, 2, 4, seed=3)
    got = _check_against_loop(A, v, x0, chunk_size=chunk_size)
    # ‖x_1‖∞ ≤ ‖x_1‖₂ ≤ 1.25 + 0.1, while ‖x_16‖∞ ≥ ‖x_16‖₂ / 2 ≥ 0.6 · 1.25^16 / 2 > 10 (b = 4)
    assert got.abs().max() > 5 * got[:, 0].abs().max()  # the states do grow


@pytest.mark.parametrize("chunk_size", [None, 4])
def test_padded_steps_leave_the_state_unchanged(chunk_size):
    """Masked steps as the layer writes them (A = I, v = 0, bdlrnn.BDLRNNMixer.transitions): the state passes
    through with the same bits (x_i·1 + Σ 0·x_j + 0 is exact in IEEE arithmetic, with or without FMA), and the
    gradients still follow the loop. Chunked, the bits are promised inside a chunk only: a chunk's first step
    starts from the carry P_c s_{c-1} + e_c, another rounding of the state the chunk before stored (steps 4, 8)."""
    A, v, x0 = _inputs(2, 12, 2, 4, "batch", seed=5)
    padded = torch.zeros(2, 12, dtype=torch.bool)
    padded[0, :3] = padded[0, 7] = padded[1, [4, 5, 11]] = True  # left padding, holes, the last step
    A[padded] = torch.eye(4)
    v[padded] = 0.0
    got = _check_against_loop(A, v, x0, chunk_size=chunk_size)
    before = torch.cat([x0.to(DEVICE).unsqueeze(1), got[:, :-1]], dim=1)  # (batch, T, h, b): x_{k-1}
    inside = torch.ones(12, dtype=torch.bool)  # steps whose x_{k-1} comes from the same walk
    if chunk_size is not None:
        inside[chunk_size::chunk_size] = False
    changed = (got != before) & (padded & inside).to(DEVICE)[..., None, None]
    where = [tuple(i) for i in changed.nonzero().tolist()[:4]]  # (row, step, head, lane)
    assert not where, [(i, got[i].item().hex(), before[i].item().hex()) for i in where]


@pytest.mark.parametrize(("learned_x0", "chunk_size"), [(True, None), (False, None), (True, 3), (False, 4)])
def test_document_restarts_scan_every_document_from_x0(learned_x0, chunk_size):
    """restart_blocks (A_k → 0, v_k → v_k + A_k x_0 at a start) then the Triton scan: each document of a packed
    row equals its own loop from x_0, and the gradients of A, v and x_0 through restart_blocks follow the loop."""
    A, v, carried = _inputs(2, 11, 2, 3, "batch", seed=4)
    x0 = torch.randn(1, 2, 3, generator=torch.Generator().manual_seed(8)) if learned_x0 else None
    starts = torch.zeros(2, 11, dtype=torch.bool)
    starts[0, [3, 4, 6]] = True  # row 0 continues its incoming state, then documents of 1, 2 and 5
    starts[1, [0, 8]] = True  # row 1 restarts at once
    carried = carried.to(DEVICE)

    def prepare(A, v, x0):
        return (*restart_blocks(A, v, starts.to(A.device), x0), carried.to(A.dtype))

    got = _check_against_loop(A, v, x0, prepare, chunk_size=chunk_size)
    for row in range(2):
        bounds = [0] + [t for t in starts[row].nonzero().flatten().tolist() if t > 0] + [11]
        for i, (begin, end) in enumerate(itertools.pairwise(bounds)):
            fresh = i > 0 or bool(starts[row, 0])
            start = (x0 if x0 is not None else torch.zeros(1, 2, 3)) if fresh else carried[row : row + 1]
            A_doc, v_doc = (t[row : row + 1, begin:end].to(DEVICE).double() for t in (A, v))
            alone = block_scan_ref(A_doc, v_doc, start.to(DEVICE))
            scaled_close(got[row : row + 1, begin:end], alone, what=f"row {row}, document at {begin}")


@pytest.mark.parametrize("state", ["none", "shared"])
def test_one_step_is_block_step(state):
    A, v, x0 = _inputs(2, 1, 3, 8, state, seed=6)
    got = _check_against_loop(A, v, x0)
    start = torch.zeros(1, 3, 8) if x0 is None else x0
    scaled_close(got[:, 0], block_step(A[:, 0].double(), v[:, 0].double(), start.double()))


@pytest.mark.parametrize("chunk_size", [None, 3])
def test_only_the_inputs_that_need_gradients_get_them(chunk_size):
    """A without requires_grad: the kernel skips dA (NEED_DA off) and v, x_0 still follow the loop."""
    A, v, x0 = (t.to(DEVICE) for t in _inputs(2, 8, 2, 4, "shared", seed=7))
    v.requires_grad_()
    x0.requires_grad_()
    dv, dx0 = torch.autograd.grad(block_scan_triton(A, v, x0, chunk_size=chunk_size).sum(), [v, x0])
    exact = [t.detach().double().requires_grad_() for t in (v, x0)]
    dv_ref, dx0_ref = torch.autograd.grad(block_scan_ref(A.double(), *exact).sum(), exact)
    scaled_close(dv, dv_ref, GRAD_REL, what="gradient of v")
    scaled_close(dx0, dx0_ref, GRAD_REL, what="gradient of x0")


def test_dtypes_as_block_scan():
    """The return dtype of block_scan: float32 for half precision, float64 stays float64 (computed in float32)."""
    A, v, x0 = (t.to(DEVICE) for t in _inputs(1, 3, 2, 2, "batch", seed=2))
    assert block_scan_triton(A.bfloat16(), v.bfloat16(), x0).dtype == torch.float32
    got = block_scan_triton(A.double(), v.double(), x0.double())
    assert got.dtype == torch.float64
    scaled_close(got, block_scan_ref(A.double(), v.double(), x0.double()))


def test_what_cannot_run_is_refused_naming_why():
    assert can_run_block_scan(DEVICE, MAX_BLOCK_SIZE) == (True, "")
    usable, reason = can_run_block_scan(DEVICE, MAX_BLOCK_SIZE + 1)
    assert not usable and reason.startswith("block size")
    assert can_run_block_scan("meta")[1].startswith("device")
    big = MAX_BLOCK_SIZE * 2
    with pytest.raises(ValueError, match=f"b = {big}"):
        block_scan_triton(torch.zeros(1, 2, 1, big, big, device=DEVICE), torch.zeros(1, 2, 1, big, device=DEVICE))
    A, v, _ = (t.to(DEVICE) if t is not None else None for t in _inputs(1, 2, 2, 2, "none"))
    with pytest.raises(ValueError, match="heads_per_program"):
        block_scan_triton(A, v, heads_per_program=3)
    with pytest.raises(ValueError, match="v must have shape"):
        block_scan_triton(A, v[:, :1])
    for bad in (0, -4, 2.0, True):
        with pytest.raises(ValueError, match="chunk_size must be a positive int"):
            block_scan_triton(A, v, chunk_size=bad)


# ----------------------------------------------------------------------------- the BDLRNN mixer
def _mixer_pair():
    """A float32 mixer with scan="triton" and its float64 copy with scan="sequential" (the reference)."""
    from ssmhub.layers.bdlrnn import BDLRNNMixer

    torch.manual_seed(0)
    mixer = BDLRNNMixer(8, block_size=4, transition_hidden_size=16, scan="triton").to(DEVICE)
    reference = BDLRNNMixer(8, block_size=4, transition_hidden_size=16, scan="sequential").to(DEVICE).double()
    reference.load_state_dict(mixer.state_dict())
    return mixer, reference


@pytest.mark.parametrize("chunk_size", [None, 3])
def test_mixer_with_the_triton_scan_matches_the_loop_with_padding_and_packed_rows(chunk_size, monkeypatch):
    """BDLRNNMixer(scan="triton") against its float64 copy with scan="sequential": outputs, final state and the
    input gradient, on packed rows (document starts) with left padding and a hole. The layer adds an MLP of
    ≤ 16 terms and the normalisation (≈ 15 rounded stages) to the 10-step scan: within FP32_REL's 40 stages.
    chunk_size = 3: the mixer's Triton scan swapped for the chunked one (4 chunks, the last of 1 step)."""
    from ssmhub.layers import bdlrnn

    monkeypatch.setattr(bdlrnn, "block_scan_triton", functools.partial(block_scan_triton, chunk_size=chunk_size))
    mixer, reference = _mixer_pair()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 10, 8, generator=gen).to(DEVICE)
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, :2] = 0  # left padding
    mask[0, 6] = 0  # a hole inside a document
    starts = torch.zeros(2, 10, dtype=torch.bool)
    starts[0, [0, 4]] = True
    starts[1, [2, 7]] = True
    mask, starts = mask.to(DEVICE), starts.to(DEVICE)
    x32, x64 = x.clone().requires_grad_(), x.double().requires_grad_()
    y, state = mixer(x32, mask, return_state=True, document_starts=starts)
    y_ref, state_ref = reference(x64, mask, return_state=True, document_starts=starts)
    scaled_close(y, y_ref, what="outputs")
    scaled_close(state["bdlrnn_state"], state_ref["bdlrnn_state"], what="final state")
    weight = torch.randn(y.shape, generator=gen).to(DEVICE)
    (grad,) = torch.autograd.grad((y * weight).sum(), x32)
    (grad_ref,) = torch.autograd.grad((y_ref * weight.double()).sum(), x64)
    scaled_close(grad, grad_ref, GRAD_REL, what="input gradient")


def test_mixer_scan_choice():
    """scan="auto" is the Triton kernel for float32 blocks on CUDA, the parallel scan for float64 ones there, and the
    loop on the CPU (even where the interpreter could run the kernel); "triton" that cannot run raises naming it."""
    from ssmhub.layers import bdlrnn

    A = torch.zeros(1, 2, 2, 4, 4, device=DEVICE)
    on_cuda = DEVICE.type == "cuda"
    assert bdlrnn._choose_scan("auto", A) == ("triton" if on_cuda else "sequential")
    assert bdlrnn._choose_scan("auto", A.double()) == ("parallel" if on_cuda else "sequential")
    assert bdlrnn._choose_scan("auto", A.cpu()) == "sequential"
    assert bdlrnn._choose_scan("triton", A) == "triton"
    refuse = pytest.MonkeyPatch()
    with refuse.context() as patch:
        patch.setattr(bdlrnn, "can_run_block_scan", lambda device, block: (False, "cpu: no interpreter"))
        with pytest.raises(ValueError, match="scan='triton'"):
            bdlrnn._choose_scan("triton", A)
