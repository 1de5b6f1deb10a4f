"""The long convolution of an H3 layer (step 4 of :mod:`ssmhub.layers.h3`) in its three forms, one class each.

Per head h, ``s = K_h ∗ u + D_h ⊙ u`` on inputs ``u`` (…, H, L) (in the layer, kv: (B, d_h, d_h, H, L)):

- :class:`WindowConvolution`: the learned, regularized kernel of L_max taps (long-conv paper, arXiv 2302.06646
  §3.1, Alg. 1), by FFT, decoded exactly with a window of the last L_max − 1 inputs (an explicit kernel has no
  smaller exact state: the paper's Prop. 2, App. D.2);
- :class:`DiagonalSSMConvolution`: the original H3's diagonal SSM (arXiv 2212.14052 §3), an S4D kernel in modal
  form, decoded with its O(N) modal state;
- :class:`DistilledConvolution`: a learned kernel fitted in modal form (:mod:`ssmhub.layers.h3_distillation`),
  each head with its own order, the heads no order fits left exact on their window.

All three have the interface of :class:`H3Convolution` (``convolve``, ``step_coefficients``, ``step``,
``state_layout``, ``kernel``), and
:func:`long_convolution` is the one place that picks the form from the layer's options. A form is a plain object
over the layer's modules (``long_conv``, and ``ssm`` when distilled), which hold the parameters and buffers under
the names saved models have, so it never holds a tensor of its own: a cast or a loaded state reaches it.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ..ops.longconv import causal_conv, causal_conv_step
from ..ops.modal import ModalKernel, modal_kernel, modal_scan, modal_step_coefficients, modal_step_with
from .diagonal_ssm import DiagonalSSMKernel
from .h3_distillation import ModalForm
from .h3_options import H3Options
from .longconv import LongConvKernel
from .memo import can_keep, kept, tensor_versions
from .mixer import MixerState, StateLayout

__all__ = [
    "DiagonalSSMConvolution",
    "DistilledConvolution",
    "H3Convolution",
    "WindowConvolution",
    "long_convolution",
]


def long_convolution(options: H3Options, num_heads: int, device=None) -> H3Convolution:
    """The form of the long convolution that ``options`` ask for, with fresh parameters: the one branch point.

    ``kernel_type="diagonal_ssm"``: H3's diagonal SSM; else a learned kernel, distilled (modal buffers of
    ``decode_num_modes`` modes per head on ``device``, filled by loading a distilled model) or not.
    """
    if options.kernel_type == "diagonal_ssm":
        ssm = DiagonalSSMKernel(num_heads, options.ssm_state_size, discretization=options.ssm_discretization)
        return DiagonalSSMConvolution(ssm)
    learned = LongConvKernel(num_heads, options.max_kernel_length, options)
    if options.decode_num_modes is None:
        return WindowConvolution(learned)
    return DistilledConvolution(learned, ModalForm(num_heads, options.decode_num_modes, device=device))


def _entry(state: MixerState | None, name: str) -> torch.Tensor | None:
    return None if state is None else state[name]


class H3Convolution:
    """``s = K ∗ u + D ⊙ u`` over (…, H, L) inputs, float32, with a decode state of fixed layout.

    ``state`` arguments are the layer's whole state (a form reads its own entries, None: zeros); a form returns
    its own entries ``{name: tensor}`` (None for a final state not asked for).

    Attributes:
        long_conv: the module whose parameters K and D are (the layer's ``long_conv``).
        learned: the :class:`~ssmhub.layers.longconv.LongConvKernel` a distillation fits (None: already modal).
        modal: a distilled layer's :class:`~ssmhub.layers.h3_distillation.ModalForm` (its ``ssm``), else None.
    """

    long_conv: nn.Module
    learned: LongConvKernel | None = None
    modal: ModalForm | None = None

    def convolve(self, u: torch.Tensor, state: MixerState | None, return_state: bool):
        """u (…, H, L) -> (s (…, H, L) float32, {name: final state or None}), continuing from ``state``."""
        raise NotImplementedError

    def step_coefficients(self) -> MixerState:
        """Everything :meth:`step` reads from the parameters, ``{name: tensor}``: formed once for many steps."""
        raise NotImplementedError

    def step(self, u_t: torch.Tensor, state: MixerState, coefficients: MixerState | None = None):
        """One token: u_t (…, H) -> (s_t (…, H) float32, {name: new state}), from :meth:`step_coefficients` formed
        already (None: formed here)."""
        return self._step(u_t, state, self.step_coefficients() if coefficients is None else coefficients)

    def _step(self, u_t: torch.Tensor, state: MixerState, coefficients: MixerState):
        raise NotImplementedError

    def state_layout(self, lead: tuple[int, ...]) -> StateLayout:
        """``{name: (shape, dtype)}`` of the state of inputs (*lead, H, L)."""
        raise NotImplementedError

    def kernel(self, length: int) -> torch.Tensor:
        """The effective (H, length) float32 kernel K (without D)."""
        raise NotImplementedError

    @property
    def num_state_modes(self) -> int | None:
        """N of a modal state, None for an exact window."""
        return None

    def single_modal_state(self) -> tuple[str, str] | None:
        """``(state name, coefficient prefix)`` where one complex64 modal state holds every head, in head order
        (what a one-pass kernel steps: :meth:`H3Mixer.step_rows_ <ssmhub.layers.h3.H3Mixer.step_rows_>`); else
        None (an exact window, several orders, heads left exact)."""
        return None

    def single_window_state(self) -> str | None:
        """The state's name where one window of past inputs holds every head (what
        :meth:`H3Mixer.step_rows_ <ssmhub.layers.h3.H3Mixer.step_rows_>` shifts in place, its coefficients
        ``kernel`` and ``skip``); else None."""
        return None

    def modal_form(self, heads: torch.Tensor | None = None, modes: int | None = None) -> ModalKernel:
        """The kernel as a :class:`~ssmhub.ops.modal.ModalKernel` (see the forms)."""
        raise ValueError("this H3 layer is not distilled: call distill(num_modes) first")


class WindowConvolution(H3Convolution):
    """The learned kernel (:meth:`LongConvKernel.convolve <ssmhub.layers.longconv.LongConvKernel.convolve>`),
    decoded exactly: taps reach back L_max − 1 positions (an input further back meets a zero tap), so the state
    ``kv_state`` (…, H, L_max − 1) float32 is the window of the last inputs, oldest first."""

    def __init__(self, long_conv: LongConvKernel):
        self.long_conv = self.learned = long_conv

    def convolve(self, u, state, return_state):
        window = self.long_conv.max_kernel_length - 1
        s, final = self.long_conv.convolve(
            u, initial_state=_entry(state, "kv_state"), return_final_state=return_state, state_length=window
        )
        return s, {"kv_state": final}

    def step_coefficients(self):
        return {"kernel": self.long_conv(self.long_conv.max_kernel_length), "skip": self.long_conv.skip}

    def single_window_state(self):
        return "kv_state"

    def _step(self, u_t, state, coefficients):
        s, new = causal_conv_step(u_t, state["kv_state"], coefficients["kernel"], coefficients["skip"])
        return s, {"kv_state": new}

    def state_layout(self, lead):
        shape = (*lead, self.long_conv.num_channels, self.long_conv.max_kernel_length - 1)
        return {"kv_state": (shape, torch.float32)}

    def kernel(self, length):
        return self.long_conv(length)


def _modal_convolve(u, form: ModalKernel, skip, initial_state, return_state: bool):
    """``modal_scan`` of u (…, H', L) plus D·u, with the state (…, H', N) complex64 (None: zeros, not returned)."""
    lead, (count, length) = u.shape[:-2], u.shape[-2:]
    rows = math.prod(lead)
    state = None if initial_state is None else initial_state.reshape(rows, count, -1)  # (rows, H', N)
    y, final = modal_scan(u.reshape(rows, count, length), form, initial_state=state, return_final_state=return_state)
    y = y.reshape(u.shape) + skip.float()[:, None] * u  # (…, H', L)
    return y, None if final is None else final.reshape(*lead, count, -1)


def _modal_coefficients(form: ModalKernel, skip: torch.Tensor, prefix: str = "") -> MixerState:
    """What :func:`_modal_step` reads: ``form``'s :func:`~ssmhub.ops.modal.modal_step_coefficients` and the skip
    (H',), each name behind ``prefix``."""
    coefficients = {**modal_step_coefficients(form), "skip": skip.float()}
    return {prefix + name: value for name, value in coefficients.items()}


def _modal_step(u_t, coefficients: MixerState, state, prefix: str = ""):
    """One token of :func:`_modal_convolve` from :func:`_modal_coefficients`: u_t (…, H') -> (y_t like u_t,
    new state (…, H', N))."""
    lead, count = u_t.shape[:-1], u_t.shape[-1]
    rows = math.prod(lead)
    ours = {name[len(prefix) :]: value for name, value in coefficients.items() if name.startswith(prefix)}
    y, new_state = modal_step_with(u_t.reshape(rows, count), state.reshape(rows, count, -1), ours)
    return y.reshape(u_t.shape) + ours["skip"] * u_t, new_state.reshape(*lead, count, -1)


class DiagonalSSMConvolution(H3Convolution):
    """H3's diagonal SSM (:class:`~ssmhub.layers.diagonal_ssm.DiagonalSSMKernel`), trained by FFT with its
    materialized kernel and decoded with its modal state ``kv_state`` (…, H, N) complex64."""

    def __init__(self, long_conv: DiagonalSSMKernel):
        self.long_conv = long_conv

    @property
    def num_state_modes(self):
        return self.long_conv.state_size

    def single_modal_state(self):
        return "kv_state", ""

    def modal_form(self, heads=None, modes=None):
        """The SSM's own modal form, every head (``heads`` and ``modes`` are for a distilled layer)."""
        return self.long_conv.modal()

    def convolve(self, u, state, return_state):
        s, final = _modal_convolve(u, self.modal_form(), self.long_conv.skip, _entry(state, "kv_state"), return_state)
        return s, {"kv_state": final}

    def step_coefficients(self):
        return _modal_coefficients(self.modal_form(), self.long_conv.skip)

    def _step(self, u_t, state, coefficients):
        s, new = _modal_step(u_t, coefficients, state["kv_state"])
        return s, {"kv_state": new}

    def state_layout(self, lead):
        return {"kv_state": ((*lead, self.long_conv.num_heads, self.num_state_modes), torch.complex64)}

    def kernel(self, length):
        return modal_kernel(self.modal_form(), length)


class DistilledConvolution(H3Convolution):
    """A learned kernel distilled into modal form (:mod:`ssmhub.layers.h3_distillation`): each head's fit in
    ``modal`` (``head_modes`` modes of it), except the heads left exact (``exact_heads``), which keep their learned
    kernel and window of L_max − 1 inputs (state ``kv_window`` (…, H_exact, L_max − 1) float32).

    Heads of one order share one complex64 modal state (…, H_n, n) of exactly that width (:meth:`groups`), so no
    head's state is padded to the layer's largest order.
    """

    def __init__(self, long_conv: LongConvKernel, modal: ModalForm):
        self.long_conv = self.learned = long_conv
        self.modal = modal

    def head_split(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(indices of the modal heads, indices of the heads left exact)."""
        return self._layout()[0]

    def groups(self) -> list[tuple[str, int, torch.Tensor]]:
        """``(state name, order, head indices)`` per order the modal heads use, ascending: the state is
        ``kv_state`` when there is one order (a fully distilled layer), else ``kv_state_{order}`` per order."""
        return self._layout()[1]

    def _layout(self):
        """:meth:`head_split` and :meth:`groups`, read from the fit's buffers once and kept until a buffer changes
        (a new distillation, a load), so a decode step reads nothing back from the device."""
        if not can_keep(needs_grad=False):
            return self._read_layout()
        buffers = (self.modal.exact_heads, self.modal.head_modes)
        return kept(self, "_kept_layout", tensor_versions(buffers), self._read_layout)

    def _read_layout(self):
        exact = self.modal.exact_heads
        modal = (~exact).nonzero().flatten()
        modes = self.modal.head_modes[modal]
        orders = modes.unique().tolist()  # sorted
        groups = [
            ("kv_state" if len(orders) == 1 else f"kv_state_{order}", order, modal[modes == order]) for order in orders
        ]
        return (modal, exact.nonzero().flatten()), groups

    def single_modal_state(self):
        groups, (_, exact) = self.groups(), self.head_split()
        if len(groups) != 1 or exact.numel() or groups[0][2].numel() != self.long_conv.num_channels:
            return None
        return "kv_state", "kv_state."  # one order, every head modal (heads in order: the nonzero of a mask)

    @property
    def num_state_modes(self):
        """The most modes any modal head uses (0 when every head was left exact)."""
        modes = self.modal.head_modes[~self.modal.exact_heads]
        return int(modes.max()) if modes.numel() else 0

    def modal_form(self, heads=None, modes=None):
        """The fit of every head (all ``num_modes`` slots), or of ``heads`` cut to their first ``modes`` modes
        (default: :attr:`num_state_modes`)."""
        m = self.modal
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

    def convolve(self, u, state, return_state):
        s, parts = torch.empty_like(u, dtype=torch.float32), {}
        for name, order, heads in self.groups():
            form, skip = self.modal_form(heads, order), self.long_conv.skip[heads]
            s[..., heads, :], parts[name] = _modal_convolve(
                u[..., heads, :], form, skip, _entry(state, name), return_state
            )
        _, exact = self.head_split()
        if exact.numel():
            s[..., exact, :], parts["kv_window"] = causal_conv(
                u[..., exact, :],
                self.long_conv(self.long_conv.max_kernel_length)[exact],
                self.long_conv.skip[exact],
                initial_state=_entry(state, "kv_window"),
                return_final_state=return_state,
                state_length=self.long_conv.max_kernel_length - 1,
                backend=self.long_conv.fft_backend,
                block_size=self.long_conv.butterfly_block_size,
            )
        return s, parts

    def step_coefficients(self):
        """Per state ``name`` of :meth:`groups`: its heads (``name.heads``) and their modal coefficients
        (``name.lambda_re``, …); for the heads left exact, ``kv_window.heads``, their kernel and skip. The step
        reads its head layout from these alone, so a compiled step never reads the fit's buffers back."""
        coefficients = {}
        for name, order, heads in self.groups():
            coefficients[f"{name}.heads"] = heads
            coefficients.update(
                _modal_coefficients(self.modal_form(heads, order), self.long_conv.skip[heads], f"{name}.")
            )
        _, exact = self.head_split()
        if exact.numel():
            coefficients["kv_window.heads"] = exact
            coefficients["kv_window.kernel"] = self.long_conv(self.long_conv.max_kernel_length)[exact]
            coefficients["kv_window.skip"] = self.long_conv.skip[exact]
        return coefficients

    def _step(self, u_t, state, coefficients):
        s, parts = torch.empty_like(u_t, dtype=torch.float32), {}
        names = [key[: -len(".heads")] for key in coefficients if key.endswith(".heads")]
        for name in names:
            heads = coefficients[f"{name}.heads"]
            if name == "kv_window":
                kernel, skip = coefficients["kv_window.kernel"], coefficients["kv_window.skip"]
                s[..., heads], parts[name] = causal_conv_step(u_t[..., heads], state[name], kernel, skip)
            else:
                s[..., heads], parts[name] = _modal_step(u_t[..., heads], coefficients, state[name], f"{name}.")
        return s, parts

    def state_layout(self, lead):
        layout = {name: ((*lead, heads.numel(), order), torch.complex64) for name, order, heads in self.groups()}
        _, exact = self.head_split()
        if exact.numel():
            layout["kv_window"] = ((*lead, exact.numel(), self.long_conv.max_kernel_length - 1), torch.float32)
        return layout

    def kernel(self, length):
        """The modal heads' fitted kernels, the exact heads' learned ones."""
        modal, exact = self.head_split()
        device = self.modal.phase.device
        heads = self.long_conv.num_channels
        kernel = (
            self.long_conv(length).to(device).clone() if exact.numel() else torch.empty(heads, length, device=device)
        )
        if modal.numel():
            kernel[modal] = modal_kernel(self.modal_form(modal), length)
        return kernel
