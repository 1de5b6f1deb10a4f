"""Document boundaries of packed rows, read from the arguments transformers' padding-free collators give.

``transformers.DataCollatorWithFlattening`` puts a batch's sequences back to back in one row and returns
``position_ids`` that restart at 0 for every sequence (by default), and optionally ``seq_idx`` (the sequence
each token belongs to) or the FlashAttention boundaries ``cu_seq_lens_q`` / ``cu_seq_lens_k`` (cumulative
lengths over the batch's tokens back to back, as transformers flattens a batch for varlen attention) with
``max_length_q`` / ``max_length_k`` (the longest sequence, a Python integer computed on the CPU in the collator).
The same names are what transformers' padding-free models (Bamba, Granite-MoE-hybrid)
accept. Any of them marks where a document starts; every mixer then restarts its state there
(:meth:`ssmhub.layers.mixer.TokenMixer.forward`'s ``document_starts``).

A packed training forward reads nothing back from the device: the boundaries' values are checked where a sequence
enters outside training (as the token ids are, :func:`~ssmhub.models.inputs.check_model_inputs`), and the sizes of
the batch of documents that mixers without a native packed form run (:class:`~ssmhub.layers.packing.PackedRows`)
come from ``max_length_q`` / ``max_length_k`` and the length of ``cu_seq_lens``; without them the first such layer
reads them, once per forward.
"""

from __future__ import annotations

import torch

from ..layers.packing import PackedRows

__all__ = ["PACKING_ARGUMENTS", "document_starts", "packing_arguments"]

PACKING_ARGUMENTS = ("position_ids", "seq_idx", "cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


def packing_arguments(kwargs: dict) -> dict:
    """The packed-row arguments among a head's keyword arguments, passed on to its backbone."""
    return {name: kwargs[name] for name in PACKING_ARGUMENTS if kwargs.get(name) is not None}


def document_starts(
    shape: tuple[int, int],
    mask: torch.Tensor | None,
    past_length: int,
    position_ids: torch.Tensor | None = None,
    seq_idx: torch.Tensor | None = None,
    cu_seq_lens_q: torch.Tensor | None = None,
    cu_seq_lens_k: torch.Tensor | None = None,
    max_length_q: int | None = None,
    max_length_k: int | None = None,
    restarts_with_cache: bool = False,
    read_values: bool = True,
    **_,
) -> PackedRows | None:
    """The packed rows' document starts, (B, L) bool, True where a document starts after a row's first real token,
    with the sizes of their batch of documents where the arguments give them; None when no row holds two documents
    (then the forward takes the plain path).

    A forward that continues a cache (``past_length`` > 0) is a decode step: a document start inside it is
    refused, unless ``restarts_with_cache`` (a training forward: truncated backpropagation through time,
    where a window carries each row's state on and a row may begin its next document anywhere). Then
    ``position_ids`` 0 at a row's *first* token also counts: that row starts fresh instead of continuing the
    cache (``seq_idx`` and ``cu_seq_lens`` cannot say that, so their first token always continues).
    ``read_values`` False (a training forward): shapes are checked, values are not read back (no refusal that
    needs them, and rows are taken as packed without asking whether any holds two documents).

    Args:
        shape: (B, L) of the new tokens. mask: (B, L) of the new tokens or None. past_length: tokens in the cache.
        position_ids: (B, L), restarting at 0 at each document (padding positions are ignored).
        seq_idx: (B, L) non-decreasing document index per row. cu_seq_lens_q / cu_seq_lens_k: (N + 1,) cumulative
            document lengths over the rows back to back, from 0 to B·L (every row starts a document); with
            ``position_ids`` they only size the batch of documents. max_length_q / max_length_k: the longest document
            (or a bound), a positive Python integer.
    """
    cu_seq_lens = cu_seq_lens_q if cu_seq_lens_q is not None else cu_seq_lens_k
    starts = None
    if position_ids is not None:
        starts = _starts_from_position_ids(position_ids, shape, mask, read_values and not past_length)
    elif seq_idx is not None:
        starts = _starts_from_seq_idx(seq_idx, shape, read_values)
    elif cu_seq_lens is not None:
        name = "cu_seq_lens_q" if cu_seq_lens_q is not None else "cu_seq_lens_k"
        starts = _starts_from_cu_seq_lens(cu_seq_lens, shape, name, read_values)
    if starts is None:
        return None
    count = _numel(cu_seq_lens) - 1 if cu_seq_lens is not None else None  # the batch's documents
    width = _positive_int(max_length_q, "max_length_q") or _positive_int(max_length_k, "max_length_k")
    real = torch.ones(shape, dtype=torch.bool, device=starts.device) if mask is None else mask.bool()
    first_real = real & (real.long().cumsum(1) == 1)
    if past_length and restarts_with_cache:
        marked = starts & real if position_ids is not None else starts & real & ~first_real
        return PackedRows(marked, count, width) if not read_values or marked.any() else None
    later = starts & real & ~first_real  # a start at a row's first real token changes nothing
    if past_length and later.any():
        raise ValueError(
            "position_ids restart at 0 inside a forward that continues a cache: a new document cannot start "
            "in the middle of a cached decode (start it in a fresh forward, without the cache; a model in "
            "training mode may, for truncated backpropagation through time)"
        )
    return PackedRows(later, count, width) if not read_values or later.any() else None


def _numel(cu_seq_lens) -> int:
    return cu_seq_lens.numel() if isinstance(cu_seq_lens, torch.Tensor) else len(cu_seq_lens)


def _positive_int(value, name: str) -> int | None:
    """``value`` (None or a positive Python integer: a host size, never read from a device)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive Python integer (the longest document); got {value!r}")
    return value


def _starts_from_position_ids(position_ids, shape, mask, read_values: bool) -> torch.Tensor:
    if tuple(position_ids.shape) != tuple(shape):
        raise ValueError(
            f"position_ids must have shape {tuple(shape)} (B, L of input_ids); got {tuple(position_ids.shape)}"
        )
    if read_values:
        real = torch.ones(shape, dtype=torch.bool, device=position_ids.device) if mask is None else mask.bool()
        first = real.long().argmax(1)  # each row's first real token
        has_real = real.any(1)
        first_positions = position_ids.gather(1, first[:, None])[:, 0]
        if (has_real & (first_positions != 0)).any():
            row = int((has_real & (first_positions != 0)).nonzero()[0, 0])
            raise ValueError(
                f"position_ids must be 0 at each row's first real token (a document starts there); row {row} "
                f"starts at {int(first_positions[row])}"
            )
    return position_ids == 0


def _starts_from_seq_idx(seq_idx, shape, read_values: bool) -> torch.Tensor:
    if tuple(seq_idx.shape) != tuple(shape):
        raise ValueError(f"seq_idx must have shape {tuple(shape)} (B, L of input_ids); got {tuple(seq_idx.shape)}")
    change = seq_idx[:, 1:] - seq_idx[:, :-1]
    if read_values and (change < 0).any():
        raise ValueError("seq_idx must be non-decreasing along each row (the document index of each token)")
    return torch.cat([torch.ones_like(seq_idx[:, :1], dtype=torch.bool), change > 0], dim=1)


def _starts_from_cu_seq_lens(cu_seq_lens, shape, name, read_values: bool) -> torch.Tensor:
    """Starts from cumulative lengths over the batch's rows back to back (B·L tokens, the way transformers
    flattens a batch for varlen attention); each row's first token must start a document."""
    batch_size, length = shape
    total = batch_size * length
    cu = (cu_seq_lens if isinstance(cu_seq_lens, torch.Tensor) else torch.tensor(cu_seq_lens)).flatten().long()
    if cu.numel() < 2 or (read_values and (int(cu[0]) != 0 or int(cu[-1]) != total or (cu[1:] <= cu[:-1]).any())):
        raise ValueError(f"{name} must increase strictly from 0 to the batch's B·L = {total} tokens; got {cu.tolist()}")
    starts = torch.zeros(total, dtype=torch.bool, device=cu.device)
    starts[cu[:-1]] = True
    starts = starts.view(batch_size, length)  # (B·L,) -> (B, L)
    if read_values and not bool(starts[:, 0].all()):
        raise ValueError(
            f"{name} must start a document at every row's first token (rows of {length}); got {cu.tolist()}"
        )
    return starts
