"""``ssmhub-convert-h3 CHECKPOINT OUTPUT_DIR``: a released H3 checkpoint (HazyResearch/H3, arXiv 2212.14052 §5)
as an ssmhub H3 folder that loads with ``AutoModelForCausalLM.from_pretrained`` and computes the authors' logits.

The architecture comes from the checkpoint's keys and shapes (:mod:`.released_checkpoint`): width, layers, MLP
width, which layers are attention, the SSMs' state and shift sizes, and the rotary embedding where its
``inv_freq`` buffer was saved. Two things the keys do not tell come from arguments: the attention heads (default:
the released models' own, :data:`RELEASED_HEADS`) and, where no ``inv_freq`` was saved, the rotary dimension
(``--rotary_emb_dim 64`` for the 2.7B "2attn-rotary" model, else 0). The folder is written under a temporary name
and renamed when complete; with ``--push_to_hub`` it is then uploaded.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from ...command_line import CommandLineParser
from ...preflight import check_hub_access, check_output_dir
from .configuration_h3 import H3Config
from .released_checkpoint import H3Architecture, load_checkpoint, read_architecture, ssmhub_state_dict

__all__ = ["RELEASED_HEADS", "convert_h3_checkpoint", "h3_config_for", "main"]

# attention heads of the released models by width (HazyResearch/H3 README: H3-125M 12, 355M / 1.3B 16, 2.7B 20)
RELEASED_HEADS = {768: 12, 1024: 16, 2048: 16, 2560: 20}


def h3_config_for(
    arch: H3Architecture,
    num_attention_heads: int | None = None,
    rotary_emb_dim: int | None = None,
    tokenizer=None,
) -> H3Config:
    """The ssmhub :class:`H3Config` of the authors' model ``arch`` describes: pre-norm blocks with a tanh-GELU
    MLP, LayerNorm eps 1e-5, the bilinear diagonal SSM with ``ssm_state_size = d_state / 2`` modes, an S-tap
    shift kernel, tied embeddings, and the tokenizer's bos/eos ids."""
    heads = _attention_heads(arch, num_attention_heads)
    rotary = _rotary_dim(arch, rotary_emb_dim)
    special = {}
    if tokenizer is not None:
        special = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id}
    return H3Config(
        vocab_size=arch.vocab_size,
        hidden_size=arch.hidden_size,
        num_hidden_layers=arch.num_layers,
        intermediate_size=arch.intermediate_size,
        hidden_act="gelu_pytorch_tanh",
        layer_norm_epsilon=1e-5,
        prenorm=True,
        tie_word_embeddings=True,
        kernel_type="diagonal_ssm",
        ssm_discretization="bilinear",
        ssm_state_size=arch.ssm_state_size,
        ssm_num_heads=None if arch.head_dim == 1 else arch.ssm_heads,
        shift_kernel_size=arch.shift_kernel_size,
        attention_layers=list(arch.attention_layers),
        num_attention_heads=heads,
        rotary_emb_dim=rotary,
        rotary_emb_base=arch.rotary_emb_base or 10000.0,
        **special,
    )


def _attention_heads(arch: H3Architecture, heads: int | None) -> int | None:
    if heads is not None or not arch.attention_layers:
        return heads
    if arch.hidden_size not in RELEASED_HEADS:
        raise ValueError(
            f"num_attention_heads (--num_attention_heads) is needed: width {arch.hidden_size} is none of the "
            f"released models' ({sorted(RELEASED_HEADS)}), and a checkpoint does not say its heads"
        )
    return RELEASED_HEADS[arch.hidden_size]


def _rotary_dim(arch: H3Architecture, rotary_emb_dim: int | None) -> int:
    if arch.rotary_emb_dim is None:
        return rotary_emb_dim or 0
    if rotary_emb_dim is not None and rotary_emb_dim != arch.rotary_emb_dim:
        raise ValueError(
            f"rotary_emb_dim (--rotary_emb_dim) is {rotary_emb_dim}, but the checkpoint's rotary_emb.inv_freq "
            f"says {arch.rotary_emb_dim}"
        )
    return arch.rotary_emb_dim


def convert_h3_checkpoint(
    checkpoint: str | os.PathLike,
    output_dir: str | os.PathLike | None = None,
    *,
    tokenizer: str | os.PathLike | None = "gpt2",
    num_attention_heads: int | None = None,
    rotary_emb_dim: int | None = None,
    allow_pickle: bool = False,
    push_to_hub: bool = False,
    hub_model_id: str | None = None,
):
    """Convert the authors' ``model.pt`` into an ssmhub ``H3ForCausalLM`` (returned, in eval mode) and, with
    ``output_dir``, save it there with the tokenizer (a local folder or a Hub id such as ``"gpt2"``; None: no
    tokenizer). Every check (the checkpoint's keys, the tokenizer, the output folder, Hub access) runs before
    anything is written."""
    from .modeling_h3 import H3ForCausalLM

    if output_dir is not None:
        check_output_dir(output_dir, "OUTPUT_DIR")
        if Path(output_dir).is_dir() and any(Path(output_dir).iterdir()):
            raise ValueError(f"OUTPUT_DIR {output_dir} is not empty; give a new folder")
    if push_to_hub:
        if output_dir is None:
            raise ValueError("push_to_hub needs output_dir: the folder that is uploaded")
        check_hub_access(hub_model_id)
    state_dict = load_checkpoint(checkpoint, allow_pickle=allow_pickle)
    arch = read_architecture(state_dict)
    weights = ssmhub_state_dict(state_dict, arch)
    loaded_tokenizer = _tokenizer(tokenizer, arch)
    config = h3_config_for(arch, num_attention_heads, rotary_emb_dim, loaded_tokenizer)
    model = H3ForCausalLM(config)
    model.load_state_dict(weights, strict=True)
    model.eval()
    if output_dir is not None:
        _save_folder(model, loaded_tokenizer, Path(output_dir))
    if push_to_hub:
        from ...training.model_card import push_folder_to_hub

        push_folder_to_hub(output_dir, hub_model_id)
    return model


def _tokenizer(name, arch: H3Architecture):
    if name is None:
        return None
    from ...tokenization import resolve_tokenizer

    tokenizer = resolve_tokenizer(name)
    if len(tokenizer) > arch.vocab_size:
        raise ValueError(
            f"tokenizer {str(name)!r} has {len(tokenizer)} tokens, more than the checkpoint's {arch.vocab_size} "
            "embedding rows: not this model's tokenizer"
        )
    return tokenizer


def _save_folder(model, tokenizer, output_dir: Path) -> None:
    """Write the folder under a temporary name beside ``output_dir``, then rename it (nothing half-written)."""
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=output_dir.parent, prefix=f".{output_dir.name}.", suffix=".tmp"))
    try:
        model.save_pretrained(staging)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        if output_dir.is_dir():  # empty (checked): os.replace needs it gone
            output_dir.rmdir()
        os.replace(staging, output_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _parser() -> CommandLineParser:
    parser = CommandLineParser(
        prog="ssmhub-convert-h3",
        description="Convert a released H3 checkpoint (HazyResearch/H3 model.pt) into an ssmhub H3 folder.",
    )
    parser.add_argument("checkpoint", help="the authors' model.pt (a state dict or a Lightning checkpoint)")
    parser.add_argument("output_dir", help="the folder to write (new or empty)")
    parser.add_argument("--tokenizer", default="gpt2", help="tokenizer folder or Hub id (default: gpt2)")
    parser.add_argument("--no_tokenizer", action="store_true", help="write no tokenizer")
    parser.add_argument(
        "--num_attention_heads", type=int, default=None, help="heads of the attention layers (default: by width)"
    )
    parser.add_argument(
        "--rotary_emb_dim", type=int, default=None, help="rotary dims where the checkpoint has no inv_freq (64/0)"
    )
    parser.add_argument("--allow_pickle", action="store_true", help="unpickle more than tensors (trusted files)")
    parser.add_argument("--push_to_hub", action="store_true", help="upload the folder to --hub_model_id")
    parser.add_argument("--hub_model_id", default=None, help="the Hub repo, e.g. my-org/H3-125M")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Console entry point: 0, or one error line (status 2) for bad input, found before anything is written."""
    parser = _parser()
    args = parser.parse_args(argv)
    with parser.bad_input_errors():
        model = convert_h3_checkpoint(
            args.checkpoint,
            args.output_dir,
            tokenizer=None if args.no_tokenizer else args.tokenizer,
            num_attention_heads=args.num_attention_heads,
            rotary_emb_dim=args.rotary_emb_dim,
            allow_pickle=args.allow_pickle,
            push_to_hub=args.push_to_hub,
            hub_model_id=args.hub_model_id,
        )
    config = model.config
    print(
        f"wrote {args.output_dir}: H3 d {config.hidden_size}, {config.num_hidden_layers} layers, attention at "
        f"{config.attention_layers} ({config.num_attention_heads} heads, rotary {config.rotary_emb_dim}), "
        f"{sum(p.numel() for p in model.parameters()):,} parameters",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
