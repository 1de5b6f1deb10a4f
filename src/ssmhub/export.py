"""Export a causal LM's one-token decode step, state in and state out, to run outside Python.

A recurrent model decodes with a fixed set of state tensors, so its decode step is a pure function

    ``decode_step(input_ids (B, 1) int64, *states) -> (logits (B, vocab) float32, *new_states)``

that :func:`export_decode_step` turns into a ``torch.export.ExportedProgram`` and :func:`export_decode_step_onnx`
into an ONNX file (``torch.onnx.export(..., dynamo=True)``). The ONNX graph names no device, so it is traced from a
copy of the model on the CPU, whatever device the model lives on: a GPU's kernels have no ONNX function (CUDA runs
``F.rms_norm`` as ``aten._fused_rms_norm``, which the exporter neither translates nor decomposes). The signature,
fixed at export:

- ``input_ids``: (B, 1) int64, the next token of every row (every token is real: there is no padding mask);
- the states, in the cache's one format (:meth:`ssmhub.cache.RecurrentCache.state_dict`, the format of prompt
  caches and stateful checkpoints too): named by its keys ``layers.<i>.<field>``, in its order (layer by layer,
  each layer's fields in the order of its mixer's state layout); outputs ``new.layers.<i>.<field>``, same order
  and shapes; :func:`decode_state_specs` lists them. A complex state crosses the boundary as its real view
  (``torch.view_as_real``: a real dtype with a last dimension of 2, real and imaginary parts), whichever layer
  holds it. An attention layer of a hybrid holds a key/value buffer of ``max_length`` tokens, its mask and its
  ``length`` (B,) int64, the tokens written so far
  (:meth:`ssmhub.layers.attention.CausalSelfAttention.static_state`); recurrent layers do not depend on it.
  The cache's ``seen_tokens`` is not carried (no layer reads it).
- ``logits``: (B, vocab) float32, the next-token logits after ``input_ids``.

:func:`initial_decode_states` gives the states before the first token. A prompt is prefilled by feeding its
tokens one at a time (:func:`greedy_decode` does it, then decodes greedily), with any step function:
:func:`program_step` for an ``ExportedProgram``, :func:`onnx_step` for an ``onnxruntime.InferenceSession``.
The numbers are the eager model's decode steps (tests/test_export.py holds them to ``generate``).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .cache import RecurrentCache
from .models.static_decode import check_static_decode, static_states

__all__ = [
    "DecodeStep",
    "StateSpec",
    "decode_state_specs",
    "export_decode_step",
    "export_decode_step_onnx",
    "greedy_decode",
    "initial_decode_states",
    "onnx_step",
    "program_step",
]

StepFunction = Callable[[torch.Tensor, list[torch.Tensor]], tuple[torch.Tensor, list[torch.Tensor]]]


@dataclass(frozen=True)
class StateSpec:
    """One state tensor of the exported step: its input name (a key of the cache's state dict), layer, field, shape
    and dtype at the boundary, and whether the mixer holds it complex (then the boundary tensor is its real view)."""

    name: str
    layer: int
    field: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    is_complex: bool


def _boundary(tensor: torch.Tensor) -> torch.Tensor:
    """A state tensor as it crosses the boundary: complex -> its real view (..., 2)."""
    return torch.view_as_real(tensor) if tensor.is_complex() else tensor


def _initial_states(model, batch_size: int, max_length: int, device=None) -> dict[str, torch.Tensor]:
    """The states before the first token as the cache's state dict has them (``layers.<i>.<field>``, in its order;
    ``device``: default the model's), ``seen_tokens`` left out (no layer reads it; attention counts its own)."""
    cache = RecurrentCache(len(model.backbone.layers))
    cache.layers = static_states(model, batch_size, max_length, device=device)
    return {name: tensor for name, tensor in cache.state_dict().items() if name != "seen_tokens"}


def decode_state_specs(model, batch_size: int = 1, max_length: int = 2048) -> list[StateSpec]:
    """The states of the exported step, in input (and output) order. ``max_length``: the most tokens (prompt and
    generated) a row decodes; only attention layers depend on it."""
    specs = []
    for name, tensor in _initial_states(model, batch_size, max_length, device="meta").items():
        _, layer, field = name.split(".", 2)  # layers.<i>.<field>
        view = _boundary(tensor)
        specs.append(StateSpec(name, int(layer), field, tuple(view.shape), view.dtype, tensor.is_complex()))
    return specs


def initial_decode_states(model, batch_size: int = 1, max_length: int = 2048) -> list[torch.Tensor]:
    """The states before the first token, in the order of :func:`decode_state_specs`, on the model's device."""
    return [_boundary(t).contiguous() for t in _initial_states(model, batch_size, max_length).values()]


class DecodeStep(nn.Module):
    """The decode step of an ssmhub causal LM as a pure function of flat tensors (see the module docstring).

    Args:
        model: an ssmhub ``...ForCausalLM`` (its weights are shared, not copied).
        batch_size, max_length: the shapes the states are laid out for (:func:`decode_state_specs`).
    """

    def __init__(self, model, batch_size: int = 1, max_length: int = 2048):
        super().__init__()
        check_static_decode(model, batch_size, max_length)
        self.model = model
        self.specs = decode_state_specs(model, batch_size, max_length)
        self.batch_size, self.max_length = batch_size, max_length

    def forward(self, input_ids: torch.Tensor, *states: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if len(states) != len(self.specs):
            raise ValueError(f"the step takes {len(self.specs)} state tensors after input_ids; got {len(states)}")
        backbone = self.model.backbone
        named = {spec.name: torch.view_as_complex(t) if spec.is_complex else t for spec, t in zip(self.specs, states)}
        cache = RecurrentCache.from_state_dict(named, len(backbone.layers))
        hidden = backbone.embeddings(input_ids)  # (B, 1, H)
        hidden, layers = backbone.run_layers(hidden, cache.layers)
        if backbone.norm_f is not None:
            hidden = backbone.norm_f(hidden)
        logits = self.model.lm_head(hidden[:, -1]).float()  # (B, vocab)
        # out by each spec's layer and field: state_dict() detaches, and ONNX has no detach of a complex tensor
        return (logits, *(_boundary(layers[spec.layer][spec.field]) for spec in self.specs))

    def example_inputs(self) -> tuple[torch.Tensor, ...]:
        """Inputs to trace with: token 0 and the states before the first token."""
        ids = torch.zeros(self.batch_size, 1, dtype=torch.long, device=self.model.device)
        return (ids, *initial_decode_states(self.model, self.batch_size, self.max_length))

    def input_names(self) -> list[str]:
        return ["input_ids", *(spec.name for spec in self.specs)]

    def output_names(self) -> list[str]:
        return ["logits", *(f"new.{spec.name}" for spec in self.specs)]


def export_decode_step(model, batch_size: int = 1, max_length: int = 2048) -> torch.export.ExportedProgram:
    """``torch.export.export`` of :class:`DecodeStep`: call ``program.module()(input_ids, *states)``. The model
    is put in eval mode (no dropout). A ValueError names the argument for a model that is not an ssmhub causal LM,
    a layer that cannot decode (a bidirectional one) or a bad size, before anything is traced."""
    step = DecodeStep(model, batch_size, max_length).eval()  # the wrapper too: no dropout, no training-mode warning
    with torch.no_grad():
        return torch.export.export(step, step.example_inputs())


def _cpu_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` on the CPU; the caller's model keeps its device and mode. Parameters and buffers are
    copied to the CPU one by one (a CPU one is shared, not copied): a model on a GPU is not duplicated there."""
    tensors = [*model.parameters(), *model.buffers()]
    if any(t.is_meta for t in tensors):
        raise ValueError("model is on the meta device: it holds no weights to export; load them first")
    memo = {}
    for t in tensors:
        held = t.detach().cpu()
        memo[id(t)] = nn.Parameter(held, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else held
    return copy.deepcopy(model, memo)


def export_decode_step_onnx(
    model, path: str | os.PathLike, batch_size: int = 1, max_length: int = 2048, opset_version: int | None = None
) -> Path:
    """Write the decode step to the ONNX file ``path`` (``torch.onnx.export(..., dynamo=True)``), inputs and outputs
    named as :meth:`DecodeStep.input_names` / :meth:`DecodeStep.output_names`. Traced on a CPU copy of the model
    (see the module docstring), in eval mode; ``model`` is left on its device and in its mode. Written under a
    temporary name and renamed into place. Returns the path. A ValueError names a bad argument, or a model on the
    meta device (no weights), before anything is traced."""
    path = Path(path)
    if path.suffix != ".onnx":
        raise ValueError(f"path must name an .onnx file; got {str(path)!r}")
    check_static_decode(model, batch_size, max_length)  # before the copy
    step = DecodeStep(_cpu_copy(model), batch_size, max_length).eval()  # no dropout, no training-mode warning
    kwargs = {} if opset_version is None else {"opset_version": opset_version}
    with torch.no_grad(), torch.device("cpu"):  # factories that name no device too, whatever the default device
        program = torch.onnx.export(
            step,
            step.example_inputs(),
            dynamo=True,
            input_names=step.input_names(),
            output_names=step.output_names(),
            verbose=False,
            **kwargs,
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    program.save(str(partial))
    os.replace(partial, path)
    return path


def program_step(program: torch.export.ExportedProgram) -> StepFunction:
    """A step function ``(input_ids, states) -> (logits, states)`` running an exported program."""
    module = program.module()

    def step(input_ids: torch.Tensor, states: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        logits, *new_states = module(input_ids, *states)
        return logits, new_states

    return step


def onnx_step(session) -> StepFunction:
    """A step function ``(input_ids, states) -> (logits, states)`` running an ``onnxruntime.InferenceSession`` of
    the exported file (torch tensors in and out, numpy in between; what comes out is on ``input_ids``' device)."""
    names = [i.name for i in session.get_inputs()]

    def step(input_ids: torch.Tensor, states: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        feeds = {name: t.detach().cpu().numpy() for name, t in zip(names, (input_ids, *states))}
        logits, *new_states = (torch.from_numpy(a).to(input_ids.device) for a in session.run(None, feeds))
        return logits, new_states

    return step


def greedy_decode(
    step: StepFunction, prompt: torch.Tensor, states: Sequence[torch.Tensor], max_new_tokens: int
) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """Prefill ``prompt`` (B, P) token by token through ``step``, then pick ``max_new_tokens`` tokens greedily.

    Returns ``(tokens (B, max_new_tokens), the logits (B, vocab) each token was picked from, the states after the
    last token fed)``; as ``generate(do_sample=False)`` without an end-of-sequence token.
    """
    if prompt.dim() != 2 or prompt.shape[1] < 1:
        raise ValueError(f"prompt must have shape (B, P) with P >= 1; got {tuple(prompt.shape)}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive integer; got {max_new_tokens!r}")
    states = list(states)
    for t in range(prompt.shape[1]):
        logits, states = step(prompt[:, t : t + 1], states)
    tokens, scores = [], []
    for i in range(max_new_tokens):
        scores.append(logits)
        tokens.append(logits.argmax(-1, keepdim=True))  # (B, 1)
        if i + 1 < max_new_tokens:
            logits, states = step(tokens[-1], states)
    return torch.cat(tokens, dim=1), scores, states
