"""The H3 layer with long convolutions (long-conv paper §4.1.3-4; H3 code ``src/models/ssm/h3.py``).

On an input ``u ∈ R^{B×L×d}``, with ``H = num_heads`` heads of size ``d_h = d / H``:

1. ``q, k, v = Linear_{d→3d}(u)`` (one fused map with bias; the H3 code uses three d→d Linears);
2. shift convolution on k: ``k̃ = K_shift ∗ k + D_shift ⊙ k``, depthwise and causal over ``shift_kernel_size``
   taps (:class:`~ssmhub.layers.longconv.LongConvKernel` with ``kernel_init="conv"``, no regularization;
   up to 16 taps computed directly as shifted multiply-adds, longer ones by FFT);
3. per head and position, ``kv_t = k̃_t v_tᵀ ∈ R^{d_h×d_h}`` (``d_h = 1``: ``k̃ ⊙ v``);
4. the regularized long convolution in place of H3's diagonal SSM, one learned kernel per head shared by
   the ``d_h²`` entries of kv: ``s = K ∗ kv + D ⊙ kv`` (:func:`ssmhub.ops.longconv.causal_conv`, the FFT
   convolution of :mod:`ssmhub.ops.fftconv`, float32);
5. ``o_t = q_tᵀ s_t`` per head (sum over the head dimension), concatenated as channel ``h·d_h + j``;
6. ``y = Linear_{d→d}(o)``. No nonlinearity inside the layer.

What this implements vs the code:
- H3's shift SSM is an N = 64 tap FIR (``SSKernelShift``: B = e₁, C ~ Conv1d init, plus ``D_shift ~ randn``);
  safari's ``H3Conv`` replaces it by a full-length regularized long conv. Here it is a
  ``shift_kernel_size``-tap causal depthwise FIR (default 4, as in Mamba-style short convs) with the H3
  init; ``shift_kernel_size=64`` is H3's shift SSM exactly, and ``shift_kernel_size=max_kernel_length``
  with ``regularize_shift_kernel=True`` is ``H3Conv``. The tap 0 and ``D_shift`` are redundant (as in H3).
- The output channel order is ``(head, j)``; the H3 code concatenates ``(j, head)`` (a fixed permutation
  absorbed by the output Linear).
- The H3 code has no masking; here padding is zeroed (see below).

Decoding is exact: :meth:`H3Mixer.step` keeps the last ``shift_kernel_size − 1`` k inputs and the last
``max_kernel_length − 1`` kv inputs in fixed-shape windows (taps reach back L_max − 1 positions; an input
further back meets a zero tap), so each token costs O(d·d_h·L_max), and a forward pass handed a state
continues from it (prefill). An explicit length-L kernel has no smaller exact state (the long-conv paper
gives no recurrent mode; its Prop. 2, App. D.2, needs state L); :meth:`H3Mixer.kernel` exposes the effective
kernel so that a distilled (modal SSM) decode can be fitted to it later.

Padding: masked positions are zeroed in the input and again in k and v after the biased projection,
so they contribute nothing to either convolution; zeros at the front of a causal convolution add
nothing wherever they sit, so a left-padded row gives the same outputs as the row alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..ops.longconv import causal_conv, causal_conv_step
from ..ops.modal import (
    ModalKernel,
    fit_modal_kernels,
    hankel_singular_values,
    max_modes,
    modal_kernel,
    modal_scan,
    modal_step,
)
from ..ops.short_conv import causal_depthwise_conv, conv_window
from .diagonal_ssm import DiagonalSSMKernel
from .h3_options import H3Options
from .longconv import LongConvKernel
from .longconv_options import LongConvOptions
from .mixer import TokenMixer

__all__ = ["DistillationReport", "H3Mixer", "H3Options"]
# Longest unregularized shift kernel run as a direct FIR (H3Mixer._shift): up to this many taps, shifted
# multiply-adds cost less than an FFT convolution of the whole sequence.
DIRECT_SHIFT_MAX_TAPS = 16


def _shift_kernel_options(options: H3Options) -> LongConvOptions:
    """The shift kernel's options: the long kernel's with ``regularize_shift_kernel`` (safari's ``H3Conv``), else
    H3's shift SSM, a Conv1d init without regularization, on the same FFT backend."""
    if options.regularize_shift_kernel:
        return LongConvOptions.take(options)
    return LongConvOptions(
        kernel_init="conv",
        geometric_convention=options.geometric_convention,
        fft_backend=options.fft_backend,
        butterfly_block_size=options.butterfly_block_size,
    )


class ModalForm(nn.Module):
    """Buffers of a long kernel's modal fit (:class:`~ssmhub.ops.modal.ModalKernel`): poles
    ``exp(log_modulus + i·phase)``, residues, direct term and the fit's relative error, per head; and, per head,
    how many of the ``num_modes`` slots its fit uses (``head_modes``, the rest are zero-residue padding) and
    whether the head is left on exact decoding (``exact_heads``: its fit missed the tolerance)."""

    def __init__(self, num_heads: int, num_modes: int, device=None):
        super().__init__()
        for name, shape in (
            ("log_modulus", (num_heads, num_modes)),
            ("phase", (num_heads, num_modes)),
            ("residues", (num_heads, num_modes, 2)),
            ("direct", (num_heads,)),
            ("relative_error", (num_heads,)),
        ):
            self.register_buffer(name, torch.zeros(shape, dtype=torch.float32, device=device))
        self.register_buffer("head_modes", torch.full((num_heads,), num_modes, dtype=torch.long, device=device))
        self.register_buffer("exact_heads", torch.zeros(num_heads, dtype=torch.bool, device=device))


@dataclass
class DistillationReport:
    """What :meth:`H3Mixer.distill` did to one layer (per head tensors are (H,) on the CPU).

    Attributes:
        orders: modes kept per head (0 for a head left exact).
        errors: relative L2 error of the kernel each head now computes with (0 for an exact head).
        fit_errors: the smallest error any order within the budget reached (what made a head exact).
        exact_heads: indices of the heads left on exact decoding.
        state_bytes: decode state of this layer's long convolution per sequence (modal + windows).
        exact_state_bytes: the same for the undistilled layer (a window of L_max − 1 inputs per channel).
    """

    orders: torch.Tensor
    errors: torch.Tensor
    fit_errors: torch.Tensor
    exact_heads: list[int]
    state_bytes: int
    exact_state_bytes: int


class H3Mixer(TokenMixer):
    """H3 token mixer with a learned long convolution (:class:`~ssmhub.layers.mixer.TokenMixer`).

    Args:
        hidden_size: d.
        options: an :class:`H3Options` (or an ``H3Config``, which is one); ``**values`` override single fields.
        bias: biases of the input and output Linears.
    """

    def __init__(self, hidden_size: int, options: H3Options | None = None, *, bias: bool = True, **values):
        super().__init__()
        options = H3Options.take(options, **values)
        options.check_options(hidden_size)
        num_heads = options.ssm_num_heads or hidden_size
        self.hidden_size, self.num_heads, self.head_dim = hidden_size, num_heads, hidden_size // num_heads
        self.max_kernel_length, self.shift_kernel_size = options.max_kernel_length, options.shift_kernel_size
        self.kernel_type = options.kernel_type
        self.in_proj = nn.Linear(hidden_size, 3 * hidden_size, bias=bias)  # q, k, v
        # a short kernel without regularization runs as a direct FIR, see _shift
        self.direct_shift = self.shift_kernel_size <= DIRECT_SHIFT_MAX_TAPS and not options.regularize_shift_kernel
        self.shift_conv = LongConvKernel(hidden_size, self.shift_kernel_size, _shift_kernel_options(options))
        if self.kernel_type == "diagonal_ssm":
            self.long_conv = DiagonalSSMKernel(num_heads, options.ssm_state_size)
        else:
            self.long_conv = LongConvKernel(num_heads, self.max_kernel_length, options)
        self.out_proj = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.decode_num_modes = None
        if options.decode_num_modes is not None:
            self._register_modal_buffers(options.decode_num_modes)

    # ----------------------------------------------------------------------------- distilled (modal) mode
    def _register_modal_buffers(self, num_modes: int) -> None:
        """Hold the fitted modal form in a submodule named ``ssm`` (kept float32 on a half-precision load)."""
        self.decode_num_modes = num_modes
        self.ssm = ModalForm(self.num_heads, num_modes, device=self.out_proj.weight.device)  # beside the weights

    @property
    def distilled(self) -> bool:
        """True once the long convolution is replaced by its modal (diagonal SSM) fit."""
        return self.decode_num_modes is not None

    @property
    def modal_state(self) -> bool:
        """True when the layer decodes with an O(N) modal state: distilled, or a diagonal SSM."""
        return self.distilled or self.kernel_type == "diagonal_ssm"

    @property
    def num_state_modes(self) -> int | None:
        """N of the modal state (None when the layer decodes exactly with a window of L_max − 1 inputs); for a
        distilled layer the most modes any of its distilled heads uses (0 when every head was left exact)."""
        if self.kernel_type == "diagonal_ssm":
            return self.long_conv.state_size
        if not self.distilled:
            return None
        modes = self.ssm.head_modes[~self.ssm.exact_heads]
        return int(modes.max()) if modes.numel() else 0

    def _modal_groups(self) -> list[tuple[str, int, torch.Tensor]]:
        """``(state name, order, head indices)`` per order used by a distilled layer's modal heads, ascending.

        Heads of one order share one modal state of exactly that width, so no head's state is padded to the
        largest order of the layer. A layer whose modal heads all use one order names its state ``kv_state``
        (a fully distilled layer); with several orders the states are ``kv_state_{order}``.
        """
        modal, _ = self._head_split()
        modes = self.ssm.head_modes[modal]
        orders = modes.unique().tolist()  # sorted
        return [
            ("kv_state" if len(orders) == 1 else f"kv_state_{order}", order, modal[modes == order]) for order in orders
        ]

    def _head_split(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(modal head indices, exact head indices) of a distilled layer; a diagonal SSM is all modal."""
        if self.distilled:
            exact = self.ssm.exact_heads
        else:
            exact = torch.zeros(self.num_heads, dtype=torch.bool, device=self.out_proj.weight.device)
        return (~exact).nonzero().flatten(), exact.nonzero().flatten()

    def modal_form(self, heads: torch.Tensor | None = None, modes: int | None = None) -> ModalKernel:
        """The modal form of the long kernel: the diagonal SSM's own, or the distilled fit (see
        :func:`ssmhub.ops.modal.fit_modal_kernel`); with ``heads``, those heads' fits cut to their first ``modes``
        modes (default: the most any distilled head uses)."""
        if self.kernel_type == "diagonal_ssm":
            return self.long_conv.modal()
        if not self.distilled:
            raise ValueError("this H3 layer is not distilled: call distill(num_modes) first")
        m = self.ssm
        form = ModalKernel(m.log_modulus, m.phase, m.residues, m.direct, m.relative_error)
        if heads is None:
            return form
        modes = self.num_state_modes if modes is None else modes
        return ModalKernel(
            *(
                getattr(form, f)[heads][:, :modes] if getattr(form, f).dim() > 1 else getattr(form, f)[heads]
                for f in form.__dataclass_fields__
            )
        )

    def hankel_singular_values(self) -> torch.Tensor:
        """The Hankel singular values (H, L_max − 1) of each head's learned kernel, descending
        (:func:`ssmhub.ops.modal.hankel_singular_values`): how many modes a head needs before distilling it."""
        if self.kernel_type == "diagonal_ssm":
            raise ValueError("a diagonal-SSM H3 layer has no long convolution: it is already modal")
        return hankel_singular_values(self.long_conv(self.max_kernel_length).detach().float().cpu())

    @torch.no_grad()
    def distill(self, num_modes: int, tolerance: float | None = None, method: str = "best") -> DistillationReport:
        """Fit each head's learned long kernel (all L_max taps) in modal form and switch the layer to it.

        Without ``tolerance`` every head gets ``num_modes`` modes. With a ``tolerance`` (relative L2 kernel
        error, ``0 < tol < 1``) each head gets the smallest order among ``1, 2, 4, …, num_modes`` whose fit
        meets it, and a head whose best fit within the budget misses it stays exact: it decodes with its window
        of L_max − 1 inputs while the others decode with an O(N) modal state (LaughingHyena, arXiv 2310.18780
        §3.2, picks the order per filter). The layer then computes with these kernels everywhere (training
        forward, prefill and step agree). Beyond L_max a modal kernel keeps decaying while the learned one is
        zero (the fit only sees taps 0..L_max-1). ``method``: see :func:`ssmhub.ops.modal.fit_modal_kernel`.
        """
        self._check_distill_request(num_modes, tolerance, method)
        learned = self.long_conv(self.max_kernel_length).detach().float().cpu()  # (H, L_max), regularized
        orders = (
            [num_modes] if tolerance is None else sorted({1 << k for k in range(num_modes.bit_length())} | {num_modes})
        )
        orders = [n for n in orders if n <= num_modes]
        fits = fit_modal_kernels(learned, orders, method)
        errors = torch.stack([f.relative_error for f in fits])  # (orders, H)
        meets = errors <= (tolerance if tolerance is not None else float("inf"))
        choice = torch.where(meets.any(0), meets.to(torch.int8).argmax(0), len(orders) - 1)  # (H,): first order met
        exact = ~meets.any(0)
        self._store_fits(fits, orders, choice, exact, num_modes)
        chosen = torch.tensor(orders, device=choice.device)[choice]
        return DistillationReport(
            orders=torch.where(exact, 0, chosen),
            errors=torch.where(exact, 0.0, errors.gather(0, choice[None])[0]),
            fit_errors=errors.min(0).values,
            exact_heads=exact.nonzero().flatten().tolist(),
            state_bytes=self.kv_state_bytes(),
            exact_state_bytes=4 * self.head_dim**2 * self.num_heads * (self.max_kernel_length - 1),
        )

    def _check_distill_request(self, num_modes, tolerance, method) -> None:
        """Bad requests fail here, before any fitting."""
        if self.kernel_type == "diagonal_ssm":
            raise ValueError("a diagonal-SSM H3 layer has no long convolution to distill: it is already modal")
        if isinstance(num_modes, bool) or not isinstance(num_modes, int) or num_modes < 1:
            raise ValueError(f"num_modes must be an integer >= 1; got {num_modes!r}")
        limit = max_modes(self.max_kernel_length, method=method)  # also checks method
        if num_modes > limit:
            raise ValueError(f"num_modes={num_modes} is too large for L_max {self.max_kernel_length}: at most {limit}")
        if tolerance is not None and (
            isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not 0 < tolerance < 1
        ):
            raise ValueError(f"tolerance must be a relative L2 error in (0, 1) or None; got {tolerance!r}")

    def _store_fits(self, fits, orders, choice, exact, num_modes) -> None:
        """Copy head h's fit at order ``orders[choice[h]]`` into the first slots of the (H, num_modes) buffers."""
        if not self.distilled or self.decode_num_modes != num_modes:
            self._register_modal_buffers(num_modes)
        self.ssm.to(self.long_conv.skip.device)
        for name in ("log_modulus", "phase", "residues"):
            getattr(self.ssm, name).zero_()
        self.ssm.log_modulus.fill_(-0.6931471805599453)  # padding: a harmless pole 0.5 with zero residue
        for i, (fit, order) in enumerate(zip(fits, orders)):
            heads = (choice == i).nonzero().flatten()
            for name, value in (("log_modulus", fit.log_modulus), ("phase", fit.phase), ("residues", fit.residues)):
                getattr(self.ssm, name)[heads.to(self.ssm.phase.device), :order] = value[heads].to(
                    self.ssm.phase.device
                )
            for name, value in (("direct", fit.d), ("relative_error", fit.relative_error)):
                getattr(self.ssm, name)[heads.to(self.ssm.phase.device)] = value[heads].to(self.ssm.phase.device)
        self.ssm.head_modes.copy_(torch.tensor(orders, device=choice.device)[choice].masked_fill(exact, 0))
        self.ssm.exact_heads.copy_(exact)

    def kv_state_bytes(self) -> int:
        """Bytes of the long convolution's decode state per sequence (complex64 modes, float32 windows)."""
        layout = self.state_layout(1)
        return sum(
            torch.Size(shape).numel() * dtype.itemsize
            for name, (shape, dtype) in layout.items()
            if name != "shift_state"
        )

    def _modal_conv(
        self, kv: torch.Tensor, initial_state: torch.Tensor | None, return_state: bool, heads=None, modes=None
    ):
        """Modal long conv of kv (B, d_h, d_h, H', L) + D·kv over ``heads`` (default all), each with its first
        ``modes`` modes (see :meth:`modal_form`).

        State: (B, d_h, d_h, H', N) complex64."""
        batch, dh, _, count, length = kv.shape
        u = kv.reshape(batch * dh * dh, count, length)  # (B·d_h², H', L)
        state = None if initial_state is None else initial_state.reshape(batch * dh * dh, count, -1)
        form = self.modal_form(heads, modes)
        y, final = modal_scan(u, form, initial_state=state, return_final_state=return_state)
        skip = self.long_conv.skip.float() if heads is None else self.long_conv.skip.float()[heads]
        y = y.reshape(kv.shape) + skip[:, None] * kv
        return y, None if final is None else final.reshape(batch, dh, dh, count, -1)

    def _modal_conv_step(self, kv_t: torch.Tensor, state: torch.Tensor, heads=None, modes=None):
        """One token of :meth:`_modal_conv`: kv_t (B, d_h, d_h, H') -> (y_t, new state)."""
        batch, dh, _, count = kv_t.shape
        form = self.modal_form(heads, modes)
        y, new_state = modal_step(kv_t.reshape(-1, count), state.reshape(batch * dh * dh, count, -1), form)
        skip = self.long_conv.skip.float() if heads is None else self.long_conv.skip.float()[heads]
        y = y.reshape(kv_t.shape) + skip * kv_t
        return y, new_state.reshape(batch, dh, dh, count, -1)

    def _distilled_conv(self, kv: torch.Tensor, state, return_state: bool):
        """Long conv of a distilled layer, kv (B, d_h, d_h, H, L): modal heads by the modal state of their order
        (:meth:`_modal_groups`), heads left exact by their learned kernel and window of L_max − 1 inputs
        (``kv_window``). One token (kv (B, d_h, d_h, H)) is a step of each. Returns
        ``(s like kv, {state name: final or None})``."""
        _, exact = self._head_split()
        one = kv.dim() == 4
        s, parts = torch.empty_like(kv, dtype=torch.float32), {}
        for name, order, heads in self._modal_groups():
            previous = None if state is None else state[name]
            if one:
                s[..., heads], parts[name] = self._modal_conv_step(kv[..., heads], previous, heads, order)
            else:
                s[..., heads, :], parts[name] = self._modal_conv(
                    kv[..., heads, :], previous, return_state, heads, order
                )
        if exact.numel():
            kernel, skip = self.long_conv(self.max_kernel_length)[exact], self.long_conv.skip[exact]
            previous = None if state is None else state["kv_window"]
            if one:
                s[..., exact], parts["kv_window"] = causal_conv_step(kv[..., exact], previous, kernel, skip)
            else:
                s[..., exact, :], parts["kv_window"] = causal_conv(
                    kv[..., exact, :],
                    kernel,
                    skip,
                    initial_state=previous,
                    return_final_state=return_state,
                    state_length=self.max_kernel_length - 1,
                    backend=self.long_conv.fft_backend,
                    block_size=self.long_conv.butterfly_block_size,
                )
        return s, parts

    # ----------------------------------------------------------------------------- kernels
    def kernel(self, length: int) -> torch.Tensor:
        """The effective (num_heads, length) float32 long-conv kernel (regularized; zero beyond L_max).

        Together with ``self.long_conv.skip`` (D) this is the whole long convolution: the hook for a
        distilled decode that fits it with a modal (diagonal SSM) form. A distilled layer's heads left exact
        keep their learned kernel.
        """
        if self.kernel_type == "diagonal_ssm":
            return modal_kernel(self.modal_form(), length)
        if not self.distilled:
            return self.long_conv(length)
        modal, exact = self._head_split()
        device = self.ssm.phase.device
        kernel = (
            self.long_conv(length).to(device).clone()
            if exact.numel()
            else torch.empty(self.num_heads, length, device=device)
        )
        if modal.numel():
            kernel[modal] = modal_kernel(self.modal_form(modal), length)
        return kernel

    def shift_kernel(self, length: int | None = None) -> torch.Tensor:
        """The effective (hidden_size, length) float32 shift kernel (default: its own length)."""
        return self.shift_conv(self.shift_kernel_size if length is None else length)

    # ----------------------------------------------------------------------------- state
    def state_layout(self, batch_size: int, dtype=None):
        """Windows of past inputs, float32 whatever the model dtype (the convolutions run in float32).

        ``shift_state``: (B, d, shift_kernel_size − 1), the last k inputs, oldest first; ``kv_state``:
        (B, d_h, d_h, H, max_kernel_length − 1), the last kv inputs, oldest first, or, for a modal layer,
        the complex64 modal state (B, d_h, d_h, H, N), independent of the context. A distilled layer holds, per
        order n its modal heads use, a state (B, d_h, d_h, H_n, n) for the H_n heads of that order (named by
        :meth:`_modal_groups`: ``kv_state`` when there is one order), and ``kv_window``
        (B, d_h, d_h, H_exact, max_kernel_length − 1) for the heads left exact (when it has such heads).
        """
        dh, window = self.head_dim, self.max_kernel_length - 1
        layout = {"shift_state": ((batch_size, self.hidden_size, self.shift_kernel_size - 1), torch.float32)}
        if self.kernel_type == "diagonal_ssm":
            layout["kv_state"] = ((batch_size, dh, dh, self.num_heads, self.num_state_modes), torch.complex64)
        elif not self.distilled:
            layout["kv_state"] = ((batch_size, dh, dh, self.num_heads, window), torch.float32)
        else:
            _, exact = self._head_split()
            for name, order, heads in self._modal_groups():
                layout[name] = ((batch_size, dh, dh, heads.numel(), order), torch.complex64)
            if exact.numel():
                layout["kv_window"] = ((batch_size, dh, dh, exact.numel(), window), torch.float32)
        return layout

    # ----------------------------------------------------------------------------- heads
    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        """(B, d, ...) channel-first -> (B, d_h, H, ...): channel c = h·d_h + i goes to [i, h]."""
        b, _, *rest = t.shape
        return t.reshape(b, self.num_heads, self.head_dim, *rest).transpose(1, 2)

    def _mix(self, q, k_shift, v, conv):
        """Steps 3-5 on channel-first float32 tensors (B, d, ...) -> o (B, d, ...), plus conv's extra output."""
        kv = self._heads(k_shift).unsqueeze(2) * self._heads(v).unsqueeze(1)  # (B, d_h_i, d_h_j, H, ...)
        s, extra = conv(kv)  # (B, d_h, d_h, H, ...)
        o = (self._heads(q).unsqueeze(2) * s).sum(1)  # (B, d_h_j, H, ...): o_t = q_tᵀ s_t per head
        o = o.transpose(1, 2)  # (B, H, d_h_j, ...)
        return o.reshape(o.shape[0], self.hidden_size, *o.shape[3:]), extra  # channel h·d_h + j

    # ----------------------------------------------------------------------------- forward
    def _forward(self, x, mask, state, return_state):
        q, k, v = self.in_proj(x).chunk(3, dim=-1)  # (B, L, d) each
        if mask is not None:  # the projection's bias made masked k, v nonzero again
            keep = mask.unsqueeze(-1).to(k.dtype)
            k, v = k * keep, v * keep
        q, v = (t.transpose(1, 2).float() for t in (q, v))  # (B, d, L) float32
        k = k.float()  # (B, L, d): the shift convolution takes either layout, see _shift
        k_shift, shift_final = self._shift(k, None if state is None else state["shift_state"], return_state)
        kv_window = self.max_kernel_length - 1

        def conv(kv):
            if self.distilled:
                return self._distilled_conv(kv, state, return_state)
            if self.modal_state:
                s, final = self._modal_conv(kv, None if state is None else state["kv_state"], return_state)
                return s, {"kv_state": final}
            s, final = self.long_conv.convolve(
                kv,
                initial_state=None if state is None else state["kv_state"],
                return_final_state=return_state,
                state_length=kv_window,
            )
            return s, {"kv_state": final}

        o, kv_final = self._mix(q, k_shift, v, conv)  # (B, d, L)
        y = self.out_proj(o.transpose(1, 2).to(x.dtype))
        new_state = {"shift_state": shift_final, **kv_final} if return_state else None
        return y, new_state

    def _shift(self, k: torch.Tensor, history: torch.Tensor | None, return_state: bool):
        """Step 2 on k (B, L, d) float32 -> (k̃ (B, d, L) channel-first view, final window (B, d, S − 1) or None).

        ``history``: the (B, d, S − 1) window of earlier k inputs (None: zeros). A short unregularized shift
        kernel (the default S = 4) is applied directly, as S shifted multiply-adds on the (B, L, d) layout
        (:func:`~ssmhub.ops.short_conv.causal_depthwise_conv`, the skip D folded into the tap that meets the
        current input); anything else goes through the long-convolution kernel's FFT backend. Same numbers.
        """
        window = self.shift_kernel_size - 1
        if not self.direct_shift:
            return self.shift_conv.convolve(
                k.transpose(1, 2), initial_state=history, return_final_state=return_state, state_length=window
            )
        taps = self.shift_kernel().flip(-1)  # (d, S): tap S − 1 meets the current input
        if self.shift_conv.skip is not None:
            taps = torch.cat([taps[:, :-1], taps[:, -1:] + self.shift_conv.skip.float()[:, None]], dim=-1)
        history = None if history is None else history.transpose(1, 2).float()  # (B, S − 1, d)
        k_shift = causal_depthwise_conv(k, taps, None, history)  # (B, L, d)
        final = None
        if return_state:
            if history is None:
                history = k.new_zeros(k.shape[0], window, k.shape[2])
            final = conv_window(history, k).transpose(1, 2).contiguous()  # (B, d, S − 1)
        return k_shift.transpose(1, 2), final

    def _step(self, x_t, state, mask_t):
        """One token: O(d·(shift_kernel_size + d_h·max_kernel_length)) work, O(d·d_h·N) when modal."""
        q, k, v = self.in_proj(x_t).chunk(3, dim=-1)  # (B, d) each
        if mask_t is not None:
            keep = mask_t.unsqueeze(-1).to(k.dtype)
            k, v = k * keep, v * keep
        q, k, v = q.float(), k.float(), v.float()
        k_shift, shift_state = causal_conv_step(
            k, state["shift_state"], self.shift_conv(self.shift_kernel_size), self.shift_conv.skip
        )  # (B, d)
        if self.distilled:

            def conv(kv):
                return self._distilled_conv(kv, state, True)

        elif self.modal_state:

            def conv(kv):
                s, new = self._modal_conv_step(kv, state["kv_state"])
                return s, {"kv_state": new}

        else:
            long_kernel = self.long_conv(self.max_kernel_length)

            def conv(kv):
                s, new = causal_conv_step(kv, state["kv_state"], long_kernel, self.long_conv.skip)
                return s, {"kv_state": new}

        o, kv_state = self._mix(q, k_shift, v, conv)  # (B, d)
        y_t = self.out_proj(o.to(x_t.dtype))
        return y_t, {"shift_state": shift_state, **kv_state}

    def extra_repr(self) -> str:
        return (
            f"hidden_size={self.hidden_size}, num_heads={self.num_heads}, head_dim={self.head_dim}, "
            f"max_kernel_length={self.max_kernel_length}, shift_kernel_size={self.shift_kernel_size}"
        )
