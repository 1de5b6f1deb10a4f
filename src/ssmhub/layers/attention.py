"""Causal multi-head self-attention as a token mixer, for hybrid models (H3's attention layers).

It follows the ssmhub mixer protocol so a hybrid stack treats it like any recurrent mixer: its
state is the key/value cache of the tokens seen so far, ``{"key": (B, heads, T, d_head), "value":
(B, heads, T, d_head), "key_mask": (B, T)}``, kept in the same :class:`~ssmhub.cache.RecurrentCache`
(unlike a recurrent state it grows with the context, one key and value per token and layer).

By default there are no position embeddings: as in H3 (arXiv 2212.14052, §3.4; the hybrid's attention layers
use none), order comes from the recurrent layers around it. With ``rotary_emb_dim`` > 0 (:class:`AttentionOptions`)
queries and keys get rotary position embeddings (RoFormer, arXiv 2104.09864 §3.4.2, Eq. 34;
:mod:`ssmhub.ops.rotary`) right after the q/k/v projection, before attention, as flash-attn's ``MHA`` applies them
in the released H3 models: the first ``rotary_emb_dim`` features of each head, in flash-attn's default
(non-interleaved) layout unless ``rotary_emb_interleaved``. A whole forward from scratch puts its tokens at positions
0 .. L − 1 (padded ones included: left padding shifts a row's positions, and a rotary score depends only on the
difference of two positions); a cached forward or step continues at the positions its state has seen, and keys are
cached already rotated. The position of the next token is the state's ``position`` entry, (B,) int64, in the
growing state of a rotary layer (its key count no longer says it once a window drops old keys), and ``length`` in
a static state; a layer without rotary embeddings keeps the layout below unchanged. Packed rows keep positions
running along the row: a query never sees another document's keys, and within one document only differences
count. Padded keys (``mask == 0``) are never
attended to, so left padding changes nothing for the real tokens; a padded query attends only to
itself (its output is unused, but stays finite). Attention runs through
``torch.nn.functional.scaled_dot_product_attention`` (:func:`ssmhub.ops.attention.scaled_dot_product_attention`:
its math backend where the fused CPU kernel would crash).

With ``attention_window=W`` (:class:`AttentionOptions`) a token attends to the last W positions, itself
included, in a whole-sequence forward and in a cached one alike, and the state keeps only the last W − 1
keys and values: its size stops growing, so a hybrid runs through a whole book at flat memory, with the
same numbers as one forward over the book with the same window.

A static state (:meth:`CausalSelfAttention.static_state`) preallocates the keys and values of ``max_length``
tokens instead: ``{"key", "value": (B, heads, max_length, d_head), "key_mask": (B, max_length), "length":
(B,) int64}``, token t's key in slot t and ``length`` the tokens written so far. Every step then has the same
shapes and is a pure function of its inputs, so it compiles with ``torch.compile(fullgraph=True)`` and exports
(``torch.export``, ONNX); an empty slot is masked out, so the numbers are those of the growing state.
"""

from __future__ import annotations

import torch
from torch import nn

from ..ops.attention import scaled_dot_product_attention
from ..ops.rotary import rotary_embedding
from .attention_options import AttentionOptions
from .mixer import TokenMixer

__all__ = ["AttentionOptions", "CausalSelfAttention"]


class CausalSelfAttention(TokenMixer):
    """Multi-head causal self-attention with a key/value cache (:class:`~ssmhub.layers.mixer.TokenMixer`).

    Args:
        hidden_size: model width d.
        options: an :class:`AttentionOptions` (heads, dropout, window, rotary embeddings; or a config holding them);
            ``**values`` override single fields.
        bias: biases in the q/k/v and output projections.
    """

    # packed rows in one attention call on the whole row with a block-diagonal causal mask (a query sees the keys
    # of its own document only); the oracle is _forward_documents_stepwise
    native_packing = True

    def __init__(self, hidden_size: int, options: AttentionOptions | None = None, *, bias: bool = True, **values):
        super().__init__()
        options = AttentionOptions.take(options, **values)
        options.check_options(hidden_size)
        num_heads, self.dropout = options.attention_heads(hidden_size), options.attention_dropout
        self.attention_window = options.attention_window  # None: every earlier token
        self.rotary_emb_dim = options.rotary_emb_dim  # 0: no position embeddings
        self.rotary_emb_base, self.rotary_emb_interleaved = options.rotary_emb_base, options.rotary_emb_interleaved
        self.hidden_size, self.num_heads, self.head_dim = hidden_size, num_heads, hidden_size // num_heads
        self.qkv_proj = nn.Linear(hidden_size, 3 * hidden_size, bias=bias)
        self.out_proj = nn.Linear(hidden_size, hidden_size, bias=bias)

    def state_layout(self, batch_size: int, dtype=None):
        """``key``, ``value``: (B, heads, T, d_head) in the activations' dtype; ``key_mask``: (B, T) bool.
        T, the tokens kept so far, grows by one per token (0 before the first; at most W − 1 with a window).
        With rotary embeddings also ``position``: (B,) int64, the tokens seen so far (the next token's position)."""
        shape = (batch_size, self.num_heads, None, self.head_dim)
        kind = torch.get_default_dtype() if dtype is None else dtype
        layout = {"key": (shape, kind), "value": (shape, kind), "key_mask": ((batch_size, None), torch.bool)}
        if self.rotary_emb_dim:
            layout["position"] = ((batch_size,), torch.long)
        return layout

    def static_state(self, batch_size: int, max_length: int, device=None, dtype=None):
        """The state before the first token with room for ``max_length`` tokens (see the module docstring)."""
        if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
            raise ValueError(
                f"max_length must be a positive integer (the tokens the key/value buffer holds); got {max_length!r}"
            )
        if device is None:
            device = self.qkv_proj.weight.device
        kind = torch.get_default_dtype() if dtype is None else dtype
        buffer = torch.zeros(batch_size, self.num_heads, max_length, self.head_dim, dtype=kind, device=device)
        return {
            "key": buffer,
            "value": buffer.clone(),
            "key_mask": torch.zeros(batch_size, max_length, dtype=torch.bool, device=device),
            "length": torch.zeros(batch_size, dtype=torch.long, device=device),
        }

    def check_state(self, state, batch_size: int) -> None:
        """The growing layout of :meth:`state_layout`, or a static state (:meth:`static_state`) of any length."""
        if "length" not in state:
            return super().check_state(state, batch_size)
        slots = state["key"].shape[2] if state["key"].dim() == 4 else None
        expected = {
            "key": (batch_size, self.num_heads, slots, self.head_dim),
            "value": (batch_size, self.num_heads, slots, self.head_dim),
            "key_mask": (batch_size, slots),
            "length": (batch_size,),
        }
        got = {name: tuple(value.shape) for name, value in state.items()}
        if got != expected:
            raise ValueError(f"a static attention state must hold tensors of shapes {expected}; got {got}")

    def _forward(self, x, mask, state, return_state, rows=None):
        """x (B, L, d), mask (B, L) of the new tokens; ``state`` holds the earlier tokens' keys/values;
        ``rows`` (:class:`~ssmhub.layers.packing.PackedRows`) or None: the document starts of packed rows."""
        batch, length, _ = x.shape
        starts = None if rows is None else rows.starts  # (B, L) bool
        q, k, v = self.qkv_proj(x).chunk(3, dim=-1)
        # (B, L, d) -> (B, heads, L, d_head)
        q, k, v = (t.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        new_mask = (
            mask.to(torch.bool) if mask is not None else torch.ones(batch, length, dtype=torch.bool, device=x.device)
        )
        static = state is not None and "length" in state
        if static and starts is not None:
            raise ValueError("packed rows (document starts) cannot continue a static attention state")
        offset = None  # (B,) the tokens the state has seen: the first new token's position (rotary embeddings)
        if self.rotary_emb_dim:  # keys are rotated before they are cached, as flash-attn's cache holds them
            if state is not None:
                offset = state["length" if static else "position"]
            q, k = self._rotate(q, k, offset)
        if static:
            k, v, key_mask, query_pos = self._write_slots(state, k, v, new_mask)
            past = None
        else:
            if state is not None:
                k = torch.cat([state["key"].to(k.dtype), k], dim=2)
                v = torch.cat([state["value"].to(v.dtype), v], dim=2)
                key_mask = torch.cat([state["key_mask"], new_mask], dim=1)
            else:
                key_mask = new_mask
            past = k.shape[2] - length
            query_pos = torch.arange(past, past + length, device=x.device)[None, :, None]  # (1, L, 1)
        key_pos = torch.arange(k.shape[2], device=x.device)[None, None, :]  # (1, 1, T)
        allowed = (key_pos <= query_pos) & (key_mask[:, None, :] | (key_pos == query_pos))  # (B, L, T)
        if starts is not None:  # document d of a row is its tokens after d starts; the state's keys are document 0
            query_doc = starts.long().cumsum(1)  # (B, L)
            key_doc = torch.cat([query_doc.new_zeros(batch, past), query_doc], dim=1)  # (B, T)
            allowed = allowed & (key_doc[:, None, :] == query_doc[:, :, None])  # block-diagonal causal
            key_mask = key_mask & (key_doc == query_doc[:, -1:])  # what the row's last document may still see
        if self.attention_window is not None:  # the last W positions, the query's own included
            allowed = allowed & (key_pos > query_pos - self.attention_window)
        y = scaled_dot_product_attention(
            q, k, v, attn_mask=allowed[:, None], dropout_p=self.dropout if self.training else 0.0
        )  # (B, heads, L, d_head)
        y = self.out_proj(y.transpose(1, 2).flatten(2))  # (B, L, d)
        if static:
            new_state = {"key": k, "value": v, "key_mask": key_mask, "length": state["length"] + length}
        else:
            new_state = self._kept_state(k, v, key_mask) if return_state else None
            if new_state is not None and self.rotary_emb_dim:  # the next token's position
                seen = key_mask.new_zeros(batch, dtype=torch.long) if offset is None else offset
                new_state["position"] = seen + length
        return y, (new_state if return_state else None)

    def _rotate(self, q, k, offset):
        """q, k (B, heads, L, d_head) with rotary position embeddings at positions ``offset`` + 0 .. L − 1
        (``offset``: (B,) int64, the tokens a state has seen, or None: 0)."""
        positions = torch.arange(q.shape[2], device=q.device)  # (L,)
        if offset is not None:
            positions = offset[:, None] + positions  # (B, L)
        rotate = dict(
            rotary_dim=self.rotary_emb_dim, base=self.rotary_emb_base, interleaved=self.rotary_emb_interleaved
        )
        return rotary_embedding(q, positions, **rotate), rotary_embedding(k, positions, **rotate)

    def _write_slots(self, state, k, v, new_mask):
        """A static state with the L new keys, values and mask bits written to slots ``length .. length + L − 1``
        (out of place: a selection over the whole buffer, the same graph at every step). k, v: (B, heads, L, d_head).
        Nothing is read back from the device: the cache that holds the buffer refuses more tokens than it has
        slots before the forward (:meth:`ssmhub.cache.RecurrentCache.check_room`). Returns the buffers and the new
        tokens' positions (B, L, 1)."""
        slots, length = state["key"].shape[2], k.shape[2]  # the bound is checked on the host, where tokens enter
        start = state["length"][:, None]  # (B, 1)
        offset = torch.arange(slots, device=k.device)[None, :] - start  # (B, T): slot − length
        fresh = (offset >= 0) & (offset < length)  # (B, T): the slots of the new tokens
        index = offset.clamp(0, length - 1)  # (B, T): which new token a fresh slot takes
        gather = index[:, None, :, None].expand(-1, k.shape[1], -1, k.shape[3])  # (B, heads, T, d_head)
        where = fresh[:, None, :, None]
        key = torch.where(where, k.gather(2, gather), state["key"].to(k.dtype))
        value = torch.where(where, v.gather(2, gather), state["value"].to(v.dtype))
        key_mask = (fresh & new_mask.gather(1, index)) | (~fresh & state["key_mask"])  # (onnxruntime has no bool Where)
        query_pos = (start + torch.arange(length, device=k.device)[None, :])[:, :, None]  # (B, L, 1)
        return key, value, key_mask, query_pos

    def _kept_state(self, k, v, key_mask):
        """The keys/values a later token can attend to: all of them, or with a window W the last W − 1
        (a later token attends to itself and the W − 1 positions before it)."""
        if self.attention_window is None:
            return {"key": k, "value": v, "key_mask": key_mask}
        first = max(0, k.shape[2] - (self.attention_window - 1))
        return {"key": k[:, :, first:], "value": v[:, :, first:], "key_mask": key_mask[:, first:]}

    def _step(self, x_t, state, mask_t):
        """One token: its key and value appended to the state. O(T) per token."""
        y, new_state = self._forward(x_t.unsqueeze(1), None if mask_t is None else mask_t[:, None], state, True)
        return y[:, 0], new_state
