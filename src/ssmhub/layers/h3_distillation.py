"""Distilling an H3 layer's learned long kernels into modal form, for decoding with a state independent of the context.

H3 (arXiv 2212.14052 §3) mixes kv with a diagonal SSM, decoded in O(N) per channel; the long-conv paper
(arXiv 2302.06646 §3.1) replaces it by an explicit kernel of L_max taps, whose exact decode keeps a window of the
last L_max − 1 inputs (it has no smaller exact state: its Prop. 2, App. D.2). Distilling fits each head's learned
kernel (all L_max regularized taps) with N complex exponentials (:func:`ssmhub.ops.modal.fit_modal_kernels`, a
thread per CPU core: :mod:`ssmhub.ops.modal_threads`), a diagonal SSM again. With a tolerance each head gets the
smallest order of a ladder ``1, 2, 4, …, num_modes`` that meets it, and a head that no order within the budget
fits stays exact (error-aware distillation, the order chosen per filter as in LaughingHyena, arXiv 2310.18780
§3.2).

:class:`HeadFits` fits and chooses, :class:`ModalForm` holds the result as buffers of the layer (its submodule
``ssm``), and :class:`~ssmhub.layers.h3_convolutions.DistilledConvolution` computes with it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..ops.modal import ModalKernel, max_modes
from ..ops.modal_threads import fit_modal_kernels_threaded

__all__ = ["DistillationReport", "HeadFits", "ModalForm", "check_distill_request"]

PADDING_LOG_MODULUS = -0.6931471805599453  # log 0.5: an unused mode slot is a harmless pole 0.5 with zero residue


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
    """What :meth:`H3Mixer.distill <ssmhub.layers.h3.H3Mixer.distill>` did to one layer (per head tensors are
    (H,) on the CPU).

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


def check_distill_request(max_kernel_length: int, num_modes, tolerance, method) -> None:
    """Raise a ValueError for a bad request, before any fitting."""
    if isinstance(num_modes, bool) or not isinstance(num_modes, int) or num_modes < 1:
        raise ValueError(f"num_modes must be an integer >= 1; got {num_modes!r}")
    limit = max_modes(max_kernel_length, method=method)  # also checks method
    if num_modes > limit:
        raise ValueError(f"num_modes={num_modes} is too large for L_max {max_kernel_length}: at most {limit}")
    if tolerance is not None and (
        isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not 0 < tolerance < 1
    ):
        raise ValueError(f"tolerance must be a relative L2 error in (0, 1) or None; got {tolerance!r}")


@dataclass
class HeadFits:
    """The modal fits of every order tried, and the order each head keeps.

    Attributes:
        fits: one :class:`~ssmhub.ops.modal.ModalKernel` per order, every head fitted at that order.
        orders: the orders tried, ascending.
        errors: (orders, H) relative L2 error of each fit.
        choice: (H,) index into ``orders`` of each head's order: the first that meets the tolerance, else the last.
        exact: (H,) bool, the heads no order fits within the tolerance (left on exact decoding).
    """

    fits: list[ModalKernel]
    orders: list[int]
    errors: torch.Tensor
    choice: torch.Tensor
    exact: torch.Tensor

    @classmethod
    def fit(
        cls, learned: torch.Tensor, num_modes: int, tolerance: float | None, method: str, eigensolver: str = "truncated"
    ) -> HeadFits:
        """Fit the (H, L_max) ``learned`` kernels: at ``num_modes`` alone without a tolerance, else at each order of
        ``1, 2, 4, …`` up to ``num_modes`` (and ``num_modes`` itself). Every order shares one Hankel basis (the
        ``2·num_modes`` leading eigenvectors, by ``eigensolver``: see :func:`ssmhub.ops.modal.fit_modal_kernel`)."""
        ladder = {1 << k for k in range(num_modes.bit_length())} | {num_modes}
        orders = [num_modes] if tolerance is None else sorted(n for n in ladder if n <= num_modes)
        fits = fit_modal_kernels_threaded(learned, orders, method, eigensolver=eigensolver)  # on every CPU core
        errors = torch.stack([f.relative_error for f in fits])  # (orders, H)
        meets = errors <= (tolerance if tolerance is not None else float("inf"))
        choice = torch.where(meets.any(0), meets.to(torch.int8).argmax(0), len(orders) - 1)  # (H,): first order met
        return cls(fits, orders, errors, choice, ~meets.any(0))

    def head_orders(self) -> torch.Tensor:
        """(H,) the order each head keeps, 0 for a head left exact."""
        return torch.tensor(self.orders, device=self.choice.device)[self.choice].masked_fill(self.exact, 0)

    def store(self, form: ModalForm) -> None:
        """Copy head h's fit at order ``orders[choice[h]]`` into the first slots of ``form``'s (H, N) buffers."""
        device = form.phase.device
        for name in ("log_modulus", "phase", "residues"):
            getattr(form, name).zero_()
        form.log_modulus.fill_(PADDING_LOG_MODULUS)
        for i, (fit, order) in enumerate(zip(self.fits, self.orders)):
            heads = (self.choice == i).nonzero().flatten()
            for name, value in (("log_modulus", fit.log_modulus), ("phase", fit.phase), ("residues", fit.residues)):
                getattr(form, name)[heads.to(device), :order] = value[heads].to(device)
            for name, value in (("direct", fit.d), ("relative_error", fit.relative_error)):
                getattr(form, name)[heads.to(device)] = value[heads].to(device)
        form.head_modes.copy_(self.head_orders())
        form.exact_heads.copy_(self.exact)

    def report(self, state_bytes: int, exact_state_bytes: int) -> DistillationReport:
        """The :class:`DistillationReport` of these fits, given the layer's decode state sizes after and before."""
        return DistillationReport(
            orders=self.head_orders(),
            errors=torch.where(self.exact, 0.0, self.errors.gather(0, self.choice[None])[0]),
            fit_errors=self.errors.min(0).values,
            exact_heads=self.exact.nonzero().flatten().tolist(),
            state_bytes=state_bytes,
            exact_state_bytes=exact_state_bytes,
        )
