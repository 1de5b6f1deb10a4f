"""An ssmhub causal LM as a vLLM model: vLLM owns the requests, the batch and the state slots; ssmhub the math.

The model classes hold the family's own transformers model (built from the folder's config, its weights loaded by
name) and run it on vLLM's flat batch: embeddings, then each block's norms, residuals and MLP as the model has them
(:meth:`~ssmhub.models.modeling_recurrent.RecurrentBlock.forward_with`), with every mixer call going through
:class:`ServedMixer`, which reads the step's batch layout from vLLM's forward context and hands it to
:func:`~ssmhub.serving.flat_batch.mix_flat_batch`. Each mixer's state lives in vLLM's state slots, one byte page per
request (:class:`~ssmhub.serving.state_pages.StatePages`), so vLLM's scheduler counts it as it counts Mamba's; on a
CPU the model's linear maps run on vLLM's own GEMM (:mod:`~ssmhub.serving.engine_linear`), as its own models' do. An
H3 hybrid's attention layers run through vLLM's own ``Attention`` and its paged key/value cache
(:class:`ServedAttention`), on the layer's own projections. Both classes serve with vLLM's prefix caching
(``SupportsMambaPrefixCaching``): vLLM checkpoints a request's state pages at block boundaries and copies them whole
between slots; the model reads and writes only the slot vLLM names, as without it.

This module imports vLLM; :mod:`ssmhub.serving.vllm_plugin` registers it without importing it.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial

import torch
from torch import nn
from vllm.config import CompilationMode, VllmConfig, get_current_vllm_config
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.mamba.abstract import MambaBase
from vllm.model_executor.layers.mamba.mamba_utils import MambaStateCopyFuncCalculator
from vllm.model_executor.models.interfaces import HasInnerState, IsAttentionFree, IsHybrid, SupportsMambaPrefixCaching
from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum

from ..layers.attention import CausalSelfAttention
from ..layers.mixer import TokenMixer
from ..ops.rotary import rotary_embedding
from .engine_linear import use_engine_gemm
from .flat_batch import Decode, StepBatches, compiled_decode, decode_rows, mix_flat_batch
from .servable import recurrent_state_pages, served_model
from .state_pages import StatePages

__all__ = ["ServedAttention", "ServedMixer", "SsmhubForCausalLM", "SsmhubHybridForCausalLM"]


def _width(mixer: nn.Module) -> int:
    return getattr(mixer, "output_size", mixer.hidden_size)


def _decode_for(mixer: TokenMixer, vllm_config: VllmConfig) -> Decode:
    """The decode rows' function as vLLM's compilation setting asks: :func:`decode_rows` under ``enforce_eager``
    (mode NONE), else :func:`compiled_decode`. vLLM compiles the models it writes itself; this one it runs as it is."""
    return decode_rows if vllm_config.compilation_config.mode == CompilationMode.NONE else compiled_decode(mixer)


class ServedMixer(MambaBase, nn.Module):
    """One ssmhub recurrent mixer as a vLLM state-carrying layer: a byte page per request, the batch from the
    forward context. It owns no parameters: the mixer stays where the model has it (its weights load by the model's
    own names) and is held here outside the module tree."""

    def __init__(self, mixer: TokenMixer, dtype: torch.dtype, prefix: str, batches: StepBatches):
        super().__init__()
        object.__setattr__(self, "mixer", mixer)  # not a submodule: its parameters keep the model's names
        self.batches = batches  # each step's batch, shared by the model's layers
        self.decode = _decode_for(mixer, get_current_vllm_config())
        self.pages = StatePages.of(mixer, dtype)
        self.prefix = prefix
        self.kv_cache = (torch.tensor([]),)
        context = get_current_vllm_config().compilation_config.static_forward_context
        if prefix in context:
            raise ValueError(f"duplicate layer name: {prefix}")
        context[prefix] = self  # how vLLM's runner finds the layer and binds its state table

    def get_state_shape(self) -> tuple[tuple[int, ...], ...]:
        return ((self.pages.page_bytes,),)

    def get_state_dtype(self) -> tuple[torch.dtype, ...]:
        return (torch.uint8,)

    @property
    def mamba_type(self) -> MambaAttentionBackendEnum:
        return MambaAttentionBackendEnum.LINEAR  # its metadata: decode count, token offsets, seq_lens, slots

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None) -> tuple[torch.Tensor, None]:
        """x (1, T, H), the flat batch's tokens -> ((1, T, D_out), None), states read and written in their slots
        (``positions`` unread: order lives in the states)."""
        step = get_forward_context()
        metadata = step.attn_metadata
        if isinstance(metadata, dict):
            metadata = metadata.get(self.prefix)
        if metadata is None:  # vLLM's profiling run: no requests, no states
            return x.new_zeros(*x.shape[:2], _width(self.mixer)), None
        batch = self.batches.batch(
            step, metadata.num_decodes, metadata.query_start_loc, metadata.seq_lens, metadata.state_indices_tensor
        )  # read at the step's first layer
        table = self.kv_cache[0]
        tables = self.pages.views(table.view(table.shape[0], -1))  # (slots, page bytes), padding included
        return mix_flat_batch(self.mixer, x[0], batch, tables, self.decode)[None], None


class ServedAttention(nn.Module):
    """An ssmhub :class:`~ssmhub.layers.attention.CausalSelfAttention` with vLLM's paged attention in the middle:
    the layer's own q/k/v and output projections, softmax(QKᵀ/√d)·V over each request's keys (arXiv 1706.03762,
    §3.2.1). A layer with rotary embeddings (``rotary_emb_dim`` > 0) rotates q and k at each token's position in
    its request, vLLM's ``positions``, before they reach the paged cache: the keys are cached rotated, as the layer
    caches them in ``generate``."""

    def __init__(self, mixer: CausalSelfAttention, vllm_config: VllmConfig, prefix: str):
        super().__init__()
        object.__setattr__(self, "mixer", mixer)
        self.attention = Attention(
            mixer.num_heads,
            mixer.head_dim,
            scale=mixer.head_dim**-0.5,
            num_kv_heads=mixer.num_heads,
            cache_config=vllm_config.cache_config,
            prefix=prefix,
        )

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, None]:
        """x (1, T, H), positions (T,) -> ((1, T, H), None)."""
        q, k, v = self.mixer.qkv_proj(x[0]).chunk(3, dim=-1)  # (T, H) each: heads side by side
        if self.mixer.rotary_emb_dim:
            q, k = self._rotate(q, positions), self._rotate(k, positions)
        return self.mixer.out_proj(self.attention(q.contiguous(), k.contiguous(), v.contiguous()))[None], None

    def _rotate(self, t: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """(T, H) -> (T, H) with the layer's rotary embedding at ``positions`` (T,)."""
        mixer = self.mixer
        heads = t.unflatten(-1, (mixer.num_heads, mixer.head_dim)).transpose(0, 1)  # (heads, T, d_head)
        turned = rotary_embedding(
            heads, positions, mixer.rotary_emb_dim, mixer.rotary_emb_base, mixer.rotary_emb_interleaved
        )
        return turned.transpose(0, 1).flatten(1)  # (T, heads, d_head) -> (T, H)


class _ServedCausalLM(nn.Module):
    """What both model classes share: the family's model, one served layer per block, vLLM's model methods."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        if vllm_config.parallel_config.tensor_parallel_size != 1:
            raise ValueError("tensor_parallel_size must be 1: ssmhub models are served on one device")
        dtype = vllm_config.model_config.dtype
        self.served_model = served_model(vllm_config.model_config.hf_config, dtype)
        self.model = self.served_model.model
        self.served = []  # a plain list: the served layers own no weights of their own
        batches = StepBatches()  # each step's batch, read once for all layers
        for idx, block in enumerate(self.model.backbone.layers):
            name = f"{prefix}model.backbone.layers.{idx}.mixer"
            if isinstance(block.mixer, CausalSelfAttention):
                self.served.append(ServedAttention(block.mixer, vllm_config, name))
            else:
                self.served.append(ServedMixer(block.mixer, dtype, name, batches))

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.backbone.embeddings(input_ids)

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, **kwargs) -> torch.Tensor:
        """The flat batch's tokens (T,) and their positions in their requests (T,) -> hidden states (T, H); only
        rotary attention layers read the positions (a recurrent layer's order lives in its state)."""
        hidden = self.embed_input_ids(input_ids) if inputs_embeds is None else inputs_embeds
        hidden = hidden[None]  # (1, T, H): the flat batch as one row for the per-token parts of each block
        backbone = self.model.backbone
        for block, served in zip(backbone.layers, self.served):
            hidden, _ = block.forward_with(hidden, partial(served, positions=positions))
        if backbone.norm_f is not None:
            hidden = backbone.norm_f(hidden)
        return hidden[0]

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head(hidden_states).float()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """The folder's tensors by the model's own names (a transformers Mamba folder's mapped onto them); then,
        on a CPU, every linear map on the engine's GEMM (:func:`~ssmhub.serving.engine_linear.use_engine_gemm`)."""
        loaded = {f"model.{name}" for name in self.served_model.load_named_tensors(weights)}
        use_engine_gemm(self.served_model.model)
        return loaded

    @classmethod
    def get_mamba_state_copy_func(cls):
        """How vLLM's prefix caching copies a layer's state between slots (a checkpoint into a request's slot, a
        running state into the block it moves on to): the byte page copied whole."""
        return MambaStateCopyFuncCalculator.linear_attention_state_copy_func()


class SsmhubForCausalLM(_ServedCausalLM, HasInnerState, IsAttentionFree, SupportsMambaPrefixCaching):
    """vLLM's model class for the attention-free ssmhub causal LMs (and transformers Mamba folders on a CPU)."""


class SsmhubHybridForCausalLM(_ServedCausalLM, HasInnerState, IsHybrid, SupportsMambaPrefixCaching):
    """vLLM's model class for H3: recurrent layers in state slots, attention layers in vLLM's paged cache."""

    @classmethod
    def get_mamba_state_shape_from_config(cls, vllm_config: VllmConfig) -> tuple[tuple[int, ...], ...]:
        pages = recurrent_state_pages(vllm_config.model_config.hf_config, vllm_config.model_config.dtype)
        return ((pages.page_bytes,),)

    @classmethod
    def get_mamba_state_dtype_from_config(cls, vllm_config: VllmConfig) -> tuple[torch.dtype, ...]:
        return (torch.uint8,)
