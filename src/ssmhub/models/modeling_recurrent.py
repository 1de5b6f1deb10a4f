"""Hugging Face model classes shared by every ssmhub family.

A family supplies its config class and a ``build_mixer(config, layer_idx)`` that returns a token
mixer following the ssmhub mixer protocol; everything else lives here once: the block stack,
the recurrent cache plumbing, the causal LM and classification heads, weight init that never
overwrites loaded weights, optimizer parameter groups and the remote-code bundle written by
``save_pretrained``.
"""

from __future__ import annotations

import math
import os
import re
from functools import partial

import torch
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.generation.configuration_utils import GenerationMode
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutputWithPast,
    CausalLMOutputWithPast,
    SequenceClassifierOutputWithPast,
    TokenClassifierOutput,
)

from ..cache import RecurrentCache
from ..ops.host_reads import are_free as host_reads_are_free
from ..rollback import run_with_rollback
from .cache_argument import CACHE_FIELD, resolve_cache_argument
from .cpu_linears import linears_on_cpu_gemm
from .generation import check_assisted_decoding_arguments, record_for_assisted_decoding, rollback_reach
from .inputs import check_generation_prompt, check_model_inputs, infer_padding_mask, pool_hidden_states
from .packed_inputs import document_starts, packing_arguments
from .static_decode import static_states

__all__ = [
    "RecurrentBlock",
    "RecurrentForCausalLM",
    "RecurrentForSequenceClassification",
    "RecurrentForTokenClassification",
    "RecurrentModel",
    "RecurrentPreTrainedModel",
]


class MLP(nn.Module):
    """Position-wise feed-forward map H -> intermediate -> H with a GELU, exact (``"gelu"``) or its tanh
    approximation (``"gelu_pytorch_tanh"``, ``config.hidden_act``)."""

    def __init__(self, hidden_size: int, intermediate_size: int, hidden_act: str = "gelu"):
        super().__init__()
        self.up_proj = nn.Linear(hidden_size, intermediate_size)
        self.down_proj = nn.Linear(intermediate_size, hidden_size)
        self.approximate = "tanh" if hidden_act == "gelu_pytorch_tanh" else "none"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.gelu(self.up_proj(x), approximate=self.approximate))


def build_norm(config) -> nn.Module:
    """The block stack's normalization: ``config.norm_type`` is ``"layernorm"`` or ``"rmsnorm"`` (Mamba's)."""
    if config.norm_type == "rmsnorm":
        return nn.RMSNorm(config.hidden_size, eps=config.layer_norm_epsilon)
    return nn.LayerNorm(config.hidden_size, eps=config.layer_norm_epsilon)


class RecurrentBlock(GradientCheckpointingLayer):
    """One residual block: a token mixer, then an optional MLP, each pre- or post-normed."""

    def __init__(self, config, mixer: nn.Module, residual: bool = True):
        super().__init__()
        self.prenorm = config.prenorm
        self.residual = residual  # False: the mixer's output replaces the stream (pre-norm only)
        self.mixer_norm = build_norm(config)
        self.mixer = mixer
        self.mlp = (
            MLP(config.hidden_size, config.intermediate_size, config.hidden_act) if config.intermediate_size else None
        )
        self.mlp_norm = build_norm(config) if self.mlp else None

    def forward(self, hidden_states, mask=None, state=None, return_state=False, document_starts=None):
        """(B, L, H) -> (B, L, H) and the mixer's new state (None unless ``return_state``); ``document_starts``
        (B, L) bool or :class:`~ssmhub.layers.packing.PackedRows` marks where a packed row's documents begin (every
        state restarts there)."""
        return self.forward_with(
            hidden_states, lambda x: self.mixer(x, mask, state, return_state, document_starts=document_starts)
        )

    def step_(self, hidden_states: torch.Tensor, state: dict[str, torch.Tensor], rows: torch.Tensor) -> torch.Tensor:
        """One token of every row, (B, 1, H) -> (B, 1, H), its mixer's state (B, ...) tensors updated in place by
        the mixer's one pass over them (:meth:`~ssmhub.layers.mixer.TokenMixer.step_rows_`, ``rows`` (B,) = 0..B-1):
        :meth:`forward`'s numbers on one token, without a new state to copy back."""
        new = torch.zeros_like(rows, dtype=torch.bool)  # every row continues its state
        return self.forward_with(
            hidden_states, lambda x: (self.mixer.step_rows_(x[:, 0], state, rows, new)[:, None], None)
        )[0]

    def forward_with(self, hidden_states, mix):
        """The block around ``mix``, a function (B, L, H) -> ((B, L, H), extra) that stands for the mixer's call:
        the norms, the residuals and the MLP as :meth:`forward` has them; returns (the block's output, extra). A
        serving engine's adapter (:mod:`ssmhub.serving`) runs it with mixer calls on the engine's state slots."""
        mixed, extra = mix(self.mixer_norm(hidden_states) if self.prenorm else hidden_states)
        if self.prenorm:
            hidden_states = hidden_states + mixed if self.residual else mixed
            if self.mlp is not None:
                hidden_states = hidden_states + self.mlp(self.mlp_norm(hidden_states))
        else:
            hidden_states = self.mixer_norm(hidden_states + mixed)
            if self.mlp is not None:
                hidden_states = self.mlp_norm(hidden_states + self.mlp(hidden_states))
        return hidden_states, extra


def _pytorch_default_init(module: nn.Linear | nn.Embedding) -> None:
    """torch.nn's own init (what ``reset_parameters`` does), through ``transformers.initialization`` so
    that weights just loaded from a checkpoint are left alone: Linear weights Kaiming-uniform with
    a = √5, i.e. U(±1/√fan_in), biases U(±1/√fan_in); Embedding N(0, 1) with a zero padding row."""
    if isinstance(module, nn.Linear):
        init.kaiming_uniform_(module.weight, a=math.sqrt(5))
        if module.bias is not None:
            bound = 1 / math.sqrt(module.in_features) if module.in_features > 0 else 0.0
            init.uniform_(module.bias, -bound, bound)
        return
    init.normal_(module.weight)
    if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
        init.zeros_(module.weight[module.padding_idx])


_HALF_DTYPES = (torch.float16, torch.bfloat16)


def _sparing_float32(fn, kept: dict[torch.dtype, set[int]]):
    """``fn`` (a tensor conversion given to ``nn.Module._apply``), except that a floating tensor whose id is in
    ``kept[dtype]`` goes to float32, not to the half-precision ``dtype`` that ``fn`` casts to. The target is
    read from ``fn`` applied to an empty tensor, so every caller of ``_apply`` is covered without parsing its
    arguments; a conversion that keeps the dtype (a device move, ``to_empty``) runs unchanged."""

    def apply(tensor: torch.Tensor) -> torch.Tensor:
        if tensor.is_floating_point() and any(id(tensor) in ids for ids in kept.values()):
            target = fn(tensor.new_empty(0))
            if target.dtype in kept and id(tensor) in kept[target.dtype]:
                return tensor.to(device=target.device, dtype=torch.float32)
        return fn(tensor)

    apply._spares_float32 = True
    return apply


class RecurrentPreTrainedModel(PreTrainedModel):
    """Base of every ssmhub model. A family subclass sets ``config_class`` and ``build_mixer``.

    Recurrence parameters live in a submodule named ``ssm`` inside each mixer: they stay float32
    when a checkpoint is loaded in half precision and when the model is cast to it
    (``model.to(torch.bfloat16)``, ``.half()``; see :meth:`_apply`), get no weight decay in
    :meth:`optimizer_param_groups`, and are initialized from that submodule's
    ``initial_parameter_values()`` through ``transformers.initialization``, which skips any
    parameter that was just loaded from a checkpoint. (The hook must sit on the module that owns
    the parameters: for custom code transformers skips modules without direct parameters.)
    """

    base_model_prefix = "backbone"
    _input_embed_layer = "embeddings"  # transformers' get/set_input_embeddings find it (heads via the backbone)
    supports_gradient_checkpointing = True
    _is_stateful = True
    _no_split_modules = ["RecurrentBlock"]
    _keep_in_fp32_modules_strict = ["ssm"]

    def __init__(self, config, *inputs, **kwargs):
        # a config edited after construction (``config.num_hidden_layers = 2``) is checked again here,
        # so that a bad one fails before any weight is built, never after training when it is saved
        config.check_fields()
        super().__init__(config, *inputs, **kwargs)

    def _apply(self, fn, recurse=True):
        """``nn.Module._apply`` (behind ``to``, ``half``, ``bfloat16``, ``type``, ``cuda``...) that keeps the
        modules of the float32 keep-lists in float32 when the rest is cast to float16 or bfloat16.

        transformers applies ``_keep_in_fp32_modules`` (float16 only) and ``_keep_in_fp32_modules_strict``
        (float16 and bfloat16) in ``from_pretrained(dtype=...)`` alone (``PreTrainedModel._get_dtype_plan``);
        a plain ``model.to(torch.bfloat16)`` cast everything, and recurrence parameters rounded to bf16
        change the outputs (see tests/conformance/test_precision.py). Here both paths give the same model:
        a kept tensor still moves to the new device but is cast to float32 instead of half precision.
        Casting a kept module itself (``model.backbone.layers[0].mixer.ssm.bfloat16()``) still rounds it.
        """
        if getattr(fn, "_spares_float32", False):  # already wrapped by an enclosing ssmhub model
            return super()._apply(fn, recurse)
        kept = {dtype: self._ids_kept_in_float32(dtype) for dtype in _HALF_DTYPES}
        return super()._apply(_sparing_float32(fn, kept), recurse)

    def _ids_kept_in_float32(self, dtype: torch.dtype) -> set[int]:
        """ids of the parameters, their gradients and the buffers that a load in ``dtype`` keeps in float32:
        transformers' rule (``_get_dtype_plan`` and ``core_model_loading``, 5.x): the keep-list names are
        regular expressions searched for in each tensor's name, ``_keep_in_fp32_modules`` for float16 only."""
        names = set(self._keep_in_fp32_modules_strict or ())
        if dtype == torch.float16:
            names |= set(self._keep_in_fp32_modules or ())
        if not names:
            return set()
        pattern = re.compile("|".join(name.replace("*", ".*") for name in sorted(names)))
        ids = set()
        for name, tensor in (*self.named_parameters(), *self.named_buffers()):
            if pattern.search(name):
                ids |= {id(tensor)} | ({id(tensor.grad)} if getattr(tensor, "grad", None) is not None else set())
        return ids

    def build_mixer(self, config, layer_idx: int) -> nn.Module:
        raise NotImplementedError(f"{type(self).__name__} must define build_mixer(config, layer_idx)")

    def _init_weights(self, module: nn.Module) -> None:
        if self.config.init_scheme == "pytorch" and isinstance(module, (nn.Linear, nn.Embedding)):
            _pytorch_default_init(module)
        else:
            super()._init_weights(module)
        if hasattr(module, "initial_parameter_values"):
            for name, value in module.initial_parameter_values().items():
                init.copy_(module.get_parameter(name), value)

    def optimizer_param_groups(
        self, weight_decay: float = 0.0, lr: float | None = None, recurrence_lr: float | None = None
    ) -> list[dict]:
        """Parameter groups for a torch optimizer.

        Weight decay applies to the matrices of linear maps only (``nn.Linear`` weights, and those a module lists
        in ``decayed_parameters``: maps written without ``nn.Linear``); biases, norms, embeddings (also when
        tied to the LM head) and the recurrence parameters (``*.ssm.*``) get none. The recurrence parameters get
        their own learning rate: ``recurrence_lr``, else ``config.recurrence_learning_rate``, else ``lr``.
        """
        decay, no_decay, recurrence = [], [], []
        embeddings = {id(m.weight) for m in self.modules() if isinstance(m, nn.Embedding)}
        linear_weights = {id(m.weight) for m in self.modules() if isinstance(m, nn.Linear)}
        listed = {id(getattr(m, name)) for m in self.modules() for name in getattr(m, "decayed_parameters", ())}
        linear_weights = (linear_weights | listed) - embeddings
        for name, param in self.named_parameters():
            if not param.requires_grad:
                continue
            if ".ssm." in f".{name}":
                recurrence.append(param)
            elif id(param) in linear_weights:
                decay.append(param)
            else:
                no_decay.append(param)
        recurrence_lr = recurrence_lr if recurrence_lr is not None else self.config.recurrence_learning_rate
        groups = [
            {"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
            {"params": recurrence, "weight_decay": 0.0},
        ]
        if lr is not None:
            for group in groups:
                group["lr"] = lr
        if recurrence_lr is not None:
            groups[2]["lr"] = recurrence_lr
        return [g for g in groups if g["params"]]

    _saves_code = False  # set by register_for_auto_class

    @classmethod
    def register_for_auto_class(cls, auto_class="AutoModel"):
        """As transformers: from now on ``save_pretrained`` and ``push_to_hub`` write the model's code and
        ``auto_map``. ssmhub bundles its tiered code itself (``remote_code.py``), all heads of the family at
        once, so transformers' flat copy of one module is not used and the class stays local code."""
        super().register_for_auto_class(auto_class)  # checks the name of the Auto class
        cls._auto_class = None
        cls._saves_code = True

    def save_pretrained(self, save_directory, *args, save_code: bool | None = None, **kwargs):
        """Save weights (safetensors) and config; with ``save_code``, also the model's code, so that the
        folder loads with ``trust_remote_code=True`` where ssmhub is not installed.

        ``save_code`` defaults to transformers' habit for custom models: on once the class is registered
        with :meth:`register_for_auto_class` (e.g. ``DLRForCausalLM.register_for_auto_class("AutoModelForCausalLM")``
        before ``push_to_hub``), else off. A folder without code is a plain transformers folder: its tokenizer
        loads with ``AutoTokenizer.from_pretrained(folder)`` and no remote-code prompt, and the model with
        ``from_pretrained`` after ``import ssmhub``. (transformers reads ``config.json`` before any tokenizer,
        so a folder whose ``auto_map`` names code asks for remote-code approval even for its tokenizer.)

        The config is checked first (``config.check_fields()``): one edited into an invalid state after
        the model was built raises a ValueError naming the field before anything is written, instead
        of saving a folder that ``from_pretrained`` refuses."""
        self.config.check_fields()
        if save_code is None:
            save_code = type(self)._saves_code
        save_code = save_code and kwargs.get("is_main_process", True) and __name__.startswith("ssmhub.")
        if not save_code:
            super().save_pretrained(save_directory, *args, **kwargs)
            return
        from .remote_code import push_saved_folder, write_remote_code

        push = kwargs.pop("push_to_hub", False)
        hub_options = {
            name: kwargs.pop(name) for name in ("repo_id", "commit_message", "create_pr", "private") if name in kwargs
        }
        super().save_pretrained(save_directory, *args, **kwargs)
        write_remote_code(type(self), os.fspath(save_directory))
        if push:  # after the code is written, so the upload carries it
            push_saved_folder(save_directory, token=kwargs.get("token"), **hub_options)


class RecurrentModel(RecurrentPreTrainedModel):
    """Embeddings, a stack of :class:`RecurrentBlock`, and a final norm (pre-norm models)."""

    def __init__(self, config):
        super().__init__(config)
        self.embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        last = config.num_hidden_layers - 1
        self.layers = nn.ModuleList(
            RecurrentBlock(config, self.build_mixer(config, idx), residual=idx < last or config.last_layer_residual)
            for idx in range(config.num_hidden_layers)
        )
        self.norm_f = build_norm(config) if config.prenorm else None
        self.gradient_checkpointing = False
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        cache: RecurrentCache | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        past_key_values: RecurrentCache | None = None,
        rollback: int = 0,
        **kwargs,
    ) -> BaseModelOutputWithPast | tuple:
        """Args follow transformers: ``cache`` (``past_key_values`` before transformers 5.24; either name
        is accepted) is a :class:`~ssmhub.cache.RecurrentCache` whose state the forward continues from
        (and updates when ``use_cache``, the default when a cache is given). In training mode this is
        truncated backpropagation through time: gradients flow through the window into the new states,
        which the cache keeps with their graph until ``cache.detach_()``, and ``position_ids`` 0 at any
        token, the first included, starts a row's next document from a fresh state. Packed rows (several
        documents back to back) are marked the way ``transformers.DataCollatorWithFlattening`` marks them:
        ``position_ids`` restarting at 0, or ``seq_idx``, or ``cu_seq_lens_q`` / ``cu_seq_lens_k``
        (:mod:`ssmhub.models.packed_inputs`); each document then runs as if alone. ``rollback``: with a
        recording cache (assisted decoding), how many of the new tokens a ``cache.crop`` may remove afterwards
        (:func:`ssmhub.rollback.run_with_rollback`)."""
        cache = resolve_cache_argument(cache, past_key_values)
        past_length = cache.get_seq_length() if cache is not None else 0
        check_model_inputs(  # token ids read once where a sequence enters, not per decode step or training batch
            input_ids,
            inputs_embeds,
            attention_mask,
            self.config.vocab_size,
            self.config.hidden_size,
            past_length,
            read_values=past_length == 0 and not self.training,
        )
        if use_cache is None:  # training forwards need no final state (computing it costs a matmul per layer)
            use_cache = cache is not None or (self.config.use_cache and not self.training)
        if self.gradient_checkpointing and self.training and cache is None:
            use_cache = False
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        return_dict = return_dict if return_dict is not None else self.config.return_dict

        hidden_states = self.embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        seq_len = hidden_states.shape[1]
        if use_cache and cache is not None:
            cache.check_room(seq_len)
        mask = attention_mask[:, -seq_len:] if attention_mask is not None else None  # (B, L) of the new tokens
        starts = document_starts(  # None: one document per row; values read outside training only, as the ids'
            hidden_states.shape[:2], mask, past_length, restarts_with_cache=self.training,
            read_values=not self.training, **kwargs,
        )  # fmt: skip
        if use_cache and cache is None:
            cache = RecurrentCache(len(self.layers))
        layers = partial(
            self._run_layers, use_cache=use_cache, starts=starts, output_hidden_states=output_hidden_states
        )
        hidden_states, layer_inputs = run_with_rollback(
            layers, hidden_states, mask, cache, use_cache=use_cache, packed=starts is not None, reach=rollback
        )
        if use_cache:
            cache.advance(seq_len)
        if self.norm_f is not None:
            hidden_states = self.norm_f(hidden_states)
        all_hidden_states = (*layer_inputs, hidden_states) if output_hidden_states else None

        cache_out = cache if use_cache else None
        if not return_dict:
            return tuple(v for v in (hidden_states, cache_out, all_hidden_states) if v is not None)
        return BaseModelOutputWithPast(
            last_hidden_state=hidden_states, hidden_states=all_hidden_states, **{CACHE_FIELD: cache_out}
        )

    def run_layers(
        self, hidden_states: torch.Tensor, states: list[dict[str, torch.Tensor]], mask: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, list[dict[str, torch.Tensor]]]:
        """The block stack as a pure function of a state: (B, L, H) inputs and one state dict per layer (the
        layers of :meth:`RecurrentCache.state_dict <ssmhub.cache.RecurrentCache.state_dict>`, or
        :meth:`static_cache`'s) -> the last block's output and the new states, with nothing written in place.
        What the exported decode step (:mod:`ssmhub.export`) runs between the embedding and the head."""
        states = _FunctionalStates(list(states))
        hidden_states, _ = self._run_layers(hidden_states, mask, states, True, None, False)
        return hidden_states, states.layers

    def _run_layers(self, hidden_states, mask, cache, use_cache, starts, output_hidden_states):
        """The blocks on (B, L, H) new tokens, each continuing from and updating its state in ``cache`` (its ``get``
        and ``update``; the caller counts the tokens). Returns the last block's output and, if asked, each block's
        input: the layer pass of :mod:`ssmhub.rollback`."""
        inputs = ()
        in_place = use_cache and _steps_in_place(cache, hidden_states, mask, starts)
        rows = torch.arange(hidden_states.shape[0], device=hidden_states.device) if in_place else None
        for idx, block in enumerate(self.layers):
            if output_hidden_states:
                inputs += (hidden_states,)
            state = cache.get(idx) if cache is not None else None
            if in_place and state is not None and block.mixer.steps_rows_in_one_pass:
                hidden_states = block.step_(hidden_states, state, rows)  # the cache's tensors, updated in place
                continue
            hidden_states, new_state = block(
                hidden_states, mask=mask, state=state, return_state=use_cache, document_starts=starts
            )
            if use_cache:
                cache.update(idx, new_state)
        return hidden_states, inputs


def _steps_in_place(cache, hidden_states: torch.Tensor, mask: torch.Tensor | None, starts) -> bool:
    """Whether a forward may step its mixers' states in place in ``cache`` (:meth:`RecurrentBlock.step_`): one
    token per row, every row's a real token continuing its document, no gradient, on a device where the one-pass
    kernels run and host reads are free (:func:`~ssmhub.ops.host_reads.are_free`: a CPU, nothing traced), and a
    :class:`~ssmhub.cache.RecurrentCache` that keeps no snapshots (a recording cache's rollback holds states by
    reference; :mod:`ssmhub.rollback`) and is not preallocated (a static cache is for a compiled step, which keeps
    the traced path)."""
    if not isinstance(cache, RecurrentCache) or cache.record_past or cache.is_compileable:
        return False
    if hidden_states.shape[1] != 1 or torch.is_grad_enabled() or starts is not None:
        return False
    return host_reads_are_free(hidden_states) and (mask is None or bool(mask[:, -1].all()))


class _FunctionalStates:
    """The two methods of :class:`~ssmhub.cache.RecurrentCache` the block stack calls (``get``, ``update``), over a
    list of state dicts: each block's new state is kept as the block returns it, nothing is written in place (what
    ``torch.export`` needs of a decode step whose states are its inputs and outputs)."""

    def __init__(self, layers: list[dict[str, torch.Tensor]]):
        self.layers = layers

    def get(self, idx: int) -> dict[str, torch.Tensor]:
        return self.layers[idx]

    def update(self, idx: int, state: dict[str, torch.Tensor]) -> None:
        self.layers[idx] = state


class RecurrentForCausalLM(RecurrentPreTrainedModel, GenerationMixin):
    """Language-model head (tied to the embeddings by default) over the family's backbone.

    Decoding goes through the recurrent cache: ``generate`` feeds one token per step and each
    mixer advances its state in O(1) time and memory. The cache is created by the first forward
    (``_supports_default_dynamic_cache`` is False) and reordered for beam search.
    """

    backbone_class: type[RecurrentModel] = None
    _tied_weights_keys = {"lm_head.weight": "backbone.embeddings.weight"}
    # transformers reads `_is_stateful` only to refuse assisted decoding, because a recurrent state cannot in
    # general be rewound; RecurrentCache can (exact rollback, see ssmhub.rollback), so the refusal is lifted here
    _is_stateful = False

    def __init__(self, config):
        super().__init__(config)
        self.backbone = self.backbone_class(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False

    def prepare_inputs_for_generation(
        self, input_ids: torch.LongTensor, *args, inputs_embeds: torch.Tensor | None = None, **kwargs
    ):
        """transformers' own, except that a first forward on a cache that already absorbed part of the prompt (a
        prefilled or loaded prompt cache) feeds only the rest: greedy decoding trims the prompt so before it gets
        here, but assisted and prompt-lookup decoding (transformers 5.24) pass all of it, and the cache would
        absorb the prompt twice. ``inputs_embeds`` is named so that ``generate(inputs_embeds=...)`` is accepted
        (transformers reads this signature): the prompt's embeddings feed the first forward, ids the rest.

        A forward on a cache gets the mask of its new tokens only: the states hold the earlier tokens (attention
        layers keep their own key mask), and a mask growing by one column per token would give each compiled
        decode step a new input shape (a recompilation per token where shapes are static)."""
        cache = kwargs.get(CACHE_FIELD)
        seen = cache.get_seq_length() if isinstance(cache, RecurrentCache) else 0
        if kwargs.get("is_first_iteration") and kwargs.get("next_sequence_length") is None:
            if 0 < seen < input_ids.shape[1]:
                kwargs["next_sequence_length"] = input_ids.shape[1] - seen
        inputs = super().prepare_inputs_for_generation(input_ids, *args, inputs_embeds=inputs_embeds, **kwargs)
        mask, fed = inputs.get("attention_mask"), inputs.get("input_ids")
        fed = fed if fed is not None else inputs.get("inputs_embeds")
        if seen and isinstance(mask, torch.Tensor) and mask.dim() == 2 and fed is not None:
            inputs["attention_mask"] = mask[:, -fed.shape[1] :]  # (B, L) of the fed tokens
        return inputs

    def _prepare_cache_for_generation(self, generation_config, model_kwargs, generation_mode, *args, **kwargs):
        """transformers' hook, plus the cache assisted decoding needs: a verifier must have one before its first
        forward (transformers builds one only for models with a default dynamic cache), and both the verifier's and
        an assistant's record, their crops replayed by the next forward (:func:`record_for_assisted_decoding`)."""
        super()._prepare_cache_for_generation(generation_config, model_kwargs, generation_mode, *args, **kwargs)
        assisted = generation_mode == GenerationMode.ASSISTED_GENERATION or generation_config.is_assistant
        if assisted and generation_config.use_cache is not False and model_kwargs.get(CACHE_FIELD) is None:
            model_kwargs[CACHE_FIELD] = RecurrentCache(self.config.num_hidden_layers)
        if assisted and model_kwargs.get(CACHE_FIELD) is not None:
            record_for_assisted_decoding(model_kwargs[CACHE_FIELD])

    def generate(self, inputs: torch.Tensor | None = None, *args, **kwargs):
        """transformers' ``generate``, with the inputs checked first: an empty prompt (``input_ids`` of shape
        (B, 0)) raises a ValueError naming ``input_ids`` instead of an IndexError from inside transformers, and
        assisted or prompt-lookup decoding with a bad ``prompt_lookup_num_tokens`` or an ``assistant_model`` of
        another vocabulary a ValueError naming it, before any decoding. The verifier's cache stops recording
        when ``generate`` returns, with the replay its last crop left done (ordinary decoding from it keeps no
        snapshots, and its states are those of the tokens it counts). On a CPU the linear maps run on oneDNN's
        matmul while it decodes (:func:`~ssmhub.models.cpu_linears.linears_on_cpu_gemm`), and a mixer with a
        one-pass kernel steps its state in the cache's own tensors (:meth:`RecurrentBlock.step_`)."""
        prompt = inputs if inputs is not None else kwargs.get("input_ids")
        check_generation_prompt(prompt, kwargs.get("inputs_embeds"), self.generation_config.bos_token_id)
        check_assisted_decoding_arguments(self, kwargs)
        with linears_on_cpu_gemm(self):
            result = super().generate(inputs, *args, **kwargs)
        config = kwargs.get("generation_config")
        if not getattr(config, "is_assistant", False):
            for cache in (kwargs.get(CACHE_FIELD), kwargs.get("past_key_values"), getattr(result, CACHE_FIELD, None)):
                if isinstance(cache, RecurrentCache):
                    cache.deactivate_past_recording()
        return result

    def static_cache(self, batch_size: int = 1, max_length: int = 2048) -> RecurrentCache:
        """A cache whose states are preallocated for ``batch_size`` rows and up to ``max_length`` tokens (prompt and
        generated ones; only attention layers need the bound) and updated in place: a decode step with it compiles
        with ``torch.compile(fullgraph=True)`` (``cache.is_compileable``). Use it with ``generate(..., cache=...)``;
        a ValueError names the argument for a bad size or a layer that cannot decode."""
        states = static_states(self, batch_size, max_length)
        bounded = any("key" in state for state in states)  # attention's slots; recurrent states have no bound
        return RecurrentCache.preallocated(states, max_length if bounded else None)

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        cache: RecurrentCache | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        past_key_values: RecurrentCache | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast | tuple:
        """``labels`` are the input ids (shifted inside the loss), or ``shift_labels`` (as transformers' loss takes
        them) each position's own target, e.g. a window's last token's target from the next window; ``-100`` is
        ignored. The loss goes
        through ``self.loss_function`` so that Trainer's ``num_items_in_batch`` keeps gradient
        accumulation exact."""
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        outputs = self.backbone(
            input_ids,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            cache=resolve_cache_argument(cache, past_key_values),
            use_cache=use_cache,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            rollback=rollback_reach(logits_to_keep, input_ids if input_ids is not None else inputs_embeds),
            **packing_arguments(kwargs),
        )
        hidden_states = outputs.last_hidden_state
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(hidden_states[:, keep])  # the model's dtype, as GPT-2's; losses upcast
        loss = None
        if labels is not None:
            if kwargs.get("shift_labels") is not None:  # transformers' loss views them flat: a window slice is not
                kwargs["shift_labels"] = kwargs["shift_labels"].contiguous()
            loss = self.loss_function(logits, labels, vocab_size=self.config.vocab_size, **kwargs)
        cache_out = getattr(outputs, CACHE_FIELD)
        if not return_dict:
            output = (logits, cache_out, outputs.hidden_states)
            output = tuple(v for v in output if v is not None)
            return (loss, *output) if loss is not None else output
        return CausalLMOutputWithPast(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, **{CACHE_FIELD: cache_out}
        )


class RecurrentForSequenceClassification(RecurrentPreTrainedModel):
    """Classification head over pooled hidden states (``config.classifier_pooling``), padding ignored."""

    backbone_class: type[RecurrentModel] = None

    def __init__(self, config):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.backbone = self.backbone_class(config)
        self.score = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> SequenceClassifierOutputWithPast | tuple:
        """Without an ``attention_mask``, padding is found from ``config.pad_token_id`` as transformers'
        classifiers do (:func:`~ssmhub.models.inputs.infer_padding_mask`), so a padded batch gives each row
        the logits it gets alone, for every pooling and also for the bidirectional families."""
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        attention_mask = infer_padding_mask(input_ids, attention_mask, inputs_embeds, self.config.pad_token_id)
        outputs = self.backbone(
            input_ids,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            use_cache=False,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        pooled = pool_hidden_states(outputs.last_hidden_state, attention_mask, self.config.classifier_pooling)
        logits = self.score(pooled)  # (B, num_labels), the model's dtype
        loss = None
        if labels is not None:
            # **kwargs carries Trainer's num_items_in_batch: the loss is then a sum over it (exact accumulation);
            # float32 logits, as transformers' LM and token losses upcast theirs (CUDA autocast would take the
            # log-softmax of bf16 logits in bf16)
            loss = self.loss_function(labels=labels, pooled_logits=logits.float(), config=self.config, **kwargs)
        if not return_dict:
            output = tuple(v for v in (logits, outputs.hidden_states) if v is not None)
            return (loss, *output) if loss is not None else output
        return SequenceClassifierOutputWithPast(loss=loss, logits=logits, hidden_states=outputs.hidden_states)


class RecurrentForTokenClassification(RecurrentPreTrainedModel):
    """A label per position (tagging, or per-prefix answers as in the regular-language tasks).

    The head is a linear map of each hidden state, or with ``config.classifier_intermediate_size`` > 0
    a ReLU MLP ``H -> classifier_intermediate_size -> num_labels`` (the head of the regular-language
    LRNN code, arXiv 2309.07412). Causal families give position t a prediction from tokens 0..t only.
    Labels of -100 (and padding, when labels mark it so) are ignored by the loss.
    """

    backbone_class: type[RecurrentModel] = None

    def __init__(self, config):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.backbone = self.backbone_class(config)
        hidden = getattr(config, "classifier_intermediate_size", 0) or 0
        if hidden:
            self.classifier = nn.Sequential(
                nn.Linear(config.hidden_size, hidden), nn.ReLU(), nn.Linear(hidden, config.num_labels)
            )
        else:
            self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> TokenClassifierOutput | tuple:
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        outputs = self.backbone(
            input_ids,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            use_cache=False,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            **packing_arguments(kwargs),
        )
        logits = self.classifier(outputs.last_hidden_state)  # (B, L, num_labels), the model's dtype
        loss = None
        if labels is not None:
            if labels.shape != logits.shape[:2]:
                raise ValueError(
                    f"labels must have shape {tuple(logits.shape[:2])} (batch, length); got {tuple(labels.shape)}"
                )
            loss = self.loss_function(logits, labels, self.config, **kwargs)
        if not return_dict:
            output = tuple(v for v in (logits, outputs.hidden_states) if v is not None)
            return (loss, *output) if loss is not None else output
        return TokenClassifierOutput(loss=loss, logits=logits, hidden_states=outputs.hidden_states)
