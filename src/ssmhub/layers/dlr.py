"""The DLR layer, seed paper §2.3 (arXiv 2212.00768), as a token mixer.

On an input ``u ∈ R^{B×L×H}``:

1. ``y = conv(u, K)``, ``K_h = Re(W_h P)`` (or DLR-prod ``Re·Im``), causal (Eq. 4) or
   bidirectional (Eq. 6);
2. ``y = y + u`` ("a residual connection from u to y"; ``skip_connection="learned"`` uses the
   S4/DSS codebase's ``y + D ⊙ u`` instead);
3. GELU, then dropout;
4. ``W_out``, a position-wise linear map H→H (``use_glu``: H→2H followed by a GLU, the variant
   used for the paper's Tables 3 and 4).

Decoding uses the recurrence ``x_k = Λ x_{k-1} + u_k`` (Eq. 1) in :meth:`DLRMixer.step`, whose output
equals the convolution's. A forward pass handed a state continues from it and can return the state
after its last token, so a prefill hands over to step-by-step decoding.

Bidirectional layers (Eq. 5) sum a forward DLR on u and a backward DLR on reversed u. Figure 4 shares
one Λ between the directions with ``W ∈ C^{2H×N}``; Eq. 5 gives each direction its own Λ. Both are
available (``bidirectional_shared_lambda``), Figure 4 by default. Bidirectional layers cannot be
stepped.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..ops.diagonal_rows import DiagonalRowsStep, kernel_available
from ..ops.dlr import (
    dlr_init,
    dlr_kernel,
    dlr_scan,
    dlr_scan_recurrent,
    dlr_step_coefficients,
    dlr_step_with,
    kronecker_dlr,
)
from ..ops.fftconv import fft_conv
from ..ops.row_tables import kernel_importable
from .dlr_options import DLROptions
from .initial_values import fill_initial_values
from .memo import can_keep, kept, tensor_versions
from .mixer import TokenMixer

__all__ = ["DLRMixer", "DLROptions"]

# A forward of at most this many tokens after a state runs the recurrence (Eq. 1) token by token: the parallel
# pass's fixed cost (kernel, FFT, Vandermonde powers) is that of several steps (benchmarks/speculative.py).
RECURRENT_MAX_LENGTH = 4


class DLRParameters(nn.Module):
    """The recurrence parameters of one DLR layer; kept in float32 and out of weight decay.

    ``log_lambda_re``, ``log_lambda_im``: (D, N), D = 2 only for a bidirectional layer with a Λ per
    direction; ``weight``: (directions·H, N, 2), the real and imaginary parts of W (stored as reals,
    Figure 4); ``skip``: (H,) the learned ``D`` of ``skip_connection="learned"``.
    """

    def __init__(
        self,
        hidden_size: int,
        state_size: int,
        num_lambdas: int,
        num_directions: int,
        learned_skip: bool,
        dt_min: float,
        dt_max: float,
        weight_std: float | None,
    ):
        super().__init__()
        self.hidden_size, self.state_size = hidden_size, state_size
        self.dt_min, self.dt_max, self.weight_std = dt_min, dt_max, weight_std
        self.log_lambda_re = nn.Parameter(torch.empty(num_lambdas, state_size))
        self.log_lambda_im = nn.Parameter(torch.empty(num_lambdas, state_size))
        self.weight = nn.Parameter(torch.empty(num_directions * hidden_size, state_size, 2))
        self.skip = nn.Parameter(torch.empty(hidden_size)) if learned_skip else None
        fill_initial_values(self)

    def initial_parameter_values(self, generator: torch.Generator | None = None) -> dict[str, torch.Tensor]:
        """Fresh §2.3 values of every parameter, keyed by name (see :func:`ssmhub.ops.dlr.dlr_init`)."""
        values = dlr_init(
            self.state_size,
            self.weight.shape[0],
            self.dt_min,
            self.dt_max,
            num_lambdas=self.log_lambda_re.shape[0],
            weight_std=self.weight_std,
            generator=generator,
        )
        if self.skip is not None:
            values["skip"] = torch.ones(self.hidden_size)  # y + D⊙u starts as the paper's y + u
        return values


class DLRMixer(TokenMixer):
    """DLR token mixer (:class:`~ssmhub.layers.mixer.TokenMixer`).

    Args:
        hidden_size: H, the number of channels.
        options: a :class:`DLROptions` (or a ``DLRConfig``, which is one); ``**values`` override single fields.
    """

    def __init__(self, hidden_size: int, options: DLROptions | None = None, **values):
        super().__init__()
        options = DLROptions.take(options, **values)
        options.check_options(hidden_size)
        state_size, kernel_type, bidirectional = options.state_size, options.kernel_type, options.bidirectional
        self.hidden_size = hidden_size
        self.state_size = state_size
        self.kernel_type = kernel_type
        self.bidirectional = bidirectional
        self.num_directions = 2 if bidirectional else 1
        self.num_lambdas = 2 if bidirectional and not options.bidirectional_shared_lambda else 1
        self.ssm = DLRParameters(
            hidden_size,
            state_size,
            self.num_lambdas,
            self.num_directions,
            options.skip_connection == "learned",
            options.dt_min,
            options.dt_max,
            options.weight_std,
        )
        self.dropout = nn.Dropout(options.dropout)
        self.use_glu = options.use_glu
        self.output_linear = nn.Linear(hidden_size, 2 * hidden_size if self.use_glu else hidden_size)
        self.causal = not bidirectional

    # ----------------------------------------------------------------------------- parameters
    def _modal_form(self, direction: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(log|Λ|, arg Λ, w)`` of one direction: (N,), (N,), (H, N, 2) real and imaginary parts, all float32."""
        lam = min(direction, self.num_lambdas - 1)
        w = self.ssm.weight[direction * self.hidden_size : (direction + 1) * self.hidden_size].float()  # (H, N, 2)
        log_modulus = -(self.ssm.log_lambda_re[lam].float() ** 2)  # log|Λ| = -(logΛ_re)²
        return log_modulus, self.ssm.log_lambda_im[lam].float(), w

    @property
    def _readout(self) -> str:
        """How the recurrence's state is read out: Re<w, x> (Eq. 1), or Im/2 for DLR-prod's Kronecker form."""
        return "half_imag" if self.kernel_type == "prod" else "real"

    def _recurrence(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, str]:
        """The diagonal recurrence that decodes this layer: ``(log|Λ|, arg Λ, w, readout)``.

        For DLR-prod that is the N²-state Kronecker DLR; building it costs H·N² per call, so outside
        autograd it is memoized, keyed on the parameters' version counters (any update rebuilds it); a traced
        step (``torch.compile``, ``torch.export``) builds it in its graph.
        """
        if self.kernel_type != "prod":
            return (*self._modal_form(0), self._readout)

        def build():
            return (*kronecker_dlr(*self._modal_form(0)), self._readout)

        if not can_keep():
            return build()
        params = (self.ssm.log_lambda_re, self.ssm.log_lambda_im, self.ssm.weight)
        return kept(self, "_kronecker_memo", tensor_versions(params), build)

    def kernel(self, length: int, direction: int = 0) -> torch.Tensor:
        """The (H, length) float32 convolution kernel of one direction."""
        lam = min(direction, self.num_lambdas - 1)
        weight = self.ssm.weight[direction * self.hidden_size : (direction + 1) * self.hidden_size]
        return dlr_kernel(self.ssm.log_lambda_re[lam], self.ssm.log_lambda_im[lam], weight, length, self.kernel_type)

    # ----------------------------------------------------------------------------- state
    @property
    def recurrent_state_size(self) -> int:
        return self.state_size**2 if self.kernel_type == "prod" else self.state_size

    def noncausal_reason(self) -> str:
        return "a bidirectional DLR layer sees future tokens"

    def state_layout(self, batch_size: int, dtype=None):
        """``dlr_state``: x_{k} as float32 real and imaginary planes (B, H, 2, N) (N² for DLR-prod), whatever the
        model dtype (:mod:`ssmhub.ops.dlr`'s layout; a complex64 (B, H, N) state of an older file is converted by
        :meth:`ssmhub.cache.RecurrentCache.from_state_dict`)."""
        return {"dlr_state": ((batch_size, self.hidden_size, 2, self.recurrent_state_size), torch.float32)}

    # ----------------------------------------------------------------------------- forward
    def _output(self, u: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Steps 2-4 of the layer on (B, L, H) tensors: skip, GELU, dropout, W_out (and GLU)."""
        skip = u if self.ssm.skip is None else u * self.ssm.skip.to(u.dtype)
        # skip first: the sum takes the layout of the contiguous skip, not of y (a transposed (B, H, L)
        # tensor), whose GELU backward is much slower
        y = self.dropout(F.gelu(skip + y.to(u.dtype)))
        y = self.output_linear(y)
        return F.glu(y, dim=-1) if self.use_glu else y

    def _forward(self, x, mask, state, return_state):
        u = x.transpose(1, 2)  # (B, H, L)
        seq_len = u.shape[-1]
        if self.bidirectional:
            backward = self.kernel(seq_len, direction=1)
            y = fft_conv(u.float(), self.kernel(seq_len), backward)  # (B, H, L)
            return self._output(x, y.transpose(1, 2)), None
        log_modulus, phase, w, readout = self._recurrence()
        initial = None if state is None else state["dlr_state"]
        if state is not None and seq_len <= RECURRENT_MAX_LENGTH:  # a few tokens after a state: steps are cheaper
            y, final = dlr_scan_recurrent(u, log_modulus, phase, w, readout, initial, return_state)  # (B, H, L)
        else:
            kernel = self.kernel(seq_len)
            y, final = dlr_scan(u, log_modulus, phase, w, kernel, readout, initial, return_state)  # (B, H, L)
        return self._output(x, y.transpose(1, 2)), ({"dlr_state": final} if return_state else None)

    def step_coefficients(self):
        """Λ and w of the recurrence as float32 planes (:func:`~ssmhub.ops.dlr.dlr_step_coefficients`)."""
        log_modulus, phase, w, _ = self._recurrence()
        return dlr_step_coefficients(log_modulus, phase, w)

    def _step(self, x_t, state, mask_t):
        """One token, O(H·N): x_{k} = Λ x_{k-1} + u_k (Eq. 1), read out as the convolution's output."""
        return self._step_with(x_t, state, mask_t, self.step_coefficients())

    @property
    def steps_rows_in_one_pass(self) -> bool:
        return self.causal and self.ssm.weight.device.type == "cpu" and kernel_importable()

    def step_rows_(self, x_t, tables, rows, new, coefficients=None, step=None):
        """:meth:`~ssmhub.layers.mixer.TokenMixer.step_rows_` by one pass over the rows' states in place (Eq. 1, a
        :class:`~ssmhub.ops.diagonal_rows.DiagonalRowsStep` kept between steps) where the kernel can run and no
        gradient is asked for; else the protocol's gather, step and write-back, the kernel's oracle."""
        c = self.kept_step_coefficients() if coefficients is None else coefficients
        protocol = step is not None or self._gradient_asked(x_t, c)  # asked first: no kernel is formed for nothing
        kernel = None if protocol else self._kept_rows_kernel(tables, c, lambda: self._rows_kernel(tables, c))
        if kernel is None:
            return super().step_rows_(x_t, tables, rows, new, c, step)
        self._check_step_input(x_t)
        z_re, z_im = kernel(tables["dlr_state"], rows, new, x_t)  # (R, H) each
        y_t = z_re if self._readout == "real" else 0.5 * z_im
        return self._output(x_t.unsqueeze(1), y_t.unsqueeze(1))[:, 0]

    @staticmethod
    def _rows_kernel(tables, c):
        """The state's :class:`~ssmhub.ops.diagonal_rows.DiagonalRowsStep`, or None where the kernel cannot run."""
        table = tables["dlr_state"]
        if not kernel_available(table):
            return None
        return DiagonalRowsStep(table, (c["lambda_re"], c["lambda_im"]), (c["w_re"], c["w_im"]))

    def _step_with(self, x_t, state, mask_t, coefficients):
        y_t, new_state = dlr_step_with(x_t, state["dlr_state"], coefficients, self._readout)
        return self._output(x_t.unsqueeze(1), y_t.unsqueeze(1))[:, 0], {"dlr_state": new_state}
