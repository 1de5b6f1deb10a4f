"""Diagonal linear RNN (DLR) math: Vandermonde powers, kernels, the parallel scan and the O(1) step.

Seed paper: Gupta, Mehta, Berant, "Simplifying and Understanding SSMs with Diagonal Linear RNNs"
(arXiv 2212.00768). Notation follows it: a state ``x_k ∈ C^N`` per channel, a diagonal ``Λ ∈ C^N``
shared by all channels, and per-channel output weights ``w ∈ C^N``.

- Eq. 1:  ``x_k = Λ ⊙ x_{k-1} + u_k``,  ``y_k = readout(<w, x_k>)``        (B is all ones)
- Eq. 4:  ``y_k = Σ_{j≤k} K_{k-j} u_j``  with  ``K_k = readout(<w, Λ^k>)``
- §2.3:   ``Λ = exp(-(logΛ_re)² + i·logΛ_im)``, so ``|λ| ≤ 1``.

``readout`` is ``"real"`` (``Re``, the plain DLR) or ``"half_imag"`` (``½·Im``). The second exists
for DLR-prod, whose kernel ``Re(K_k)·Im(K_k) = ½·Im(K_k²)`` is the kernel of the N²-state DLR
``(Λ⊗Λ, w⊗w)`` (§A.2); :func:`kronecker_dlr` builds those parameters so DLR-prod can be stepped.

Layouts: output weights ``w`` are real and imaginary parts, (H, N, 2) (the layout of the layer's parameter). The
state ``x`` is two float32 planes, (B, H, 2, N): ``x[:, :, 0]`` is ``Re x`` and ``x[:, :, 1]`` is ``Im x``, each
contiguous over the N modes, so that a compiled step reads and writes it with vector loads and no complex tensor
appears in its graph (Inductor and ONNX have no complex kernels). :func:`dlr_state_planes` and
:func:`dlr_state_complex` convert from and to a complex (B, H, N) state (the format before issue 45).

Phases ``k·θ`` reach about ``2π·L``; in float32 that is off by ~0.25 rad at L = 2^20, so they are
formed in float64 and reduced modulo 2π before anything is cast to float32. The Vandermonde matrix
``P_{nk} = λ_n^k`` is N×L complex (32 GB at N = 4096, L = 2^20), so it is built in chunks of L,
each chunk recomputed in the backward pass instead of stored.

Every fast function here has a slow reference (``*_ref``) that runs the recurrence one step at a
time in complex128.
"""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from .diagonal_step import diagonal_step_planes, polar_parts
from .fftconv import fft_conv
from .host_reads import are_free as host_reads_are_free
from .precision import TINY, float32_math

__all__ = [
    "READOUTS",
    "dlr_init",
    "dlr_kernel",
    "dlr_kernel_ref",
    "dlr_scan",
    "dlr_scan_recurrent",
    "dlr_scan_ref",
    "dlr_state_complex",
    "dlr_state_planes",
    "dlr_step",
    "dlr_step_coefficients",
    "dlr_step_with",
    "kronecker_dlr",
    "lambda_powers",
]

READOUTS = ("real", "half_imag")
_TWO_PI = 2.0 * math.pi
_CHUNK_ELEMENTS = 1 << 20  # complex entries of one Vandermonde chunk (8 MB)
_FINE_POWERS = 64  # Λ^j for j below this are formed once per call; Λ^k = Λ^(k-j)·Λ^j


def dlr_state_planes(state: torch.Tensor) -> torch.Tensor:
    """A complex state (..., N) as the float32 planes (..., 2, N) of :mod:`this module <ssmhub.ops.dlr>`'s layout."""
    return torch.stack([state.real, state.imag], dim=-2).float()


def dlr_state_complex(state: torch.Tensor) -> torch.Tensor:
    """The planes (..., 2, N) of a state as a complex64 tensor (..., N)."""
    return torch.complex(state[..., 0, :].float(), state[..., 1, :].float())


def _complex_weights(w: torch.Tensor) -> torch.Tensor:
    """Output weights (H, N, 2) as a complex (H, N) tensor (a view when ``w`` is contiguous float32)."""
    return torch.view_as_complex(w.float().contiguous())


def _readout(z: torch.Tensor, readout: str) -> torch.Tensor:
    if readout == "real":
        return z.real
    if readout == "half_imag":
        return 0.5 * z.imag
    raise ValueError(f"readout must be one of {READOUTS}; got {readout!r}")


def _exact_powers(log_modulus: torch.Tensor, phase: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``Λ^k`` in complex128 for float64 exponents ``k`` (..., N, len(k)): modulus and phase formed
    in float64, the phase reduced modulo 2π before its cosine and sine."""
    magnitude = torch.exp(log_modulus.double().unsqueeze(-1) * k)  # (..., N, K)
    angle = torch.remainder(phase.double().unsqueeze(-1) * k, _TWO_PI)  # (..., N, K)
    return torch.polar(magnitude, angle)


def lambda_powers(log_modulus: torch.Tensor, phase: torch.Tensor, start: int, length: int) -> torch.Tensor:
    """``Λ^k`` for ``k = start .. start+length-1`` as a complex64 (..., N, length) tensor (see
    :func:`_powers_complex128`); 0 where ``|Λ^k|`` is below :data:`~ssmhub.ops.precision.TINY` (no subnormal floats)."""
    powers = _powers_complex128(log_modulus, phase, start, length).to(torch.complex64)
    return _flush_underflowed(powers, log_modulus, start, length)


def _fine_powers(log_modulus: torch.Tensor, phase: torch.Tensor, length: int) -> torch.Tensor:
    """``Λ^j`` for ``j < min(_FINE_POWERS, length)``, complex128 (..., N, S): shared by all chunks of a call."""
    k = torch.arange(min(_FINE_POWERS, length), device=log_modulus.device, dtype=torch.float64)
    return _exact_powers(log_modulus, phase, k)


def _powers_complex128(
    log_modulus: torch.Tensor, phase: torch.Tensor, start: int, length: int, fine: torch.Tensor | None = None
) -> torch.Tensor:
    """``Λ^k`` for ``k = start .. start+length-1``, complex128 (..., N, length).

    ``log Λ = log_modulus + i·phase``. With ``k = start + b·S + j`` (``j < S``), ``Λ^k`` is the complex128
    product of ``Λ^{start + b·S}`` and ``Λ^j`` (``fine``, from :func:`_fine_powers` when not given), each
    formed exactly by :func:`_exact_powers` (float64 exponent, phase reduced modulo 2π). Every entry so
    keeps float32 accuracy at any k, while exp, cos and sin run over ``N·(S + length/S)`` entries
    instead of ``N·length``.
    """
    fine = _fine_powers(log_modulus, phase, length) if fine is None else fine
    fine_size = fine.shape[-1]
    starts = start + fine_size * torch.arange(-(-length // fine_size), device=fine.device, dtype=torch.float64)
    coarse = _exact_powers(log_modulus, phase, starts)  # (..., N, ⌈length/S⌉)
    powers = coarse.unsqueeze(-1) * fine.unsqueeze(-2)  # (..., N, ⌈length/S⌉, S)
    return powers.flatten(-2)[..., :length]  # (..., N, length)


def _vandermonde_planes(
    log_modulus: torch.Tensor, phase: torch.Tensor, start: int, length: int, fine: torch.Tensor
) -> torch.Tensor:
    """``[Re P; Im P]`` for ``P = Λ^k`` (k from ``start``; (N,) parameters): a float32 (2N, length) matrix,
    so that ``Re(W P)`` and ``Im(W P)`` are each one real matmul, with ``[W_re, −W_im]`` and ``[W_im, W_re]``.
    Entries below :data:`~ssmhub.ops.precision.TINY` are 0: the far taps of a fast-decaying λ would otherwise be
    subnormal floats, which made a DLR training step at L = 4096 several times slower on a CPU."""
    powers = torch.view_as_real(_powers_complex128(log_modulus, phase, start, length, fine))  # (N, C, 2)
    planes = torch.empty(2, powers.shape[0], length, device=powers.device)  # (2, N, C) float32
    planes.copy_(powers.permute(2, 0, 1))  # one strided copy that also casts
    return _flush_underflowed(planes, log_modulus, start, length).flatten(0, 1)  # (2N, C)


def _flush_underflowed(powers: torch.Tensor, log_modulus: torch.Tensor, start: int, length: int) -> torch.Tensor:
    """``Λ^k`` for k = start .. start+length-1, as (..., N, C) complex or (2, N, C) real and imaginary planes, set
    to 0 where ``|Λ^k| = exp(k·log_modulus) < TINY`` (a suffix of each mode's taps; log_modulus (N,)). Without
    autograd in place, on the rows of the modes that reach it (at short lengths few or none); with autograd as a
    product with the mask, so that the kept entries' gradients stay exact (zeroing a value in place would zero its
    derivative too) and the dropped ones' are below TINY·k."""
    first = math.log(TINY) / log_modulus.detach().double().clamp(max=-1e-300)  # (N,) first such k; |Λ| = 1: never
    taps = torch.arange(start, start + length, device=powers.device, dtype=torch.float64)  # (C,)
    if powers.requires_grad:
        return powers * (taps < first[:, None])
    if not host_reads_are_free(powers):
        # every row: picking rows would read the device back (a sync per chunk) or break a traced graph
        return powers.masked_fill_(taps >= first[:, None], 0.0)
    rows = (first < start + length).nonzero().flatten()  # on the CPU a read costs nothing; few rows need it
    if rows.numel():
        powers[..., rows, :] = powers[..., rows, :].masked_fill_(taps >= first[rows, None], 0.0)
    return powers


def _chunks(length: int, state_size: int) -> list[tuple[int, int]]:
    step = max(1, _CHUNK_ELEMENTS // max(1, state_size))
    return [(s, min(step, length - s)) for s in range(0, length, step)]


def _carried_rows(z: torch.Tensor, readout: str) -> torch.Tensor:
    """Rows (..., 2N) that take ``[Re P; Im P]`` to ``readout(z P)`` for complex ``z`` (..., N)."""
    if readout == "real":
        return torch.cat([z.real, -z.imag], dim=-1)
    if readout == "half_imag":
        return 0.5 * torch.cat([z.imag, z.real], dim=-1)
    raise ValueError(f"readout must be one of {READOUTS}; got {readout!r}")


def _readout_weights(w_re: torch.Tensor, w_im: torch.Tensor, product: bool) -> torch.Tensor:
    """Rows that take ``[Re P; Im P]`` to ``Re(W P)`` (H, 2N), and for the product kernel also to ``Im(W P)``."""
    real_rows = torch.cat([w_re, -w_im], dim=-1)  # (H, 2N)
    return torch.cat([real_rows, torch.cat([w_im, w_re], dim=-1)]) if product else real_rows  # (2H, 2N)


def _kernel_chunk(log_modulus, phase, fine, readout_weights, start: int, length: int, product: bool) -> torch.Tensor:
    z = readout_weights @ _vandermonde_planes(log_modulus, phase, start, length, fine)  # (H or 2H, C): Re, Im of W P
    if not product:
        return z
    channels = z.shape[0] // 2
    return z[:channels] * z[channels:]  # Re(W P)·Im(W P)


class _VandermondeKernel(torch.autograd.Function):
    """``K = Re(Z)`` or ``Re(Z)·Im(Z)`` for ``Z = W P``, ``P_nk = exp(k·(a_n + iθ_n))``, built in chunks of k.

    The backward recomputes each chunk of ``P`` and needs only two products with it, where autograd
    through the float64 construction of ``P`` (exp, cos, sin, remainder over N×L) took most of the
    kernel's time. With ``Γ = ∂ℓ/∂Re Z − i·∂ℓ/∂Im Z`` (H×L complex; ``ℓ`` real):

    - ``∂ℓ/∂W_re = Re(Γ Pᵀ)`` and ``∂ℓ/∂W_im = −Im(Γ Pᵀ)``, since ``dℓ = Re Σ Γ_hk dZ_hk``;
    - ``∂ℓ/∂a_n = Re S_n`` and ``∂ℓ/∂θ_n = −Im S_n`` with ``S_n = Σ_h W_hn ((Γ ⊙ k) Pᵀ)_hn``, since
      ``dP_nk = k·P_nk·(da_n + i·dθ_n)``.

    ``Γ = G`` for the plain kernel and ``G·Im Z − i·G·Re Z`` for the product kernel (``G = ∂ℓ/∂K``).
    """

    @staticmethod
    def forward(ctx, log_modulus, phase, w_re, w_im, length: int, product: bool):
        ctx.save_for_backward(log_modulus, phase, w_re, w_im)
        ctx.length, ctx.product = length, product
        weights, fine = _readout_weights(w_re, w_im, product), _fine_powers(log_modulus, phase, length)
        chunks = _chunks(length, log_modulus.shape[-1])
        return torch.cat([_kernel_chunk(log_modulus, phase, fine, weights, s, c, product) for s, c in chunks], dim=-1)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        log_modulus, phase, w_re, w_im = ctx.saved_tensors
        grad = grad.float()
        num_modes, channels = log_modulus.shape[-1], w_re.shape[0]
        m = torch.zeros(channels, 2 * num_modes, device=grad.device)  # [Re | Im] of Γ Pᵀ, (H, 2N)
        mk = torch.zeros_like(m)  # [Re | Im] of (Γ ⊙ k) Pᵀ
        weights = _readout_weights(w_re, w_im, ctx.product) if ctx.product else None
        fine = _fine_powers(log_modulus, phase, ctx.length)
        for start, size in _chunks(ctx.length, num_modes):
            stacked = _vandermonde_planes(log_modulus, phase, start, size, fine)  # (2N, C): [P_re; P_im]
            g = grad[:, start : start + size]  # (H, C)
            taps = torch.arange(start, start + size, device=grad.device, dtype=torch.float32)  # k
            if ctx.product:
                z = weights @ stacked  # (2H, C)
                z_re, z_im = z[:channels], z[channels:]
                gamma_re, gamma_im = g * z_im, -(g * z_re)
                rows = torch.cat([gamma_re, gamma_re * taps, gamma_im, gamma_im * taps])  # (4H, C)
            else:
                rows = torch.cat([g, g * taps])  # (2H, C): Γ = G is real
            products = rows @ stacked.mT  # (2H or 4H, 2N): rows times [P_re; P_im]ᵀ
            re_part, im_part = products[:, :num_modes], products[:, num_modes:]  # X P_reᵀ, X P_imᵀ
            if ctx.product:  # (Γ_re + iΓ_im)(P_re + iP_im)ᵀ, for Γ and Γ ⊙ k
                real = re_part[: 2 * channels] - im_part[2 * channels :]
                imag = im_part[: 2 * channels] + re_part[2 * channels :]
            else:
                real, imag = re_part, im_part
            m += torch.cat([real[:channels], imag[:channels]], dim=-1)
            mk += torch.cat([real[channels:], imag[channels:]], dim=-1)
        m_re, m_im = m[:, :num_modes], m[:, num_modes:]
        mk_re, mk_im = mk[:, :num_modes], mk[:, num_modes:]
        s_re = (w_re * mk_re - w_im * mk_im).sum(0)  # Re Σ_h W_hn ((Γ⊙k) Pᵀ)_hn, (N,)
        s_im = (w_re * mk_im + w_im * mk_re).sum(0)
        return s_re, -s_im, m_re, -m_im, None, None


@float32_math
def dlr_kernel(
    log_lambda_re: torch.Tensor,
    log_lambda_im: torch.Tensor,
    weight: torch.Tensor,
    length: int,
    kernel_type: str = "real",
) -> torch.Tensor:
    """DLR kernel ``K_h = Re(W_h P)`` (or ``Re·Im`` for ``kernel_type="prod"``), seed paper §2.3, Figure 4.

    Args:
        log_lambda_re, log_lambda_im: (N,) parameters; ``Λ = exp(-(logΛ_re)² + i·logΛ_im)``.
        weight: (H, N, 2) real and imaginary parts of ``W ∈ C^{H×N}``.
        length: number of taps L.
        kernel_type: ``"real"`` (DLR) or ``"prod"`` (DLR-prod).

    Returns:
        (H, L) float32 kernel. Memory is bounded by chunking over L; the backward pass recomputes each
        chunk (:class:`_VandermondeKernel`).
    """
    if kernel_type not in ("real", "prod"):
        raise ValueError(f"kernel_type must be 'real' or 'prod'; got {kernel_type!r}")
    if length < 1:
        raise ValueError(f"length must be positive; got {length}")
    log_modulus = -(log_lambda_re.float() ** 2)
    w_re, w_im = weight[..., 0].float(), weight[..., 1].float()
    return _VandermondeKernel.apply(log_modulus, log_lambda_im.float(), w_re, w_im, length, kernel_type == "prod")


def dlr_kernel_ref(
    log_lambda_re: torch.Tensor,
    log_lambda_im: torch.Tensor,
    weight: torch.Tensor,
    length: int,
    kernel_type: str = "real",
) -> torch.Tensor:
    """Reference for :func:`dlr_kernel`: ``Λ^k`` by repeated multiplication in complex128."""
    lam = torch.polar(torch.exp(-(log_lambda_re.double() ** 2)), log_lambda_im.double())  # (N,)
    w = torch.complex(weight[..., 0].double(), weight[..., 1].double())  # (H, N)
    power = torch.ones_like(lam)
    taps = []
    for _ in range(length):
        taps.append(w @ power)  # (H,)
        power = power * lam
    kernel = torch.stack(taps, dim=-1)  # (H, L) complex
    out = kernel.real * kernel.imag if kernel_type == "prod" else kernel.real
    return out.float()


def kronecker_dlr(
    log_modulus: torch.Tensor, phase: torch.Tensor, w: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Parameters of the DLR ``(Λ⊗Λ, w⊗w)`` with N² states (seed paper §A.2).

    Its kernel is ``K_k²`` for the kernel ``K_k = <w, Λ^k>``; with the ``"half_imag"`` readout that
    is ``½·Im(K_k²) = Re(K_k)·Im(K_k)``, the DLR-prod kernel.

    Args: log_modulus, phase: (N,); w: (H, N, 2) real and imaginary parts.  Returns: (N²,), (N², ), (H, N², 2).
    """
    n = log_modulus.shape[-1]
    kron_modulus = (log_modulus[:, None] + log_modulus[None, :]).reshape(n * n)  # (N²,)
    kron_phase = (phase[:, None] + phase[None, :]).reshape(n * n)  # (N²,)
    re, im = w.unbind(-1)  # (H, N) each; real arithmetic, so a traced step compiles and exports to ONNX
    kron_re = re[:, :, None] * re[:, None, :] - im[:, :, None] * im[:, None, :]  # (H, N, N)
    kron_im = re[:, :, None] * im[:, None, :] + im[:, :, None] * re[:, None, :]
    kron_w = torch.stack([kron_re, kron_im], dim=-1).reshape(w.shape[0], n * n, 2)  # (H, N², 2)
    return kron_modulus, kron_phase, kron_w


@float32_math
def dlr_scan(
    u: torch.Tensor,
    log_modulus: torch.Tensor,
    phase: torch.Tensor,
    w: torch.Tensor,
    kernel: torch.Tensor | None = None,
    readout: str = "real",
    initial_state: torch.Tensor | None = None,
    return_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run the DLR of Eq. 1 over a whole sequence in parallel form (FFT convolution, Eq. 4).

    Args:
        u: (B, H, L) real input.
        log_modulus, phase: (N,) with ``log Λ = log_modulus + i·phase``.
        w: (H, N, 2) output weights, real and imaginary parts.
        kernel: optional precomputed (H, L') kernel (e.g. the cheap DLR-prod formula); computed
            from ``(Λ, w)`` when omitted.
        readout: ``"real"`` or ``"half_imag"``.
        initial_state: optional (B, H, 2, N) state ``x_{-1}`` carried over from earlier tokens (planes, see above).
        return_final_state: also return ``x_{L-1}``.

    Returns:
        ``y`` (B, H, L) float32 and the final state (B, H, 2, N) float32, or ``None``.
    """
    seq_len = u.shape[-1]
    u = u.float()
    w = _complex_weights(w)  # (H, N) complex
    carried_in = None if initial_state is None else dlr_state_complex(initial_state)  # (B, H, N) complex
    chunks = _chunks(seq_len, log_modulus.shape[-1])  # Vandermonde blocks of bounded size
    if kernel is None:
        kernel = torch.cat(
            [_readout(w @ lambda_powers(log_modulus, phase, start, size), readout) for start, size in chunks], dim=-1
        )  # (H, L)
    y = fft_conv(u, kernel)  # (B, H, L)
    fine = _fine_powers(log_modulus, phase, seq_len + 1) if initial_state is not None or return_final_state else None
    if carried_in is not None:
        # y_k += readout(Σ_n w_hn Λ_n^{k+1} x_{-1,n}), from unrolling Eq. 1 back to x_{-1}: one real matmul per
        # block, the readout's rows of w ⊙ x_{-1} (B, H, 2N) times [Re P; Im P] (2N, C)
        rows = _carried_rows(w * carried_in, readout)
        carried = [rows @ _vandermonde_planes(log_modulus, phase, start + 1, size, fine) for start, size in chunks]
        y = y + torch.cat(carried, dim=-1)  # (B, H, L)
    final_state = None
    if return_final_state:
        # x_{L-1} = Λ^L x_{-1} + Σ_j Λ^{L-1-j} u_j  (Eq. 3), summed over blocks of j: one real GEMM per block,
        # [Re; Im] of its powers (2N, C) times the block's u as (B, C, H) (the layout a mixer's (B, L, H) input has)
        num_modes = log_modulus.shape[-1]
        summed = 0
        for start, size in chunks:
            planes = _vandermonde_planes(log_modulus, phase, seq_len - start - size, size, fine).flip(-1)  # Λ^{L-1-j}
            summed = summed + planes @ u[..., start : start + size].mT  # (B, 2N, H)
        final_state = summed.unflatten(1, (2, num_modes)).permute(0, 3, 1, 2).contiguous()  # (B, H, 2, N)
        if initial_state is not None:
            decayed = lambda_powers(log_modulus, phase, seq_len, 1)[..., 0] * carried_in  # Λ^L x_{-1}, (B, H, N)
            final_state = final_state + dlr_state_planes(decayed)
    return y, final_state


def dlr_step_coefficients(log_modulus: torch.Tensor, phase: torch.Tensor, w: torch.Tensor) -> dict[str, torch.Tensor]:
    """What every step of Eq. 1 reads that the parameters alone fix, as contiguous float32 planes: ``lambda_re``,
    ``lambda_im`` (N,), Λ formed in float64 and then rounded (:func:`~ssmhub.ops.diagonal_step.polar_parts`), and
    ``w_re``, ``w_im`` (H, N). Formed once for many steps (a serving engine's decode rows), they keep a compiled step
    from recomputing Λ's float64 exp/cos/sin for every row and channel it fuses them into."""
    lam_re, lam_im = polar_parts(log_modulus, phase)
    w = w.float()
    return {"lambda_re": lam_re, "lambda_im": lam_im, "w_re": w[..., 0].contiguous(), "w_im": w[..., 1].contiguous()}


@float32_math
def dlr_step(
    u_t: torch.Tensor,
    state: torch.Tensor,
    log_modulus: torch.Tensor,
    phase: torch.Tensor,
    w: torch.Tensor,
    readout: str = "real",
) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of Eq. 1: ``x_k = Λ x_{k-1} + u_k``, ``y_k = readout(<w, x_k>)``. O(H·N), independent of k.

    Args: u_t (B, H) real; state (B, H, 2, N) float32 planes; w (H, N, 2).  Returns: y_t (B, H) float32, new state
    (B, H, 2, N). Real arithmetic throughout (:func:`~ssmhub.ops.diagonal_step.diagonal_step_planes`), so the step
    compiles into fused kernels and exports to ONNX.
    """
    return dlr_step_with(u_t, state, dlr_step_coefficients(log_modulus, phase, w), readout)


@float32_math
def dlr_step_with(
    u_t: torch.Tensor, state: torch.Tensor, coefficients: dict[str, torch.Tensor], readout: str = "real"
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`dlr_step` from its :func:`dlr_step_coefficients` (the same numbers: the same operations)."""
    if readout not in READOUTS:
        raise ValueError(f"readout must be one of {READOUTS}; got {readout!r}")
    x_re, x_im = state.float().unbind(-2)  # (B, H, N) each
    lam = (coefficients["lambda_re"], coefficients["lambda_im"])
    weights = (coefficients["w_re"], coefficients["w_im"])
    z_re, z_im, new_re, new_im = diagonal_step_planes(x_re, x_im, lam, u_t, weights, imag=readout != "real")
    return (z_re if readout == "real" else 0.5 * z_im), torch.stack([new_re, new_im], dim=-2)  # (B, H), (B, H, 2, N)


@float32_math
def dlr_scan_recurrent(
    u: torch.Tensor,
    log_modulus: torch.Tensor,
    phase: torch.Tensor,
    w: torch.Tensor,
    readout: str = "real",
    initial_state: torch.Tensor | None = None,
    return_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`dlr_scan` by the recurrence of Eq. 1, :func:`dlr_step` token by token: O(L·H·N) with no kernel, FFT or
    Vandermonde matrix, so for a few tokens after a state (a verification forward of assisted decoding, a rollback
    replay) it costs a few decode steps instead of a parallel pass's fixed cost. Same arguments and returns."""
    batch, channels, seq_len = u.shape
    state = initial_state
    if state is None:
        state = torch.zeros(batch, channels, 2, w.shape[-2], device=u.device)  # (B, H, 2, N)
    outputs = []
    for k in range(seq_len):
        y_k, state = dlr_step(u[..., k], state, log_modulus, phase, w, readout)  # (B, H), (B, H, N)
        outputs.append(y_k)
    y = torch.stack(outputs, dim=-1) if outputs else u.new_zeros(batch, channels, 0, dtype=torch.float32)
    return y, (state if return_final_state else None)


def dlr_scan_ref(
    u: torch.Tensor,
    log_modulus: torch.Tensor,
    phase: torch.Tensor,
    w: torch.Tensor,
    readout: str = "real",
    initial_state: torch.Tensor | None = None,
    return_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Reference for :func:`dlr_scan`: the recurrence of Eq. 1, one token at a time, in complex128 (same arguments
    and layouts)."""
    lam = torch.polar(torch.exp(log_modulus.double()), phase.double())  # (N,)
    w = torch.complex(w[..., 0].double(), w[..., 1].double())  # (H, N)
    batch, channels, seq_len = u.shape
    state = torch.zeros(batch, channels, lam.shape[-1], dtype=torch.complex128, device=u.device)
    if initial_state is not None:
        state = state + torch.complex(initial_state[..., 0, :].double(), initial_state[..., 1, :].double())
    outputs = []
    for k in range(seq_len):
        state = lam * state + u[..., k].double().unsqueeze(-1)
        outputs.append(_readout((state * w).sum(-1), readout))
    y = torch.stack(outputs, dim=-1).float()
    return y, (dlr_state_planes(state) if return_final_state else None)


def dlr_init(
    state_size: int,
    num_channels: int,
    dt_min: float,
    dt_max: float,
    num_lambdas: int = 1,
    weight_std: float | None = None,
    generator: torch.Generator | None = None,
) -> dict[str, torch.Tensor]:
    """Initial DLR parameters, seed paper §2.3.

    - ``logΛ_im[n] = 2πn/N``: at ``logΛ_re = 0`` and L = N the kernel is the DFT of w.
    - ``logΛ_re = (e^r / 2)^{1/2}``, ``r ~ U(log dt_min, log dt_max)``, so ``|λ| = exp(-e^r/2)``
      (the paper's range (.0005, .5) gives |λ| ∈ [0.779, 0.99975]).
    - ``Re W, Im W ~ N(0, σ²)`` with ``σ = 1/N`` by default.

    Returns ``log_lambda_re`` and ``log_lambda_im`` of shape (num_lambdas, N) and ``weight`` of
    shape (num_channels, N, 2).
    """
    r = torch.empty(num_lambdas, state_size).uniform_(math.log(dt_min), math.log(dt_max), generator=generator)
    log_lambda_re = torch.sqrt(torch.exp(r) / 2)
    log_lambda_im = (_TWO_PI * torch.arange(state_size, dtype=torch.float64) / state_size).float()
    log_lambda_im = log_lambda_im.expand(num_lambdas, state_size).clone()
    std = 1.0 / state_size if weight_std is None else weight_std
    weight = torch.randn(num_channels, state_size, 2, generator=generator) * std
    return {"log_lambda_re": log_lambda_re, "log_lambda_im": log_lambda_im, "weight": weight}
