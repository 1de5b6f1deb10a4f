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

Step 4 has three forms (:mod:`ssmhub.layers.h3_convolutions`, one class each behind one interface, chosen
from the options in one place): the learned kernel above; the original H3's diagonal SSM (``kernel_type=
"diagonal_ssm"``); and the learned kernel distilled into modal form (:meth:`H3Mixer.distill`,
:mod:`ssmhub.layers.h3_distillation`). The shift kernel's options are chosen by
:meth:`H3Options.shift_kernel_options <ssmhub.layers.h3_options.H3Options.shift_kernel_options>`.

Decoding is exact: :meth:`H3Mixer.step` keeps the last ``shift_kernel_size − 1`` k inputs and the last
``max_kernel_length − 1`` kv inputs in fixed-shape windows (taps reach back L_max − 1 positions; an input
further back meets a zero tap), so each token costs O(d·d_h·L_max), and a forward pass handed a state
continues from it (prefill). An explicit length-L kernel has no smaller exact state (the long-conv paper
gives no recurrent mode; its Prop. 2, App. D.2, needs state L); :meth:`H3Mixer.kernel` exposes the effective
kernel, which a distilled (modal SSM) decode fits in O(N) per channel.

Padding: masked positions are zeroed in the input and again in k and v after the biased projection,
so they contribute nothing to either convolution; zeros at the front of a causal convolution add
nothing wherever they sit, so a left-padded row gives the same outputs as the row alone.
"""

from __future__ import annotations

import torch
from torch import nn

from ..ops.diagonal_rows import ModalRowsStep, modal_kernel_available
from ..ops.longconv import causal_conv_step
from ..ops.modal import ModalKernel, hankel_singular_values
from ..ops.row_tables import kernel_importable
from ..ops.short_conv import causal_depthwise_conv, conv_window
from ..ops.window_rows import window_kernel_available, window_step_rows_
from .h3_convolutions import DistilledConvolution, long_convolution
from .h3_distillation import DistillationReport, HeadFits, ModalForm, check_distill_request
from .h3_options import H3Options
from .longconv import LongConvKernel
from .mixer import TokenMixer

__all__ = ["DistillationReport", "H3Mixer", "H3Options"]
# Longest unregularized shift kernel run as a direct FIR (H3Mixer._shift): up to this many taps, shifted
# multiply-adds cost less than an FFT convolution of the whole sequence.
DIRECT_SHIFT_MAX_TAPS = 16


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
        self.shift_conv = LongConvKernel(hidden_size, self.shift_kernel_size, options.shift_kernel_options())
        self.convolution = long_convolution(options, num_heads, device=self.in_proj.weight.device)  # step 4's form
        self.long_conv = self.convolution.long_conv  # its parameters, ``long_conv.*``
        self.out_proj = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.decode_num_modes = options.decode_num_modes
        if self.convolution.modal is not None:
            self.ssm = self.convolution.modal  # a distilled layer's modal fit, ``ssm.*`` (float32 on a half load)

    # ----------------------------------------------------------------------------- modal forms, distillation
    @property
    def distilled(self) -> bool:
        """True once the long convolution is replaced by its modal (diagonal SSM) fit."""
        return self.decode_num_modes is not None

    @property
    def modal_state(self) -> bool:
        """True when the layer decodes with an O(N) modal state: distilled, or a diagonal SSM."""
        return self.num_state_modes is not None

    @property
    def num_state_modes(self) -> int | None:
        """N of the modal state (None when the layer decodes exactly with a window of L_max − 1 inputs); for a
        distilled layer the most modes any of its distilled heads uses (0 when every head was left exact)."""
        return self.convolution.num_state_modes

    def modal_form(self, heads: torch.Tensor | None = None, modes: int | None = None) -> ModalKernel:
        """The modal form of the long kernel: the diagonal SSM's own, or the distilled fit (see
        :func:`ssmhub.ops.modal.fit_modal_kernel`); with ``heads``, those heads' fits cut to their first ``modes``
        modes (default: the most any distilled head uses)."""
        return self.convolution.modal_form(heads, modes)

    def _learned(self, purpose: str = "") -> LongConvKernel:
        """The learned long kernel's module (a ValueError for a diagonal SSM: it is modal already)."""
        if self.convolution.learned is None:
            raise ValueError(f"a diagonal-SSM H3 layer has no long convolution{purpose}: it is already modal")
        return self.convolution.learned

    def hankel_singular_values(self) -> torch.Tensor:
        """The Hankel singular values (H, L_max − 1) of each head's learned kernel, descending
        (:func:`ssmhub.ops.modal.hankel_singular_values`): how many modes a head needs before distilling it."""
        return hankel_singular_values(self._learned()(self.max_kernel_length).detach().float().cpu())

    @torch.no_grad()
    def distill(
        self, num_modes: int, tolerance: float | None = None, method: str = "best", eigensolver: str = "truncated"
    ) -> DistillationReport:
        """Fit each head's learned long kernel (all L_max taps) in modal form and switch the layer to it.

        Without ``tolerance`` every head gets ``num_modes`` modes. With a ``tolerance`` (relative L2 kernel
        error, ``0 < tol < 1``) each head gets the smallest order among ``1, 2, 4, …, num_modes`` whose fit
        meets it, and a head whose best fit within the budget misses it stays exact: it decodes with its window
        of L_max − 1 inputs while the others decode with an O(N) modal state (LaughingHyena, arXiv 2310.18780
        §3.2, picks the order per filter). The layer then computes with these kernels everywhere (training
        forward, prefill and step agree). Beyond L_max a modal kernel keeps decaying while the learned one is
        zero (the fit only sees taps 0..L_max-1). ``method`` and ``eigensolver`` (the Hankel basis: ``"truncated"``
        by FFT-applied block Krylov, or the ``"dense"`` reference): see :func:`ssmhub.ops.modal.fit_modal_kernel`.
        See :mod:`ssmhub.layers.h3_distillation`.
        """
        learned = self._learned(" to distill")
        check_distill_request(self.max_kernel_length, num_modes, tolerance, method)  # before any fitting
        kernel = learned(self.max_kernel_length).detach().float().cpu()  # (H, L_max), regularized
        fits = HeadFits.fit(kernel, num_modes, tolerance, method, eigensolver)
        if self.decode_num_modes != num_modes:  # fresh (H, num_modes) buffers, beside the weights
            self.decode_num_modes = num_modes
            self.ssm = ModalForm(self.num_heads, num_modes, device=self.out_proj.weight.device)
        fits.store(self.ssm.to(self.long_conv.skip.device))
        self.convolution = DistilledConvolution(self.long_conv, self.ssm)
        exact_bytes = 4 * self.head_dim**2 * self.num_heads * (self.max_kernel_length - 1)
        return fits.report(state_bytes=self.kv_state_bytes(), exact_state_bytes=exact_bytes)

    def kv_state_bytes(self) -> int:
        """Bytes of the long convolution's decode state per sequence (complex64 modes, float32 windows)."""
        layout = self.convolution.state_layout((1, self.head_dim, self.head_dim))
        return sum(torch.Size(shape).numel() * dtype.itemsize for shape, dtype in layout.values())

    # ----------------------------------------------------------------------------- kernels, state
    def kernel(self, length: int) -> torch.Tensor:
        """The effective (num_heads, length) float32 long-conv kernel (regularized; zero beyond L_max).

        Together with ``self.long_conv.skip`` (D) this is the whole long convolution: the hook for a
        distilled decode that fits it with a modal (diagonal SSM) form. A distilled layer's heads left exact
        keep their learned kernel.
        """
        return self.convolution.kernel(length)

    def shift_kernel(self, length: int | None = None) -> torch.Tensor:
        """The effective (hidden_size, length) float32 shift kernel (default: its own length)."""
        return self.shift_conv(self.shift_kernel_size if length is None else length)

    def state_layout(self, batch_size: int, dtype=None):
        """Windows of past inputs, float32 whatever the model dtype (the convolutions run in float32).

        ``shift_state``: (B, d, shift_kernel_size − 1), the last k inputs, oldest first; ``kv_state``:
        (B, d_h, d_h, H, max_kernel_length − 1), the last kv inputs, oldest first, or, for a modal layer,
        the complex64 modal state (B, d_h, d_h, H, N), independent of the context. A distilled layer holds, per
        order n its modal heads use, a state (B, d_h, d_h, H_n, n) for the H_n heads of that order (``kv_state``
        when there is one order, else ``kv_state_{n}``), and ``kv_window`` (B, d_h, d_h, H_exact,
        max_kernel_length − 1) for the heads left exact (when it has such heads). See
        :mod:`ssmhub.layers.h3_convolutions`.
        """
        shift = ((batch_size, self.hidden_size, self.shift_kernel_size - 1), torch.float32)
        return {"shift_state": shift, **self.convolution.state_layout((batch_size, self.head_dim, self.head_dim))}

    # ----------------------------------------------------------------------------- the layer
    def _qkv(self, x: torch.Tensor, mask: torch.Tensor | None):
        """Step 1 on x (B, [L,] d) -> q, k, v float32, each (B, [L,] d), k and v zero where ``mask`` is 0."""
        q, k, v = self.in_proj(x).chunk(3, dim=-1)
        if mask is not None:  # the projection's bias made masked k, v nonzero again
            keep = mask.unsqueeze(-1).to(k.dtype)
            k, v = k * keep, v * keep
        return q.float(), k.float(), v.float()

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

    def _forward(self, x, mask, state, return_state):
        q, k, v = self._qkv(x, mask)  # (B, L, d) each
        q, v = q.transpose(1, 2), v.transpose(1, 2)  # (B, d, L); the shift convolution takes k either way
        k_shift, shift_final = self._shift(k, None if state is None else state["shift_state"], return_state)
        o, kv_final = self._mix(q, k_shift, v, lambda kv: self.convolution.convolve(kv, state, return_state))
        y = self.out_proj(o.transpose(1, 2).to(x.dtype))  # o: (B, d, L)
        return y, ({"shift_state": shift_final, **kv_final} if return_state else None)

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

    def step_coefficients(self):
        """The shift kernel's taps and skip (``shift.kernel``, ``shift.skip``) and the long convolution's
        :meth:`~ssmhub.layers.h3_convolutions.H3Convolution.step_coefficients` (its modal λ, or its kernel)."""
        shift = {"shift.kernel": self.shift_kernel()}
        if self.shift_conv.skip is not None:
            shift["shift.skip"] = self.shift_conv.skip
        return {**shift, **self.convolution.step_coefficients()}

    def _step(self, x_t, state, mask_t):
        """One token: O(d·(shift_kernel_size + d_h·max_kernel_length)) work, O(d·d_h·N) when modal."""
        return self._step_with(x_t, state, mask_t, self.step_coefficients())

    @property
    def steps_rows_in_one_pass(self) -> bool:
        """On a CPU with numba, a layer whose long convolution is one modal state (its diagonal SSM, or a distilled
        kernel of one order) or one window of past inputs (its learned kernel, decoded exactly) steps it in one
        pass, in place (:meth:`step_rows_`)."""
        on_cpu = next(self.shift_conv.parameters()).device.type == "cpu"  # (in_proj may be a quantized module)
        one_state = self.convolution.single_modal_state() or self.convolution.single_window_state()
        return on_cpu and kernel_importable() and one_state is not None

    def step_rows_(self, x_t, tables, rows, new, coefficients=None, step=None):
        """:meth:`~ssmhub.layers.mixer.TokenMixer.step_rows_` with each state updated in one pass, in place: the
        shift window and a modal state in one call of a :class:`~ssmhub.ops.diagonal_rows.ModalRowsStep` (the
        shift, the outer product, the recurrence, the read-out and the contraction with q fused), a window of past
        kv inputs and the shift window by :func:`~ssmhub.ops.window_rows.window_step_rows_` (each input met by its
        tap, the window shifted where it lies). The protocol's gather, step and write-back where the kernel cannot
        run or a gradient is asked for."""
        c = self.kept_step_coefficients() if coefficients is None else coefficients
        one_pass = step is None and self.steps_rows_in_one_pass  # ``step``: a compiled stand-in for the step
        one_pass = one_pass and not self._gradient_asked(x_t, c)  # asked first: no kernel is formed for nothing
        conv = self._kept_rows_kernel(tables, c, lambda: self._rows_convolution(tables, c)) if one_pass else None
        if conv is None:
            return super().step_rows_(x_t, tables, rows, new, c, step)
        self._check_step_input(x_t)
        return self.out_proj(conv(tables, rows, new, self.in_proj(x_t).float()).to(x_t.dtype))  # (R, 3d) -> (R, d)

    def _rows_convolution(self, tables, c):
        """(tables, rows, new, qkv (R, 3d): q, k before the shift, v) -> o (R, d): the shift and the long
        convolution's step on the table rows in place, for tables laid out as ``tables`` (it holds none of them), or
        None where no kernel can update the long convolution's table."""
        modal, window = self.convolution.single_modal_state(), self.convolution.single_window_state()
        taps, skip = c["shift.kernel"], c.get("shift.skip")

        def shifted(tables, rows, new, k):  # k (R, d) -> k̃ (R, d), the shift window stepped in place
            return window_step_rows_(tables["shift_state"], rows, new, k, taps, skip)

        if modal is not None and modal_kernel_available(tables[modal[0]]):
            name, prefix = modal
            lam = (c[prefix + "lambda_re"], c[prefix + "lambda_im"])
            residues = (c[prefix + "residue_re"], c[prefix + "residue_im"])
            direct = c[prefix + "d"] + c[prefix + "skip"]
            if window_kernel_available(tables["shift_state"]):  # the shift steps inside the modal kernel's call
                fused = ModalRowsStep(tables[name], lam, residues, direct, (tables["shift_state"], taps, skip))
                return lambda tables, rows, new, qkv: fused(tables[name], rows, new, qkv, tables["shift_state"])
            modal_step = ModalRowsStep(tables[name], lam, residues, direct)

            def shift_then_modal(tables, rows, new, qkv):
                q, k, v = qkv.chunk(3, dim=-1)  # (R, d) each
                return modal_step(tables[name], rows, new, torch.cat([q, shifted(tables, rows, new, k), v], dim=-1))

            return shift_then_modal
        blocks = window is not None and tables[window][0].is_contiguous()  # each slot's block: flattened as a view
        if not (blocks and window_kernel_available(tables[window].flatten(1, 3))):  # (slots, d_h·d_h·H, L − 1)
            return None
        kernel, kernel_skip = c["kernel"], c["skip"]  # (H, L): channel (i, j, h) of the window takes head h's

        def window_conv(tables, rows, new, qkv):
            def window_step(kv):  # (R, d_h, d_h, H) -> (R, d_h, d_h, H)
                table = tables[window].flatten(1, 3)
                return window_step_rows_(table, rows, new, kv.flatten(1), kernel, kernel_skip).view_as(kv), None

            q, k, v = qkv.chunk(3, dim=-1)  # (R, d) each
            return self._mix(q, shifted(tables, rows, new, k), v, window_step)[0]

        return window_conv

    def _step_with(self, x_t, state, mask_t, coefficients):
        q, k, v = self._qkv(x_t, mask_t)  # (B, d) each
        shift_taps, shift_skip = coefficients["shift.kernel"], coefficients.get("shift.skip")
        k_shift, shift_state = causal_conv_step(k, state["shift_state"], shift_taps, shift_skip)
        o, kv_state = self._mix(q, k_shift, v, lambda kv: self.convolution.step(kv, state, coefficients))  # (B, d)
        return self.out_proj(o.to(x_t.dtype)), {"shift_state": shift_state, **kv_state}

    def extra_repr(self) -> str:
        return (
            f"hidden_size={self.hidden_size}, num_heads={self.num_heads}, head_dim={self.head_dim}, "
            f"max_kernel_length={self.max_kernel_length}, shift_kernel_size={self.shift_kernel_size}"
        )
