"""An ssmhub causal LM as a vLLM model: vLLM owns the requests, the batch and the state slots; ssmhub the math.

:class:`SsmhubForCausalLM` holds the family's own transformers model (built from the folder's config, its weights
loaded by name) and runs it on vLLM's flat batch: embeddings, then each block's norms, residuals and MLP as the
model has them (:meth:`~ssmhub.models.modeling_recurrent.RecurrentBlock.forward_with`), with every mixer call going
through :class:`ServedMixer`, which reads the step's batch layout from vLLM's forward context and hands it to
:func:`~ssmhub.serving.flat_batch.mix_flat_batch`. Each mixer's state lives in vLLM's state slots, one byte page per
request (:class:`~ssmhub.serving.state_pages.StatePages`), so vLLM's scheduler counts it as it counts Mamba's.

This module imports vLLM; :mod:`ssmhub.serving.vllm_plugin` registers it without importing it.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from vllm.config import VllmConfig, get_current_vllm_config
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.mamba.abstract import MambaBase
from vllm.model_executor.models.interfaces import HasInnerState, IsAttentionFree
from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum

from ..layers.mixer import TokenMixer
from .flat_batch import FlatBatch, mix_flat_batch
from .servable import served_model
from .state_pages import StatePages

__all__ = ["ServedMixer", "SsmhubForCausalLM"]


class ServedMixer(MambaBase, nn.Module):
    """One ssmhub mixer as a vLLM state-carrying layer: a byte page per request, the batch from the forward context.

    It owns no parameters: the mixer stays where the model has it (its weights load by the model's own names) and is
    held here outside the module tree."""

    def __init__(self, mixer: TokenMixer, dtype: torch.dtype, prefix: str):
        super().__init__()
        object.__setattr__(self, "mixer", mixer)  # not a submodule: its parameters keep the model's names
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

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        """x (1, T, H), the flat batch's tokens -> ((1, T, D_out), None), states read and written in their slots."""
        metadata = get_forward_context().attn_metadata
        if isinstance(metadata, dict):
            metadata = metadata.get(self.prefix)
        width = getattr(self.mixer, "output_size", self.mixer.hidden_size)
        if metadata is None:  # vLLM's profiling run: no requests, no states
            return x.new_zeros(*x.shape[:2], width), None
        batch = FlatBatch.from_offsets(
            metadata.num_decodes, metadata.query_start_loc, metadata.seq_lens, metadata.state_indices_tensor
        )
        tables = self.pages.views(self.kv_cache[0].view(self.kv_cache[0].shape[0], -1))
        return mix_flat_batch(self.mixer, x[0], batch, tables)[None], None


class SsmhubForCausalLM(nn.Module, HasInnerState, IsAttentionFree):
    """vLLM's model class for every attention-free ssmhub causal LM (and transformers Mamba folders on a CPU)."""

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        dtype = vllm_config.model_config.dtype
        if vllm_config.parallel_config.tensor_parallel_size != 1:
            raise ValueError("tensor_parallel_size must be 1: ssmhub models are served on one device")
        self.served_model = served_model(vllm_config.model_config.hf_config, dtype)
        self.model = self.served_model.model
        backbone = self.model.backbone
        self.served = [
            ServedMixer(block.mixer, dtype, f"{prefix}model.backbone.layers.{idx}.mixer")
            for idx, block in enumerate(backbone.layers)
        ]

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.backbone.embeddings(input_ids)

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, **kwargs) -> torch.Tensor:
        """The flat batch's tokens (T,) -> hidden states (T, H); ``positions`` are not read (no position
        embeddings: order lives in the states)."""
        hidden = self.embed_input_ids(input_ids) if inputs_embeds is None else inputs_embeds
        hidden = hidden[None]  # (1, T, H): the flat batch as one row for the per-token parts of each block
        backbone = self.model.backbone
        for block, served in zip(backbone.layers, self.served):
            hidden, _ = block.forward_with(hidden, served)
        if backbone.norm_f is not None:
            hidden = backbone.norm_f(hidden)
        return hidden[0]

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head(hidden_states).float()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """The folder's tensors by the model's own names (a transformers Mamba folder's mapped onto them)."""
        loaded = self.served_model.load_named_tensors(weights)
        return {f"model.{name}" for name in loaded}

