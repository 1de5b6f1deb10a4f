"""The released H3 checkpoints (HazyResearch/H3, arXiv 2212.14052 §5): reading one, the architecture its keys and
shapes tell, and its parameters under ssmhub's names.

The authors' language model (``SSMLMHeadModel``) is a stack of pre-norm blocks, ``norm1 → mixer → add → norm2 →
MLP → add``, each mixer an H3 layer or (at the attention layer indices) flash-attn's ``MHA``, with a tanh-GELU
MLP ``fc1``/``fc2``, learned word embeddings (no position embeddings), a final LayerNorm ``ln_f`` and a head tied
to the embeddings, the vocabulary padded to a multiple of 8. Its H3 layer (arXiv 2212.14052 §3, Alg. 1) maps as:

- ``q_proj``, ``k_proj``, ``v_proj`` (three d → d Linears) → ``in_proj`` (one d → 3d, rows q, k, v);
- the shift SSM ``ssm_k_kernel.kernel`` (real ``B`` (d, S), ``C`` (1, d, S): its kernel is the cross-correlation
  ``K[t] = Σ_n B[n] C[n + t]``, t < S, §3.1's shift matrix with a learned B) → the S-tap FIR
  ``shift_conv.ssm.kernel`` (d, S), its skip ``ssm_k_D`` → ``shift_conv.ssm.skip``;
- the diagonal SSM ``kernel.kernel`` (S4D, arXiv 2206.11893: ``log_dt`` (H,), ``inv_A_real`` with
  ``Re A = −exp(inv_A_real)``, ``A_imag``, complex ``B`` (n_ssm, N, 2) and ``C`` (1, H, N, 2), the n_ssm rows of
  A and B tiled H / n_ssm times) → ``long_conv.ssm`` with ``c = C·B`` (the kernel reads only the product) and the
  same poles, its skip ``D`` → ``long_conv.ssm.skip``; ``d_state`` counts 2N real dimensions;
- ``output_linear`` → ``out_proj``, its input columns permuted from the authors' channel order ``j·H + h`` to
  ssmhub's ``h·d_h + j`` (the identity at ``head_dim`` 1, as every released model has it).

Older checkpoints use other key names and a post-norm order of the LayerNorms; :func:`rename_legacy_keys` maps
them as the authors' ``SSMLMHeadModel.load_state_dict`` does, and :func:`unwrap_lightning` takes the model out of
a PyTorch Lightning checkpoint.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = [
    "H3Architecture",
    "h3_layer_weights",
    "load_checkpoint",
    "read_architecture",
    "rename_legacy_keys",
    "ssmhub_state_dict",
    "unwrap_lightning",
]

LAYER_KEY = re.compile(r"^backbone\.layers\.(\d+)\.")
# old name -> new name, applied in this order (the authors' SSMLMHeadModel.load_state_dict)
LEGACY_RENAMES = (
    (re.compile(r"^s4seq\.encoder\."), "backbone."),
    (re.compile(r"^embedding\."), "backbone.embeddings.word_embeddings."),
    (re.compile(r"^backbone\.norm"), "backbone.ln_0"),
)


def load_checkpoint(path: str | Path, allow_pickle: bool = False) -> dict[str, torch.Tensor]:
    """The model parameters of a ``model.pt`` (a state dict or a Lightning checkpoint), on the CPU, under the
    current key names. Only tensors are unpickled unless ``allow_pickle`` (for a checkpoint you trust whose
    Lightning metadata holds other objects)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {str(path)!r} is not a file (expected the authors' model.pt)")
    try:
        loaded = torch.load(path, map_location="cpu", weights_only=not allow_pickle)
    except Exception as err:
        hint = "" if allow_pickle else "; if you trust the file, pass allow_pickle=True (--allow_pickle)"
        raise ValueError(f"checkpoint {str(path)!r} could not be read ({type(err).__name__}: {err}){hint}") from None
    if not isinstance(loaded, dict):
        raise ValueError(f"checkpoint {str(path)!r} holds a {type(loaded).__name__}, expected a state dict")
    return rename_legacy_keys(unwrap_lightning(loaded))


def unwrap_lightning(checkpoint: dict) -> dict:
    """The model's parameters of a Lightning checkpoint (``state_dict`` keys under ``model.``, the prefix
    stripped, as the authors' examples load it); any other dict unchanged."""
    if "pytorch-lightning_version" not in checkpoint:
        return checkpoint
    prefix = "model."
    return {key[len(prefix) :]: value for key, value in checkpoint["state_dict"].items() if key.startswith(prefix)}


def rename_legacy_keys(state_dict: dict) -> dict:
    """Older checkpoints' key names mapped to the current ones and, where the old post-norm order shows
    (``backbone.ln_0`` present: a LayerNorm after each mixer and MLP, one before the first layer), the norms
    moved to the pre-norm slots that compute the same function: layer l's ``norm1`` is old layer l − 1's
    ``norm2`` (``ln_0`` for l = 0), its ``norm2`` is its old ``norm1``, and ``ln_f`` the last layer's old
    ``norm2``."""
    renamed = {}
    for key, value in state_dict.items():
        for pattern, new in LEGACY_RENAMES:
            key = pattern.sub(new, key)
        renamed[key] = value
    if "backbone.ln_0.weight" not in renamed:
        return renamed
    last = num_layers(renamed) - 1
    old = dict(renamed)
    moved = {"backbone.ln_f": f"backbone.layers.{last}.norm2", "backbone.layers.0.norm1": "backbone.ln_0"}
    for layer in range(last + 1):
        moved[f"backbone.layers.{layer}.norm2"] = f"backbone.layers.{layer}.norm1"
        if layer > 0:
            moved[f"backbone.layers.{layer}.norm1"] = f"backbone.layers.{layer - 1}.norm2"
    for source in moved.values():
        for name in ("weight", "bias"):
            renamed.pop(f"{source}.{name}", None)
    for target, source in moved.items():
        for name in ("weight", "bias"):
            renamed[f"{target}.{name}"] = old[f"{source}.{name}"]
    return renamed


def num_layers(state_dict: dict) -> int:
    """1 + the largest layer index among the ``backbone.layers.{i}.`` keys (0 if none)."""
    indices = [int(match.group(1)) for key in state_dict if (match := LAYER_KEY.match(key))]
    return max(indices) + 1 if indices else 0


@dataclass(frozen=True)
class H3Architecture:
    """What a checkpoint's keys and shapes tell: sizes, which layers are attention, the SSMs' shapes, and the
    rotary embedding when its ``inv_freq`` buffer was saved (None: not in the checkpoint)."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    intermediate_size: int
    attention_layers: tuple[int, ...]
    ssm_heads: int  # H = d / head_dim
    ssm_state_size: int  # N complex modes = d_state / 2
    shift_kernel_size: int  # S
    rotary_emb_dim: int | None
    rotary_emb_base: float | None

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.ssm_heads


def _shape(state_dict: dict, key: str) -> tuple[int, ...]:
    if key not in state_dict:
        raise ValueError(f"checkpoint key {key!r} is missing: not an H3 checkpoint of the released layout")
    return tuple(state_dict[key].shape)


def _expect(state_dict: dict, key: str, shape: tuple[int, ...]) -> None:
    got = _shape(state_dict, key)
    if got != tuple(shape):
        raise ValueError(f"checkpoint key {key!r} has shape {list(got)}, expected {list(shape)}")


def read_architecture(state_dict: dict) -> H3Architecture:
    """The :class:`H3Architecture` of a state dict under the current key names; a key whose shape does not fit the
    others raises a ValueError naming it."""
    if "backbone.embeddings.position_embeddings.weight" in state_dict:
        raise ValueError(
            "checkpoint key 'backbone.embeddings.position_embeddings.weight': learned position embeddings "
            "(max_position_embeddings > 0) have no ssmhub H3 counterpart; the released models have none"
        )
    vocab_size, hidden = _shape(state_dict, "backbone.embeddings.word_embeddings.weight")
    layers = num_layers(state_dict)
    if layers == 0:
        raise ValueError("checkpoint has no 'backbone.layers.{i}.' keys: not an H3 language model")
    attention = tuple(i for i in range(layers) if f"backbone.layers.{i}.mixer.Wqkv.weight" in state_dict)
    h3_layers = [i for i in range(layers) if i not in attention]
    first = f"backbone.layers.{h3_layers[0]}.mixer" if h3_layers else None
    ssm_heads = _shape(state_dict, f"{first}.kernel.kernel.log_dt")[0] if first else hidden
    state_size = _shape(state_dict, f"{first}.kernel.kernel.A_imag")[-1] if first else 1
    shift = _shape(state_dict, f"{first}.ssm_k_kernel.kernel.B")[-1] if first else 1
    rotary_dim, rotary_base = _rotary(state_dict, attention)
    arch = H3Architecture(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_layers=layers,
        intermediate_size=_shape(state_dict, "backbone.layers.0.mlp.fc1.weight")[0],
        attention_layers=attention,
        ssm_heads=ssm_heads,
        ssm_state_size=state_size,
        shift_kernel_size=shift,
        rotary_emb_dim=rotary_dim,
        rotary_emb_base=rotary_base,
    )
    _check_shapes(state_dict, arch)
    return arch


def _rotary(state_dict: dict, attention: tuple[int, ...]) -> tuple[int | None, float | None]:
    """(rotary dim, base) from the first attention layer's saved ``rotary_emb.inv_freq`` (θ_i = base^(−2i/dim),
    arXiv 2104.09864 Eq. 15), or (None, None) where the buffer was not saved."""
    if not attention:
        return None, None
    key = f"backbone.layers.{attention[0]}.mixer.rotary_emb.inv_freq"
    if key not in state_dict:
        return None, None
    inv_freq = state_dict[key].double()  # (dim / 2,)
    dim = 2 * inv_freq.numel()
    exponents = torch.arange(0, dim, 2, dtype=torch.float64) / dim  # 2i / dim
    if dim == 2:  # θ_0 = 1 for any base
        base = 10000.0
    else:  # least squares over log θ_i = −(2i/dim)·log base
        base = math.exp(-float((exponents * inv_freq.log()).sum() / exponents.square().sum()))
        base = float(round(base)) if abs(base - round(base)) <= 1e-4 * base else base  # 9999.998 was 10000
    expected = base**-exponents
    if not torch.allclose(inv_freq, expected, rtol=1e-5, atol=0):
        raise ValueError(f"checkpoint key {key!r} does not hold rotary frequencies base^(-2i/{dim}) for any base")
    return dim, base


def _check_shapes(state_dict: dict, arch: H3Architecture) -> None:
    """Every key an ssmhub H3 reads, at the shape ``arch`` implies (a ValueError names the first that is not)."""
    d, inner = arch.hidden_size, arch.intermediate_size
    for i in range(arch.num_layers):
        block = f"backbone.layers.{i}"
        for norm in ("norm1", "norm2"):
            _expect(state_dict, f"{block}.{norm}.weight", (d,))
            _expect(state_dict, f"{block}.{norm}.bias", (d,))
        _expect(state_dict, f"{block}.mlp.fc1.weight", (inner, d))
        _expect(state_dict, f"{block}.mlp.fc2.weight", (d, inner))
        if i in arch.attention_layers:
            _expect(state_dict, f"{block}.mixer.Wqkv.weight", (3 * d, d))
            _expect(state_dict, f"{block}.mixer.out_proj.weight", (d, d))
            continue
        mixer = f"{block}.mixer"
        for proj in ("q_proj", "k_proj", "v_proj", "output_linear"):
            _expect(state_dict, f"{mixer}.{proj}.weight", (d, d))
        _expect(state_dict, f"{mixer}.ssm_k_kernel.kernel.B", (d, arch.shift_kernel_size))
        _expect(state_dict, f"{mixer}.ssm_k_kernel.kernel.C", (1, d, arch.shift_kernel_size))
        _expect(state_dict, f"{mixer}.kernel.kernel.log_dt", (arch.ssm_heads,))
        _expect(state_dict, f"{mixer}.kernel.kernel.C", (1, arch.ssm_heads, arch.ssm_state_size, 2))
        n_ssm = _shape(state_dict, f"{mixer}.kernel.kernel.B")[0]
        if arch.ssm_heads % n_ssm:
            raise ValueError(f"checkpoint key '{mixer}.kernel.kernel.B': {n_ssm} SSMs do not divide {arch.ssm_heads}")
        for name in ("inv_A_real", "A_imag"):
            _expect(state_dict, f"{mixer}.kernel.kernel.{name}", (n_ssm, arch.ssm_state_size))
        _expect(state_dict, f"{mixer}.kernel.kernel.B", (n_ssm, arch.ssm_state_size, 2))
    if d % arch.ssm_heads:
        raise ValueError(f"checkpoint's SSM heads ({arch.ssm_heads}, from log_dt) do not divide the width {d}")


# ----------------------------------------------------------------------------------------- the mapping


def ssmhub_state_dict(state_dict: dict, arch: H3Architecture) -> dict[str, torch.Tensor]:
    """The checkpoint's parameters under ssmhub ``H3ForCausalLM``'s names, float32; a key left over (a part of
    the authors' model that ssmhub would drop) raises a ValueError naming it."""
    remaining = dict(state_dict)

    def take(key: str) -> torch.Tensor:
        return remaining.pop(key).float()

    out = {"backbone.embeddings.weight": take("backbone.embeddings.word_embeddings.weight")}
    for i in range(arch.num_layers):
        src, dst = f"backbone.layers.{i}", f"backbone.layers.{i}"
        for old, new in (("norm1", "mixer_norm"), ("norm2", "mlp_norm")):
            for name in ("weight", "bias"):
                out[f"{dst}.{new}.{name}"] = take(f"{src}.{old}.{name}")
        for old, new in (("fc1", "up_proj"), ("fc2", "down_proj")):
            for name in ("weight", "bias"):
                out[f"{dst}.mlp.{new}.{name}"] = take(f"{src}.mlp.{old}.{name}")
        mixer = (
            _attention(take, remaining, src, arch) if i in arch.attention_layers else h3_layer_weights(take, src, arch)
        )
        out.update({f"{dst}.mixer.{name}": value for name, value in mixer.items()})
    for name in ("weight", "bias"):
        out[f"backbone.norm_f.{name}"] = take(f"backbone.ln_f.{name}")
    head = remaining.pop("lm_head.weight", None)
    if head is not None and not torch.equal(head, state_dict["backbone.embeddings.word_embeddings.weight"]):
        raise ValueError("checkpoint key 'lm_head.weight' differs from the word embeddings: the head is not tied")
    out["lm_head.weight"] = out["backbone.embeddings.weight"]
    if remaining:
        key = sorted(remaining)[0]
        raise ValueError(
            f"checkpoint key {key!r} (and {len(remaining) - 1} more) has no place in an ssmhub H3: an option of "
            "the authors' model that the converter does not know"
        )
    return out


def _attention(take, remaining: dict, prefix: str, arch: H3Architecture) -> dict[str, torch.Tensor]:
    """flash-attn's MHA: ``Wqkv`` rows (three, heads, head_dim) are ``qkv_proj``'s chunk layout as they are."""
    remaining.pop(f"{prefix}.mixer.rotary_emb.inv_freq", None)  # read by read_architecture
    mixer = f"{prefix}.mixer"
    return {
        "qkv_proj.weight": take(f"{mixer}.Wqkv.weight"),
        "qkv_proj.bias": take(f"{mixer}.Wqkv.bias"),
        "out_proj.weight": take(f"{mixer}.out_proj.weight"),
        "out_proj.bias": take(f"{mixer}.out_proj.bias"),
    }


def h3_layer_weights(take, prefix: str, arch: H3Architecture) -> dict[str, torch.Tensor]:
    """One H3 layer under ``{prefix}.mixer.``, read with ``take(key)`` (module docstring), by ssmhub name."""
    mixer = f"{prefix}.mixer"
    q, k, v = (take(f"{mixer}.{name}_proj.weight") for name in "qkv")
    q_bias, k_bias, v_bias = (take(f"{mixer}.{name}_proj.bias") for name in "qkv")
    shift_b = take(f"{mixer}.ssm_k_kernel.kernel.B").double()  # (d, S)
    shift_c = take(f"{mixer}.ssm_k_kernel.kernel.C").double()[0]  # (d, S)
    taps = arch.shift_kernel_size
    shift = torch.stack([(shift_b[:, : taps - t] * shift_c[:, t:]).sum(-1) for t in range(taps)], dim=-1)
    ssm = f"{mixer}.kernel.kernel"
    b = torch.view_as_complex(take(f"{ssm}.B").double().contiguous())  # (n_ssm, N)
    repeat = arch.ssm_heads // b.shape[0]  # the n_ssm rows of A and B tiled (v t) to H heads, as S4D does
    b = b.repeat(repeat, 1)  # (H, N)
    c = torch.view_as_complex(take(f"{ssm}.C").double()[0].contiguous())  # (H, N)
    # output channel j·H + h (authors) -> h·d_h + j (ssmhub): column h·d_h + j of ours is column j·H + h of theirs
    heads, head_dim = arch.ssm_heads, arch.head_dim
    order = torch.arange(arch.hidden_size).reshape(head_dim, heads).T.reshape(-1)
    output = take(f"{mixer}.output_linear.weight")
    return {
        "in_proj.weight": torch.cat([q, k, v]),
        "in_proj.bias": torch.cat([q_bias, k_bias, v_bias]),
        "shift_conv.ssm.kernel": shift.float(),
        "shift_conv.ssm.skip": take(f"{mixer}.ssm_k_D"),
        "long_conv.ssm.log_dt": take(f"{ssm}.log_dt"),
        "long_conv.ssm.log_neg_real": take(f"{ssm}.inv_A_real").repeat(repeat, 1),
        "long_conv.ssm.imag": take(f"{ssm}.A_imag").repeat(repeat, 1),
        "long_conv.ssm.c": torch.view_as_real(c * b).float(),
        "long_conv.ssm.skip": take(f"{mixer}.D"),
        "out_proj.weight": output[:, order],
        "out_proj.bias": take(f"{mixer}.output_linear.bias"),
    }
