"""The Triton selective scan (ssmhub.ops.triton.selective_scan) against the float64 loop oracle: values and the
gradients of all eight inputs, padding, packed rows, tiny steps, the decode step, and the layer's dispatch.

On a CPU-only machine the kernels run under TRITON_INTERPRET=1 (set before the first Triton import), which is
slow: shapes are tiny (T ≤ 30 with chunks of 8 so that several chunks and a partial one are crossed, E = 12 with
blocks of 8 channels so that the second block is partly masked, N = 5 padded to 8 or N = 4). Skipped without
triton.
"""

import os

import pytest
import torch
from comparisons import MODEL_GRAD_REL, MODEL_REL, scaled_close

import ssmhub.ops.triton
from ssmhub.layers import mamba
from ssmhub.layers.mamba import MambaMixer, MambaOptions, scan_for
from ssmhub.ops import selective_scan, selective_scan_ref, selective_step
from ssmhub.ops.triton.selective_scan import can_run_selective_scan, selective_scan_triton

if not torch.cuda.is_available():  # the kernels are decorated (interpreted or compiled) at their first import
    os.environ.setdefault("TRITON_INTERPRET", "1")
pytest.importorskip("triton")

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
pytestmark = pytest.mark.skipif(
    not can_run_selective_scan(DEVICE)[0], reason="Triton cannot run here: " + can_run_selective_scan(DEVICE)[1]
)

NAMES = ("x", "delta", "A", "B", "C", "D", "z", "initial_state")
SMALL = {"chunk_size": 8, "block_d": 8}  # several chunks and channel blocks at tiny shapes


def _inputs(batch=2, seq_len=26, channels=12, state_size=5, seed=0):
    """name -> float64 tensor on DEVICE: x, Δ > 0, A < 0, B, C, D, z, h0 with Mamba-like magnitudes."""
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64, device="cpu")

    tensors = {
        "x": randn(batch, seq_len, channels),
        "delta": torch.nn.functional.softplus(randn(batch, seq_len, channels) - 1),
        "A": -torch.exp(randn(channels, state_size)),
        "B": randn(batch, seq_len, state_size),
        "C": randn(batch, seq_len, state_size),
        "D": randn(channels),
        "z": randn(batch, seq_len, channels),
        "initial_state": randn(batch, channels, state_size),
    }
    return {name: t.to(DEVICE) for name, t in tensors.items()}


def _run(fn, inputs, dtype, y_weight, final_weight=None, **kwargs):
    """y, the final state and d(Σ y·y_weight + Σ final·final_weight)/d(each given input), inputs cast to dtype."""
    leaves = {name: t.detach().to(dtype).requires_grad_() for name, t in inputs.items() if t is not None}
    y, final = fn(**leaves, return_final_state=True, **kwargs)
    loss = (y.double() * y_weight).sum()
    if final_weight is not None:
        loss = loss + (final.double() * final_weight).sum()
    grads = torch.autograd.grad(loss, list(leaves.values()))
    return y.detach(), final.detach(), dict(zip(leaves, grads))


def _assert_matches_reference(inputs, use_final=True, resets=None):
    """Triton in float32 against the loop oracle in float64: y, the final state and every input's gradient.
    A scan of ≤ 30 steps with sums over N ≤ 8 and E ≤ 12 terms is within the depth FP32_REL is derived for
    (tests/comparisons.py: ≤ ~40 rounded stages); the backward runs the same recurrence reversed."""
    gen = torch.Generator(device="cpu").manual_seed(99)
    y_weight = torch.randn(inputs["x"].shape, generator=gen, dtype=torch.float64, device="cpu").to(DEVICE)
    final_shape = (*inputs["x"].shape[::2], inputs["A"].shape[1])  # (Bt, E, N)
    final_weight = torch.randn(final_shape, generator=gen, dtype=torch.float64, device="cpu")
    final_weight = final_weight.to(DEVICE) if use_final else None
    got = _run(selective_scan_triton, inputs, torch.float32, y_weight, final_weight, resets=resets, **SMALL)
    want = _run(selective_scan_ref, inputs, torch.float64, y_weight, final_weight, resets=resets)
    assert got[0].dtype == got[1].dtype == torch.float32
    scaled_close(got[0], want[0], what="y")
    scaled_close(got[1], want[1], what="final state")
    assert got[2].keys() == want[2].keys()
    for name in got[2]:
        scaled_close(got[2][name], want[2][name], what=f"gradient of {name}")


def test_plain_scan_matches_reference():
    """No D, no gate, zero initial state, the final state unused (its gradient is zero)."""
    inputs = _inputs()
    inputs.update(D=None, z=None, initial_state=None)
    _assert_matches_reference(inputs, use_final=False)


def test_skip_gate_initial_and_final_state_match_reference():
    """All eight inputs, with a loss on the final state as well: its gradient flows back through every step."""
    _assert_matches_reference(_inputs(seed=1))


def test_power_of_two_state_size_and_one_channel_block():
    """N = 4 (no padding of the state dim) and E = 8 = BLOCK_D (no masked channel), T = 16 = two full chunks."""
    _assert_matches_reference(_inputs(batch=1, seq_len=16, channels=8, state_size=4, seed=2))


def test_packed_rows_restart_the_state():
    """resets[b, t] restarts the state from zero before step t: at t = 0 (discarding h0), at a chunk boundary
    (t = 16) and inside a chunk; the gradient through a restart reaches neither the earlier state nor Δ·A there."""
    inputs = _inputs(seed=3, seq_len=22)
    resets = torch.zeros(2, 22, dtype=torch.bool, device=DEVICE)
    resets[0, [0, 16]] = True
    resets[1, [5, 11, 12]] = True
    _assert_matches_reference(inputs, resets=resets)


def test_tiny_steps_match_reference():
    """Δ → 0 (1e-6): Ā = exp(Δ·A) rounds to within an ulp of 1 and Δ·x·B is tiny; nothing is lost beyond
    float32 round-off relative to each output's scale."""
    inputs = _inputs(seed=4, seq_len=12)
    inputs["delta"] = torch.full_like(inputs["delta"], 1e-6)
    _assert_matches_reference(inputs)


def test_padding_leaves_the_state_unchanged():
    """Δ = 0 makes a step exact identity: Ā = exp2(0) = 1 and Δ·x·B = 0, so ``h·1 + 0 = h`` in any rounding or
    FMA order. Row 0 has 6 padding steps inside the sequence, row 1 the same tokens with the padding at the
    end: after every real token the two rows hold states computed by the same float ops on the same operands
    in the same order (one kernel launch), so their final states are equal bit for bit, and a row of padding
    only returns its initial state exactly."""
    inputs = _inputs(batch=3, seq_len=30, seed=5)
    real = torch.ones(30, dtype=torch.bool)
    real[10:16] = False  # row 0: tokens 0..9, padding, tokens 10..23
    order = torch.cat([torch.arange(30)[real], torch.arange(30)[~real]])  # row 1: tokens 0..23, then padding
    for name in ("x", "delta", "B", "C", "z"):
        inputs[name][1] = inputs[name][0, order.to(DEVICE)]
    inputs["delta"][0, 10:16] = 0.0
    inputs["delta"][1, 24:] = 0.0
    inputs["delta"][2] = 0.0  # row 2: nothing but padding
    inputs["initial_state"][1] = inputs["initial_state"][0]
    f32 = {name: t.float() for name, t in inputs.items()}
    y, final = selective_scan_triton(**f32, return_final_state=True, **SMALL)
    assert torch.equal(final[0], final[1])
    assert torch.equal(final[2], f32["initial_state"][2])
    scaled_close(y[0, real.to(DEVICE)], y[1, :24], what="outputs at the real tokens")
    want, want_final = selective_scan_ref(**inputs, return_final_state=True)
    scaled_close(y, want, what="y")
    scaled_close(final, want_final, what="final state")


def test_one_step_equals_the_decode_step():
    """T = 1 against selective_step (the O(1) recurrent decode step) from a given state."""
    inputs = _inputs(seq_len=1, seed=6)
    f32 = {name: t.float() for name, t in inputs.items()}
    y, final = selective_scan_triton(**f32, return_final_state=True, **SMALL)
    y_step, state = selective_step(
        *(inputs[name][:, 0] if inputs[name].dim() == 3 else inputs[name] for name in NAMES[:7]),
        state=inputs["initial_state"],
    )
    scaled_close(y[:, 0], y_step, what="y")
    scaled_close(final, state, what="state")


def test_default_chunk_and_block_and_input_dtype():
    """The default chunk (64 > T: one chunk) and BLOCK_D (32 > E: one masked block); y comes back in x's dtype."""
    inputs = _inputs(seq_len=9, seed=7)
    y, final = selective_scan_triton(**inputs, return_final_state=True)
    assert y.dtype == torch.float64 and final.dtype == torch.float32
    want, want_final = selective_scan_ref(**inputs, return_final_state=True)
    scaled_close(y, want, what="y")
    scaled_close(final, want_final, what="final state")


def test_invalid_arguments_are_named():
    inputs = {name: t.float() for name, t in _inputs(seq_len=3).items()}
    with pytest.raises(ValueError, match="B must have shape"):
        selective_scan_triton(**{**inputs, "B": inputs["B"][:, :, :3]})
    with pytest.raises(ValueError, match="block_d must be a power of two"):
        selective_scan_triton(**inputs, block_d=12)
    with pytest.raises(ValueError, match="chunk_size"):
        selective_scan_triton(**inputs, chunk_size=0)


# --------------------------------------------------------------------------------------------- the layer's choice
def _mixer(scan, seed=0):
    torch.manual_seed(seed)
    mixer = MambaMixer(8, state_size=4, scan=scan).to(DEVICE)  # E = 16: two channel blocks of 8 below
    with torch.no_grad():  # move Δ away from its tiny init so that the state carries real history
        mixer.dt_proj.bias.add_(2.0)
        mixer.ssm.D.normal_()
    return mixer


def test_auto_is_the_default_and_runs_the_chunked_scan_on_cpu(monkeypatch):
    assert MambaOptions().scan == "auto"
    assert (
        scan_for("auto", torch.zeros(1, 1, 1, device="cpu")) is selective_scan
    )  # CPU: today's default path, unchanged
    assert scan_for("chunked", torch.zeros(1, 1, 1, device="cpu")) is selective_scan
    calls = []

    def spy(*args, **kwargs):
        calls.append(1)
        return selective_scan(*args, **kwargs)

    monkeypatch.setitem(mamba._SCAN_FUNCTIONS, "chunked", spy)
    _mixer("auto").cpu()(torch.randn(2, 5, 8, device="cpu"))
    assert calls == [1]


def test_triton_scan_refuses_a_device_it_cannot_run_on(monkeypatch):
    """Without the interpreter, CPU tensors cannot run Triton: the check says why, the op and the layer raise."""
    monkeypatch.setattr(ssmhub.ops.triton, "interpreting", lambda kernels_module: False)
    usable, reason = can_run_selective_scan("cpu")
    assert not usable and reason.startswith("cpu:")
    inputs = {name: t.float().cpu() for name, t in _inputs(seq_len=2).items()}
    with pytest.raises(ValueError, match="cannot run this call: cpu:"):
        selective_scan_triton(**inputs)
    with pytest.raises(ValueError, match="scan='triton' cannot run here"):
        _mixer("triton").cpu()(torch.randn(1, 3, 8, device="cpu"))


def test_layer_with_triton_scan_matches_chunked():
    """A whole mixer (packed documents, a returned state) with the Triton scan against the chunked torch scan,
    forward and gradients of every parameter: two float32 computations of the same small model."""
    x = torch.randn(2, 19, 8, generator=torch.Generator(device="cpu").manual_seed(8), device="cpu").to(DEVICE)
    starts = torch.zeros(2, 19, dtype=torch.bool, device=DEVICE)
    starts[1, 9] = True
    outputs = {}
    for scan in ("triton", "chunked"):
        mixer = _mixer(scan)
        y, state = mixer(x, None, None, True, document_starts=starts)
        grads = torch.autograd.grad((y**2).sum() + state["ssm_state"].sum(), list(mixer.parameters()))
        outputs[scan] = (y, state["ssm_state"], grads)
    (y, final, grads), (y_ref, final_ref, grads_ref) = outputs["triton"], outputs["chunked"]
    scaled_close(y, y_ref, rel=MODEL_REL, what="y")
    scaled_close(final, final_ref, rel=MODEL_REL, what="final state")
    for (name, _), g, g_ref in zip(_mixer("chunked").named_parameters(), grads, grads_ref):
        scaled_close(g, g_ref, rel=MODEL_GRAD_REL, what=f"gradient of {name}")
