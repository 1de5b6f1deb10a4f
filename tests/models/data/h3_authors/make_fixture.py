"""Make the H3 authors' fixture: tiny random checkpoints in the authors' exact layout, and their logits.

Runs the H3 authors' own model code (github.com/HazyResearch/H3, ``src/models/ssm_seq.py`` and
``src/models/ssm/``) and the FlashAttention modules it is built from (github.com/HazyResearch/flash-attention,
the commit H3 pins as its ``flash-attention`` submodule) on the CPU, from checkouts whose paths it is given.
None of their code is in this repository; this script only imports it::

    python make_fixture.py --h3 /path/to/H3 --flash-attn /path/to/flash-attention [--out DIR]

It needs torch, torchvision (flash_attn's Block imports StochasticDepth), einops, opt_einsum, scipy,
pytorch_lightning (H3's logger helper) and a transformers that still has
``transformers.generation.GreedySearchDecoderOnlyOutput`` (< 5; flash_attn's generation module imports it).
README.md beside this file says what each output holds and what computed it.

Nothing numerical is replaced. Two imports are routed around compiled code that has no CPU build:
``flash_attn/__init__.py`` is skipped (a bare package module is put in ``sys.modules``), and ``rotary_emb``, the
CUDA extension ``flash_attn/layers/rotary.py`` imports at its top, is an adapter that calls that file's own
pure-torch ``apply_rotary_emb_torch`` (the function the authors' ``tests/test_rotary.py`` checks the kernel
against). MHA runs with ``use_flash_attn=False`` (its default: the pure-torch ``SelfAttention`` /
``CrossAttention``), the MLP and LayerNorm unfused (the defaults), and H3 without ``fftconv`` (its default).
"""

import argparse
import copy
import json
import math
import os
import subprocess
import sys
import types

import torch

HERE = os.path.dirname(os.path.abspath(__file__))

# The two tiny LMs, as the authors' SSMLMHeadModel constructor arguments. ssm_cfg spells out the authors'
# defaults (H3: d_state=64, head_dim=1; SSKernel: mode="diag", measure="diag-lin", bilinear discretization),
# as their examples/generate_text_h3.py passes mode and measure.
MODELS = {
    "rotary": dict(
        d_model=32,
        n_layer=3,
        d_inner=64,
        vocab_size=61,
        ssm_cfg=dict(d_state=64, head_dim=1, mode="diag", measure="diag-lin"),
        attn_layer_idx=[1],
        attn_cfg=dict(num_heads=2, rotary_emb_dim=8),
        pad_vocab_size_multiple=8,
        layer_norm_epsilon=1e-5,
    ),
    "plain": dict(
        d_model=32,
        n_layer=4,
        d_inner=64,
        vocab_size=64,
        ssm_cfg=dict(d_state=64, head_dim=1, mode="diag", measure="diag-lin"),
        attn_layer_idx=[1, 3],
        attn_cfg=dict(num_heads=4),
        pad_vocab_size_multiple=8,
        layer_norm_epsilon=1e-5,
    ),
}
SEEDS = {"rotary": 1, "plain": 2, "h3_layer": 3}
IDS_SHAPE = (2, 48)
PROMPT_LEN, NEW_TOKENS = 16, 8
LAYER = dict(d_model=32, d_state=64, head_dim=1)  # the authors' H3 layer alone
LAYER_LEN = 32
LAYER_PREFIX = 16


def parse_args():
    """The checkouts of the authors' two repositories and the output folder."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--h3", required=True, help="checkout of HazyResearch/H3")
    parser.add_argument("--flash-attn", required=True, help="checkout of flash-attention (the commit H3 pins)")
    parser.add_argument("--out", default=HERE, help="output folder (default: this script's folder)")
    return parser.parse_args()


def git_commit(path):
    """The commit checked out at ``path`` ("unknown" if it is no git checkout)."""
    try:
        out = subprocess.run(["git", "-C", path, "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out.stdout.strip()


def pinned_flash_attn_commit(h3_path):
    """The flash-attention commit the H3 checkout pins as its submodule, or None."""
    try:
        out = subprocess.run(
            ["git", "-C", h3_path, "ls-tree", "HEAD", "flash-attention"], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    fields = out.stdout.split()
    return fields[2] if len(fields) >= 3 else None


def rotary_emb_adapter():
    """A module standing in for flash-attn's ``rotary_emb`` CUDA extension.

    Its one function, ``apply_rotary(x1, x2, cos, sin, out1, out2, conj)`` (csrc/rotary/rotary.cpp), writes
    ``out1 = x1*cos - x2*sin`` and ``out2 = x1*sin + x2*cos`` (``conj``: the inverse rotation). Here that is
    computed by ``flash_attn.layers.rotary.apply_rotary_emb_torch`` on ``cat(x1, x2)``: the authors' own torch
    reference for the same rotation, imported when first called.
    """
    module = types.ModuleType("rotary_emb")

    def apply_rotary(x1, x2, cos, sin, out1, out2, conj):
        from flash_attn.layers.rotary import apply_rotary_emb_torch

        cos, sin = cos[:, 0], sin[:, 0]  # (seqlen, 1, rotary_dim / 2) -> (seqlen, rotary_dim / 2)
        out = apply_rotary_emb_torch(torch.cat([x1, x2], dim=-1), cos, -sin if conj else sin)
        o1, o2 = out.chunk(2, dim=-1)
        out1.copy_(o1)
        out2.copy_(o2)

    module.apply_rotary = apply_rotary
    return module


def import_authors(h3_path, flash_attn_path):
    """Import the authors' SSMLMHeadModel, H3 and InferenceParams from the two checkouts."""
    package = types.ModuleType("flash_attn")
    package.__path__ = [os.path.join(os.path.abspath(flash_attn_path), "flash_attn")]
    sys.modules["flash_attn"] = package
    sys.modules["rotary_emb"] = rotary_emb_adapter()
    sys.path.insert(0, os.path.abspath(h3_path))
    from flash_attn.utils.generation import InferenceParams
    from src.models.ssm.h3 import H3
    from src.models.ssm_seq import SSMLMHeadModel

    return types.SimpleNamespace(SSMLMHeadModel=SSMLMHeadModel, H3=H3, InferenceParams=InferenceParams)


def perturbed_value(name, p, g):
    """A new value for parameter ``name`` (float32), random but in the range the authors' init gives it.

    Every parameter moves, so that no two of them keep a value that a wrong key mapping could swap unseen:
    LayerNorm weights leave 1 and biases 0, the shift SSM's B leaves e_1, D and the Linear biases leave 0.
    """
    z = torch.randn(p.shape, generator=g, dtype=torch.float32)
    leaf = name.rsplit(".", 1)[-1]
    if ".norm" in name or "ln_f" in name:
        return 1.0 + 0.2 * z if leaf == "weight" else 0.1 * z
    if name.endswith("ssm_k_kernel.kernel.B"):  # shift SSM input vector, e_1 at init
        return p + 0.3 * z
    if name.endswith("ssm_k_kernel.kernel.C"):
        return p + 0.1 * z
    if name.endswith("kernel.kernel.log_dt"):  # the authors' range: log U[dt_min=1e-3, dt_max=1e-1]
        u = torch.rand(p.shape, generator=g, dtype=torch.float32)
        return u * (math.log(0.1) - math.log(0.001)) + math.log(0.001)
    if leaf in ("inv_A_real", "A_imag"):  # diag-lin: log(0.5) and pi*n at init
        return p + 0.3 * z
    if name.endswith("kernel.kernel.B") or name.endswith("kernel.kernel.C"):  # complex, as (..., 2) reals
        return p + 0.3 * z
    if leaf in ("D", "ssm_k_D"):
        return p + 0.3 * z
    if leaf == "bias":
        return 0.1 * z
    if name.endswith("word_embeddings.weight"):
        return 0.5 * z
    if leaf == "weight" and p.dim() == 2:  # nn.Linear (out, in)
        return z / math.sqrt(p.shape[1])
    raise ValueError(f"no perturbation rule for {name} {tuple(p.shape)}")


@torch.no_grad()
def perturb_(module, seed):
    """Give every parameter of ``module`` a new value (a tied weight once); buffers stay as built."""
    g = torch.Generator().manual_seed(seed)
    for name, p in module.named_parameters():
        p.copy_(perturbed_value(name, p, g))


HALF_MODULES = (torch.nn.Linear, torch.nn.Embedding, torch.nn.LayerNorm)  # what the authors' example casts


def half_parameter_names(model):
    """The parameters the authors' example (examples/generate_text_h3.py) casts to float16: those of every
    Linear, Embedding and LayerNorm; the SSM parameters stay float32 (torch has no complex32)."""
    return {
        f"{prefix}.{name}" if prefix else name
        for prefix, module in model.named_modules()
        if isinstance(module, HALF_MODULES)
        for name, _ in module.named_parameters(recurse=False)
    }


@torch.no_grad()
def round_to_half_(model):
    """Round the parameters the example casts to float16 to float16 values (kept float32): the checkpoint stores
    them as float16, and every reference is computed from exactly the stored values."""
    for name, p in model.named_parameters():
        if name in half_parameter_names(model):
            p.copy_(p.half().float())


def save_checkpoint(model, path):
    """``torch.save`` of the state dict in the example's mixed precision: float16 Linear, Embedding and
    LayerNorm parameters (rounded to those values before any reference was computed), float32 SSM parameters
    and buffers. It halves the fixture, and the converter's reading of a float16 checkpoint is tested."""
    half = half_parameter_names(model)
    state = {k: (v.half() if k in half else v) for k, v in model.state_dict().items()}
    torch.save(state, path)


def build_lm(authors, name):
    """The authors' SSMLMHeadModel for MODELS[name], seeded, perturbed, float32, in eval mode."""
    torch.manual_seed(SEEDS[name])
    model = authors.SSMLMHeadModel(**copy.deepcopy(MODELS[name]))  # create_mixer_cls pops attn_cfg["causal"]
    perturb_(model, SEEDS[name])
    round_to_half_(model)
    return model.eval()


def input_ids(name):
    """Fixed random ids in [0, vocab_size) (the unpadded vocabulary)."""
    g = torch.Generator().manual_seed(100 + SEEDS[name])
    return torch.randint(0, MODELS[name]["vocab_size"], IDS_SHAPE, generator=g, dtype=torch.int64)


@torch.no_grad()
def greedy(model, ids):
    """The authors' cached greedy decode (flash_attn.utils.generation.decode via model.generate).

    NEW_TOKENS tokens after the first PROMPT_LEN ids of each row, no CUDA graphs (cg=False), no FT kernel;
    argmax over the padded vocabulary, as the authors' generate does when no vocab_size is passed.
    Returns the new tokens, the logits the decode chose them from, and the largest difference of those logits
    from a parallel (no-cache) forward pass over the same sequences.
    """
    prompt = ids[:, :PROMPT_LEN]
    out = model.generate(
        prompt, max_length=PROMPT_LEN + NEW_TOKENS, top_k=1, return_dict_in_generate=True, output_scores=True
    )
    tokens = out.sequences[:, PROMPT_LEN:]
    scores = torch.stack(out.scores, dim=1)
    parallel = model(out.sequences).logits[:, PROMPT_LEN - 1 : -1]
    return tokens, scores, (scores - parallel).abs().max().item()


@torch.no_grad()
def lm_fixture(authors, name, commits, out_dir):
    """Write {name}.model.pt, {name}.json and {name}.reference.pt for one tiny LM."""
    model = build_lm(authors, name)
    save_checkpoint(model, os.path.join(out_dir, f"{name}.model.pt"))
    ids = input_ids(name)
    logits32 = model(ids).logits
    model64 = copy.deepcopy(model).double()
    logits64 = model64(ids).logits
    tokens, scores, step_vs_parallel = greedy(model64, ids)
    reference = dict(
        input_ids=ids,
        logits_float64=logits64,
        greedy_prompt_len=torch.tensor(PROMPT_LEN),
        greedy_tokens=tokens,
        greedy_logits_float64=scores,
    )
    torch.save(reference, os.path.join(out_dir, f"{name}.reference.pt"))
    config = dict(MODELS[name], **commits)
    with open(os.path.join(out_dir, f"{name}.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    return dict(logits32=logits32, logits64=logits64, tokens=tokens, step_vs_parallel=step_vs_parallel)


@torch.no_grad()
def step_through(layer, authors, u, prefix):
    """The layer's output through its inference path: u[:, :prefix] in one call, then one token per call.

    As in the authors' decode: the first call (sequence_len_offset 0) runs the convolution and leaves the
    states (forward_state); every later call runs H3.step on the cached states.
    """
    params = authors.InferenceParams(max_sequence_len=u.shape[1], max_batch_size=u.shape[0])
    ys = [layer(u[:, :prefix], inference_params=params)]
    for t in range(prefix, u.shape[1]):
        params.sequence_len_offset = t
        ys.append(layer(u[:, t : t + 1], inference_params=params))
    return torch.cat(ys, dim=1)


@torch.no_grad()
def recurrent(layer, u):
    """The layer's output from its own recurrence alone: H3.step on every token, from zero states.

    The states and set-up are the ones H3.forward makes for inference (default_state, _setup_step);
    no convolution runs, so nothing is rounded to float32 (SSKernelShift.forward's ``k.float()``).
    """
    state_k = layer.ssm_k_kernel.default_state(u.shape[0])
    state = layer.kernel.default_state(u.shape[0])
    layer.ssm_k_kernel._setup_step()
    layer.kernel._setup_step()
    ys = []
    for t in range(u.shape[1]):
        y, state_k, state = layer.step(u[:, t : t + 1], state_k, state)
        ys.append(y)
    return torch.cat(ys, dim=1)


@torch.no_grad()
def layer_fixture(authors, out_dir):
    """Write h3_layer.model.pt and h3_layer.reference.pt: the authors' H3 layer alone."""
    torch.manual_seed(SEEDS["h3_layer"])
    layer = authors.H3(layer_idx=0, **LAYER)
    perturb_(layer, SEEDS["h3_layer"])
    round_to_half_(layer)
    layer.eval()
    save_checkpoint(layer, os.path.join(out_dir, "h3_layer.model.pt"))
    g = torch.Generator().manual_seed(200 + SEEDS["h3_layer"])
    u = torch.randn(1, LAYER_LEN, LAYER["d_model"], generator=g, dtype=torch.float64)
    y32 = layer(u.float())
    layer64 = copy.deepcopy(layer).double()
    y = layer64(u)
    reference = dict(
        u=u,
        y_float64=y,
        y_float32=y32,
        prefix_len=torch.tensor(LAYER_PREFIX),
        y_prefix_step_float64=step_through(layer64, authors, u, LAYER_PREFIX),
        y_recurrent_float64=recurrent(layer64, u),
    )
    torch.save(reference, os.path.join(out_dir, "h3_layer.reference.pt"))
    return reference


@torch.no_grad()
def multihead_layer_fixture(authors, out_dir):
    """Write h3_layer_head_dim2.{model,reference}.pt: the authors' H3 layer with head_dim 2 (16 SSM heads, each
    mixing a 2x2 outer product per position), its parallel forward only (their inference path raises for
    head_dim > 1). It pins the order of the output channels, d2·H + h in their code."""
    torch.manual_seed(SEEDS["h3_layer"] + 10)
    layer = authors.H3(layer_idx=0, **dict(LAYER, head_dim=2))
    perturb_(layer, SEEDS["h3_layer"] + 10)
    round_to_half_(layer)
    layer.eval()
    save_checkpoint(layer, os.path.join(out_dir, "h3_layer_head_dim2.model.pt"))
    g = torch.Generator().manual_seed(210 + SEEDS["h3_layer"])
    u = torch.randn(1, LAYER_LEN, LAYER["d_model"], generator=g, dtype=torch.float64)
    y = copy.deepcopy(layer).double()(u)
    torch.save(dict(u=u, y_float64=y), os.path.join(out_dir, "h3_layer_head_dim2.reference.pt"))
    return y


def main():
    """Build both LMs and the layer, write their files, print a summary."""
    args = parse_args()
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    commits = dict(h3_commit=git_commit(args.h3), flash_attention_commit=git_commit(args.flash_attn))
    pinned = pinned_flash_attn_commit(args.h3)
    if pinned and pinned != commits["flash_attention_commit"]:
        print(f"warning: H3 pins flash-attention {pinned}, the checkout is {commits['flash_attention_commit']}")
    authors = import_authors(args.h3, args.flash_attn)
    for name in MODELS:
        r = lm_fixture(authors, name, commits, args.out)
        print(f"{name}: logits_float64[0, 0, :4] = {r['logits64'][0, 0, :4].tolist()}")
        print(f"{name}: max |float32 - float64| = {(r['logits32'].double() - r['logits64']).abs().max():.3e}")
        print(
            f"{name}: greedy_tokens = {r['tokens'].tolist()}, "
            f"max |decode - parallel logits| = {r['step_vs_parallel']:.3e}"
        )
    ref = layer_fixture(authors, args.out)
    y = ref["y_float64"]
    print(f"h3_layer: y_float64[0, 0, :4] = {y[0, 0, :4].tolist()}")
    for key in ("y_float32", "y_prefix_step_float64", "y_recurrent_float64"):
        print(f"h3_layer: max |{key} - y_float64| = {(ref[key].double() - y).abs().max():.3e}")
    y2 = multihead_layer_fixture(authors, args.out)
    print(f"h3_layer_head_dim2: y_float64[0, 0, :4] = {y2[0, 0, :4].tolist()}")
    print(json.dumps(dict(commits, torch=torch.__version__)))


if __name__ == "__main__":
    main()
