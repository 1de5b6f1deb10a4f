"""selective_scan (chunked, own backward) vs the loop oracle, explicit formulas and transformers' slow path."""

import itertools
import math

import pytest
import torch
from comparisons import FP32_REL, scaled_close
from devices import bf16_autocast

from ssmhub.ops import selective_scan, selective_scan_ref, selective_step

NAMES = ["x", "delta", "A", "B", "C", "D", "z", "initial_state"]


def _inputs(batch, seq_len, channels, state_size, seed=0, dtype=torch.float64):
    """x, Δ (positive), A (negative), B, C, D, z, h0 in ``dtype``, Mamba-like magnitudes."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    x = randn(batch, seq_len, channels)
    delta = torch.nn.functional.softplus(randn(batch, seq_len, channels) - 1)
    A = -torch.exp(randn(channels, state_size))
    tensors = [x, delta, A, randn(batch, seq_len, state_size), randn(batch, seq_len, state_size)]
    tensors += [randn(channels), randn(batch, seq_len, channels), randn(batch, channels, state_size)]
    return [t.to(dtype) for t in tensors]


def _run(fn, tensors, weights, **kwargs):
    """Outputs, final state and gradients w.r.t. all eight inputs of a weighted loss on both outputs."""
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    y, final = fn(*leaves, return_final_state=True, **kwargs)
    loss = (y * weights[0]).sum() + (final * weights[1]).sum()
    grads = torch.autograd.grad(loss, leaves, allow_unused=True, materialize_grads=True)
    return y.detach(), final.detach(), grads


def _weights(tensors, seed=1):
    """Random loss weights for y (shaped like x) and for the final state (shaped like h0)."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(t.shape, generator=gen, dtype=torch.float64).to(t.dtype) for t in (tensors[0], tensors[-1])]


def _assert_close_scaled(got, expected, rtol, atol, name):
    """assert_close with atol relative to the expected tensor's scale (max |·|, at least 1)."""
    scale = max(1.0, expected.abs().max().item())
    torch.testing.assert_close(got, expected, rtol=rtol, atol=atol * scale, msg=lambda m: f"{name}: {m}")


def _assert_runs_match(a, b, rtol, atol):
    (ya, fa, ga), (yb, fb, gb) = a, b
    _assert_close_scaled(ya, yb, rtol, atol, "y")
    _assert_close_scaled(fa, fb, rtol, atol, "final state")
    for name, u, v in zip(NAMES, ga, gb):
        _assert_close_scaled(u, v, rtol, atol, f"grad {name}")


def test_ref_matches_explicit_double_loop():
    """The oracle itself, against the formula written out per element with math.exp (float64)."""
    x, delta, A, B, C, D, z, h0 = _inputs(2, 5, 3, 2, seed=3)
    y, final = selective_scan_ref(x, delta, A, B, C, D, z, h0, return_final_state=True)
    for b in range(2):
        h = [[h0[b, e, n].item() for n in range(2)] for e in range(3)]
        for t in range(5):
            for e in range(3):
                d, u = delta[b, t, e].item(), x[b, t, e].item()
                for n in range(2):
                    h[e][n] = math.exp(d * A[e, n].item()) * h[e][n] + d * B[b, t, n].item() * u
                out = sum(C[b, t, n].item() * h[e][n] for n in range(2)) + D[e].item() * u
                zz = z[b, t, e].item()
                out *= zz / (1 + math.exp(-zz))
                assert y[b, t, e].item() == pytest.approx(out, rel=1e-12, abs=1e-12)
        for e in range(3):
            for n in range(2):
                assert final[b, e, n].item() == pytest.approx(h[e][n], rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("fn", [selective_scan_ref, selective_scan])
def test_constant_inputs_match_geometric_series(fn):
    """Constant Δ, B, C and x = 1 from h = 0: h_t = Δ·B·(1 − a^{t+1})/(1 − a) with a = exp(Δ·A)."""
    seq_len, d, a_val = 50, 0.3, -0.7
    x = torch.ones(1, seq_len, 2, dtype=torch.float64)
    delta = torch.full_like(x, d)
    A = torch.full((2, 3), a_val, dtype=torch.float64)
    B = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64).expand(1, seq_len, 3)
    C = torch.tensor([0.3, 1.0, -1.0], dtype=torch.float64).expand(1, seq_len, 3)
    a = math.exp(d * a_val)
    t = torch.arange(seq_len, dtype=torch.float64)
    expected = d * (1 - a ** (t + 1)) / (1 - a) * float(B[0, 0] @ C[0, 0])  # (T,)
    y, _ = fn(x, delta, A, B, C)
    torch.testing.assert_close(y[0], expected.unsqueeze(-1).expand(seq_len, 2), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seq_len", [1, 2, 7, 63, 64, 65, 200, 1000])
def test_fast_matches_ref_values_gradients_final_state(seq_len):
    """float32: outputs, final state and gradients w.r.t. all 8 inputs, chunk sizes dividing T or not."""
    batch, channels, state_size = (2, 3, 4) if seq_len < 1000 else (1, 3, 2)
    tensors = _inputs(batch, seq_len, channels, state_size, seed=seq_len, dtype=torch.float32)
    weights = _weights(tensors)
    expected = _run(selective_scan_ref, tensors, weights)
    for chunk in sorted({1, 7, 16, 64, seq_len}) if seq_len < 1000 else (16, 64, 128):
        got = _run(selective_scan, tensors, weights, chunk_size=chunk)
        assert got[0].dtype == torch.float32 and got[1].dtype == torch.float32
        _assert_runs_match(got, expected, rtol=1e-4, atol=1e-5)


def test_default_chunk_size_and_float64_matches_ref_tightly():
    tensors = _inputs(2, 70, 3, 4, seed=5)
    weights = _weights(tensors)
    got = _run(selective_scan, tensors, weights)
    assert got[0].dtype == torch.float64 and got[1].dtype == torch.float64
    assert all(g.dtype == torch.float64 for g in got[2])
    _assert_runs_match(got, _run(selective_scan_ref, tensors, weights), rtol=1e-10, atol=1e-12)


def test_gradients_of_y_alone_and_of_the_final_state_alone():
    """The two usual losses: on y with no final state returned, and on the final state with y unused."""
    tensors = _inputs(2, 23, 3, 4, seed=7)
    weights = _weights(tensors)
    for fn, kwargs in ((selective_scan, {"chunk_size": 5}), (selective_scan_ref, {})):
        leaves = [t.detach().clone().requires_grad_() for t in tensors]
        from_y = torch.autograd.grad((fn(*leaves, **kwargs)[0] * weights[0]).sum(), leaves, materialize_grads=True)
        _, final = fn(*leaves, return_final_state=True, **kwargs)
        from_final = torch.autograd.grad((final * weights[1]).sum(), leaves, allow_unused=True, materialize_grads=True)
        if fn is selective_scan:
            fast = from_y, from_final
        else:
            for name, got, expected in zip(NAMES * 2, (*fast[0], *fast[1]), (*from_y, *from_final)):
                _assert_close_scaled(got, expected, 1e-10, 1e-12, f"grad {name}")
    assert torch.count_nonzero(from_final[5]) == 0 and torch.count_nonzero(from_final[6]) == 0  # D, z: y only


def test_custom_backward_passes_gradcheck():
    """The hand-written backward against finite differences (float64), chunks not dividing T."""
    tensors = [t.requires_grad_() for t in _inputs(2, 5, 3, 2, seed=9)]

    def fn(*args):
        return selective_scan(*args, return_final_state=True, chunk_size=2)

    assert torch.autograd.gradcheck(fn, tensors)


def test_optional_arguments_and_no_grad():
    x, delta, A, B, C, D, z, h0 = _inputs(2, 9, 3, 4, seed=2)
    for kwargs in ({}, {"D": D}, {"z": z}, {"initial_state": h0}):
        torch.testing.assert_close(
            selective_scan(x, delta, A, B, C, chunk_size=4, **kwargs)[0],
            selective_scan_ref(x, delta, A, B, C, **kwargs)[0],
        )
    for kwargs in ({}, {"D": D}, {"z": z}):  # the gradients without the skip or without the gate
        leaves = [t.detach().clone().requires_grad_() for t in (x, delta, A, B, C, *kwargs.values())]
        names = ["x", "delta", "A", "B", "C", *kwargs]
        grads = []
        for fn, extra in ((selective_scan, {"chunk_size": 4}), (selective_scan_ref, {})):
            y = fn(*leaves[:5], **dict(zip(kwargs, leaves[5:])), **extra)[0]
            grads.append(torch.autograd.grad((y * y).sum(), leaves))
        for name, got, expected in zip(names, *grads):
            _assert_close_scaled(got, expected, 1e-10, 1e-12, f"grad {name} with {sorted(kwargs)}")
    with torch.no_grad():
        y, final = selective_scan(x.requires_grad_(), delta, A, B, C, D, z, h0)
    assert not y.requires_grad and final is None  # the final state only when asked for
    torch.testing.assert_close(y, selective_scan_ref(x, delta, A, B, C, D, z, h0)[0])


def test_non_contiguous_inputs():
    """Inputs sliced from (Bt, E, T)-layout or wider tensors, as a mixer produces them."""
    x, delta, A, B, C, D, z, h0 = _inputs(2, 21, 3, 4, seed=4)
    xz = torch.cat([x, z], dim=-1)  # (Bt, T, 2E)
    args = [xz[..., :3], delta.transpose(1, 2).contiguous().transpose(1, 2), A.t().contiguous().t()]
    args += [B.transpose(1, 2).contiguous().transpose(1, 2), C, D, xz[..., 3:], h0.transpose(1, 2).contiguous().mT]
    assert not args[0].is_contiguous() and not args[6].is_contiguous()
    weights = _weights(args)
    _assert_runs_match(
        _run(selective_scan, args, weights, chunk_size=8),
        _run(selective_scan_ref, [t.contiguous() for t in args], weights),
        rtol=1e-10,
        atol=1e-12,
    )


@pytest.mark.parametrize("split", [1, 16, 33])
def test_two_pieces_equal_the_whole(split):
    """Scanning [0, s) then [s, T) from the first piece's final state equals scanning [0, T)."""
    x, delta, A, B, C, D, z, h0 = _inputs(2, 50, 3, 4, seed=split)
    y, final = selective_scan(x, delta, A, B, C, D, z, h0, return_final_state=True, chunk_size=8)
    parts = [t[:, :split] for t in (x, delta)], [t[:, split:] for t in (x, delta)]
    y1, mid = selective_scan(
        *parts[0], A, B[:, :split], C[:, :split], D, z[:, :split], h0, return_final_state=True, chunk_size=8
    )
    y2, end = selective_scan(
        *parts[1], A, B[:, split:], C[:, split:], D, z[:, split:], mid, return_final_state=True, chunk_size=8
    )
    torch.testing.assert_close(torch.cat([y1, y2], dim=1), y, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(end, final, rtol=1e-12, atol=1e-12)


def test_step_by_step_equals_ref():
    x, delta, A, B, C, D, z, h0 = _inputs(3, 17, 4, 5, seed=6)
    for start in (None, h0):
        y, final = selective_scan_ref(x, delta, A, B, C, D, z, start, return_final_state=True)
        state = start
        for t in range(17):
            y_t, state = selective_step(x[:, t], delta[:, t], A, B[:, t], C[:, t], D, z[:, t], state)
            assert y_t.shape == (3, 4) and state.shape == (3, 4, 5)
            torch.testing.assert_close(y_t, y[:, t], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(state, final, rtol=1e-12, atol=1e-12)
    # without D and z, and float32 in / float32 out
    y_t, state = selective_step(x[:, 0].float(), delta[:, 0].float(), A.float(), B[:, 0].float(), C[:, 0].float())
    assert y_t.dtype == torch.float32 and state.dtype == torch.float32
    torch.testing.assert_close(y_t, selective_scan_ref(x[:, :1], delta[:, :1], A, B[:, :1], C[:, :1])[0][:, 0].float())


@pytest.mark.parametrize("fn", [selective_scan_ref, selective_scan])
def test_zero_delta_leaves_state_unchanged(fn):
    """Δ = 0 (padding): the state passes through and the position adds nothing; exactly within one call."""
    x, delta, A, B, C, _, _, h0 = _inputs(2, 30, 3, 4, seed=8, dtype=torch.float32)
    delta[:, 10:20] = 0  # a run of padding in the middle
    delta[0, 25:] = 0  # and at the end of one sequence
    # chunks of 5 end at every prefix compared below: the prefix runs cut their chunks where the whole run does
    kwargs = {"chunk_size": 5} if fn is selective_scan else {}
    y, final = fn(x, delta, A, B, C, initial_state=h0, return_final_state=True, **kwargs)
    _, at_9 = fn(x[:, :10], delta[:, :10], A, B[:, :10], C[:, :10], None, None, h0, True, **kwargs)
    _, at_19 = fn(x[:, :20], delta[:, :20], A, B[:, :20], C[:, :20], None, None, h0, True, **kwargs)
    _, at_24 = fn(x[:, :25], delta[:, :25], A, B[:, :25], C[:, :25], None, None, h0, True, **kwargs)
    # separate calls of other lengths (other chunk counts and buffer sizes, where exp2's vectorised body and scalar
    # tail may differ by an ulp on the same number): the same states to float32 round-off of ≤ 30 steps (FP32_REL)
    scaled_close(at_19, at_9, FP32_REL, "state after the run of Δ = 0")
    scaled_close(final[0], at_24[0], FP32_REL, "state after the trailing Δ = 0")
    # y_t = C_t·h_9 for t in the run: the state is read, not written
    torch.testing.assert_close(y[:, 10:20], torch.einsum("ben,btn->bte", at_9, C[:, 10:20]))
    _, end = fn(x, torch.zeros_like(delta), A, B, C, initial_state=h0, return_final_state=True, **kwargs)
    assert torch.equal(end, h0)  # one call, Δ = 0 throughout: exp(0·A) = 1 and 0·x·B = 0, so h = 1·h + 0 exactly


@pytest.mark.parametrize("chunk", [4, 64])
def test_extreme_decay_stays_finite_and_equal_to_ref(chunk):
    """Δ·A summing to ≈ −1000 and beyond inside a chunk, mixed with Δ = 0 runs: no overflow, same as the loop."""
    batch, seq_len, channels, state_size = 2, 64, 3, 4
    tensors = _inputs(batch, seq_len, channels, state_size, seed=10, dtype=torch.float32)
    delta, A = tensors[1], tensors[2]
    A.copy_(-torch.linspace(1.0, 16.0, state_size).expand(channels, state_size))
    delta.fill_(1.0)
    delta[:, :16] = 4.0  # Σ Δ·A over the first 16 steps: −64 … −1024
    delta[:, 16:24] = 0.0  # a padding run after the collapse
    delta[0, 40] = 100.0  # one step of Δ·A down to −1600: exp underflows to exactly 0
    delta[:, 48:] = 1e-6  # near-identity steps
    assert (delta[:, :16, :, None] * A).sum(1).min() <= -1000
    weights = _weights(tensors)
    got = _run(selective_scan, tensors, weights, chunk_size=chunk)
    assert torch.isfinite(got[0]).all() and torch.isfinite(got[1]).all()
    assert all(torch.isfinite(g).all() for g in got[2])
    _assert_runs_match(got, _run(selective_scan_ref, tensors, weights), rtol=1e-4, atol=1e-5)


def test_bfloat16_autocast_keeps_float32_math():
    x, delta, A, B, C, D, z, h0 = _inputs(2, 100, 8, 4, seed=12, dtype=torch.float32)
    delta = delta * 0.02  # slow decay: exp(Δ·A) ≈ 0.99, which bf16 would round to 1
    expected, final32 = selective_scan(x, delta, A, B, C, D, z, h0, return_final_state=True)
    with bf16_autocast():
        got, final = selective_scan(x, delta, A, B, C, D, z, h0, return_final_state=True)
        ref, _ = selective_scan_ref(x, delta, A, B, C, D, z, h0)
        y_t, state = selective_step(x[:, 0], delta[:, 0], A, B[:, 0], C[:, 0], D, z[:, 0], h0)
    assert got.dtype == torch.float32 and final.dtype == torch.float32 and state.dtype == torch.float32
    torch.testing.assert_close(final, final32, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ref, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y_t, expected[:, 0], rtol=1e-5, atol=1e-5)
    # bf16 inputs: output in bf16, the recurrence still in float32 (the state is float32 and exact for these inputs)
    args = [t.bfloat16() for t in (x, delta, A, B, C, D, z, h0)]
    y16, state16 = selective_scan(*args, return_final_state=True)
    assert y16.dtype == torch.bfloat16 and state16.dtype == torch.float32
    y32, state32 = selective_scan_ref(*[t.float() for t in args], return_final_state=True)
    torch.testing.assert_close(state16, state32, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y16, y32.bfloat16())


def test_matches_transformers_slow_path():
    """selective_scan_ref equals transformers' mamba_selective_scan (layout (Bt, E, T) / (Bt, N, T)), to 1e-5."""
    modeling_mamba = pytest.importorskip("transformers.models.mamba.modeling_mamba")
    x, delta, A, B, C, D, z, _ = _inputs(2, 40, 6, 4, seed=13, dtype=torch.float32)
    y, final = selective_scan_ref(x, delta, A, B, C, D, z, return_final_state=True)
    y_hf, final_hf = modeling_mamba.mamba_selective_scan(
        x.transpose(1, 2),
        delta.transpose(1, 2),
        A,
        B.transpose(1, 2),
        C.transpose(1, 2),
        D=D,
        z=z.transpose(1, 2),
        delta_bias=None,
        delta_softplus=False,
        return_last_state=True,
    )
    torch.testing.assert_close(y, y_hf.transpose(1, 2), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(final, final_hf, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(selective_scan(x, delta, A, B, C, D, z)[0], y, rtol=1e-5, atol=1e-5)


def _bad_scan_cases():
    x, delta, A, B, C, D, z, h0 = _inputs(2, 5, 3, 4)
    good = {"x": x, "delta": delta, "A": A, "B": B, "C": C, "D": D, "z": z, "initial_state": h0}
    cases = [
        ("x", x[0], "x must have shape (Bt, T, E)"),
        ("x", x[:, :0], "T ≥ 1"),
        ("delta", delta[:, :4], "delta must have shape (Bt, T, E) = (2, 5, 3)"),
        ("A", A[0], "A must have shape (E, N)"),
        ("A", A[:2], "A must have shape (E, N) with E = 3"),
        ("B", B[:, :4], "B must have shape (Bt, T, N) = (2, 5, 4)"),
        ("C", C[..., :3], "C must have shape (Bt, T, N) = (2, 5, 4)"),
        ("D", D[:2], "D must have shape (E,) = (3,)"),
        ("z", z[:1], "z must have shape (Bt, T, E) = (2, 5, 3)"),
        ("initial_state", h0.mT, "initial_state must have shape (Bt, E, N) = (2, 3, 4)"),
    ]
    return [({**good, name: bad}, message) for name, bad, message in cases]


@pytest.mark.parametrize("fn", [selective_scan, selective_scan_ref])
@pytest.mark.parametrize("case", range(10))
def test_bad_inputs_raise_value_error_naming_the_argument(fn, case):
    kwargs, message = _bad_scan_cases()[case]
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        fn(**kwargs)


@pytest.mark.parametrize("chunk_size", [0, -3, 2.5, True])
def test_bad_chunk_size(chunk_size):
    x, delta, A, B, C, *_ = _inputs(1, 4, 2, 2)
    with pytest.raises(ValueError, match="chunk_size must be a positive int"):
        selective_scan(x, delta, A, B, C, chunk_size=chunk_size)


def test_step_bad_inputs():
    x, delta, A, B, C, D, z, h0 = _inputs(2, 1, 3, 4)
    good = {"x_t": x[:, 0], "delta_t": delta[:, 0], "A": A, "B_t": B[:, 0], "C_t": C[:, 0], "D": D}
    good |= {"z_t": z[:, 0], "state": h0}
    cases = [
        ("x_t", x[0, 0], r"x_t must have shape \(Bt, E\)"),
        ("delta_t", delta[:1, 0], r"delta_t must have shape \(Bt, E\) = \(2, 3\)"),
        ("A", A.t(), r"A must have shape \(E, N\) with E = 3"),
        ("B_t", B[:, 0, :3], r"B_t must have shape \(Bt, N\) = \(2, 4\)"),
        ("C_t", C, r"C_t must have shape \(Bt, N\)"),
        ("D", D[:2], r"D must have shape \(E,\)"),
        ("z_t", z, r"z_t must have shape \(Bt, E\)"),
        ("state", h0[0], r"state must have shape \(Bt, E, N\) = \(2, 3, 4\)"),
    ]
    selective_step(**good)
    for name, bad, message in cases:
        with pytest.raises(ValueError, match=message):
            selective_step(**{**good, name: bad})


def test_step_of_several_mixers_at_once_equals_each_alone():
    """Rows (R, Bt, E) with one A and D per mixer, (R, 1, E, N) and (R, 1, E): each mixer's step, to float64
    round-off (other shapes: other vectorised loops and reduction orders)."""
    steps = [_inputs(2, 1, 3, 4, seed=seed) for seed in range(3)]
    stacked = [torch.stack(parts) for parts in zip(*steps)]  # (R, ...) of each input
    x, delta, A, B, C, D, z, h0 = stacked
    y, h = selective_step(x[:, :, 0], delta[:, :, 0], A[:, None], B[:, :, 0], C[:, :, 0], D[:, None], z[:, :, 0], h0)
    for r, (x, delta, A, B, C, D, z, h0) in enumerate(steps):
        y_r, h_r = selective_step(x[:, 0], delta[:, 0], A, B[:, 0], C[:, 0], D, z[:, 0], h0)
        # float64 (the inputs' dtype) one step deep: ~10 rounded stages, ≤ 1e-14 of the largest value
        scaled_close(y[r], y_r, 1e-12, f"y of mixer {r}")
        scaled_close(h[r], h_r, 1e-12, f"state of mixer {r}")


def _pieces_alone(fn, tensors, resets):
    """The oracle of a scan with resets: every row cut at its resets, each piece scanned alone from zero (the first
    piece of a row from the row's initial state unless it resets at 0). Returns y and the final states."""
    x, delta, A, B, C, D, z, h0 = tensors
    ys, finals = [], []
    for b in range(x.shape[0]):
        bounds = [0] + [t for t in resets[b].nonzero().flatten().tolist() if t > 0] + [x.shape[1]]
        pieces, state = [], h0[b : b + 1]
        for i, (s, e) in enumerate(itertools.pairwise(bounds)):
            start = None if i > 0 or bool(resets[b, 0]) else state
            row = [t[b : b + 1, s:e] for t in (x, delta)] + [A] + [t[b : b + 1, s:e] for t in (B, C)]
            y, state = fn(*row, D, z[b : b + 1, s:e], initial_state=start, return_final_state=True)
            pieces.append(y)
        ys.append(torch.cat(pieces, 1))
        finals.append(state)
    return torch.cat(ys), torch.cat(finals)


@pytest.mark.parametrize(
    "fn,kwargs", [(selective_scan, {"chunk_size": 4}), (selective_scan, {}), (selective_scan_ref, {})]
)
def test_resets_restart_the_state_as_pieces_scanned_alone(fn, kwargs):
    """Resets (document starts in a packed row): outputs, final state and all gradients equal each piece scanned
    alone, with pieces of lengths 1 and 2, resets on chunk edges and inside chunks, and a reset at t = 0 that
    discards the initial state; the chunked scan with resets also equals the loop with resets."""
    tensors = _inputs(2, 19, 3, 4, seed=11)
    resets = torch.zeros(2, 19, dtype=torch.bool)
    resets[0, [4, 5, 7, 13]] = True
    resets[1, [0, 8]] = True
    weights = _weights(tensors)
    got = _run(fn, tensors, weights, resets=resets, **kwargs)
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    y, final = _pieces_alone(selective_scan_ref, leaves, resets)
    loss = (y * weights[0]).sum() + (final * weights[1]).sum()
    expected = (y.detach(), final.detach(), torch.autograd.grad(loss, leaves, materialize_grads=True))
    _assert_runs_match(got, expected, rtol=1e-10, atol=1e-12)
    _assert_runs_match(got, _run(selective_scan_ref, tensors, weights, resets=resets), rtol=1e-10, atol=1e-12)


def test_resets_pass_gradcheck_and_bad_resets_are_refused():
    tensors = [t.requires_grad_() for t in _inputs(2, 5, 3, 2, seed=12)]
    resets = torch.tensor([[False, False, True, False, True], [True, False, False, True, False]])

    def fn(*args):
        return selective_scan(*args, return_final_state=True, chunk_size=2, resets=resets)

    assert torch.autograd.gradcheck(fn, tensors)
    for bad in (resets.long(), resets[:, :-1]):
        with pytest.raises(ValueError, match="resets must be a bool tensor"):
            selective_scan(*tensors, resets=bad)
