"""The arithmetic of one training step (issue 52 §4: "where arithmetic caps a target, the results file shows it"):
FLOPs and bytes per token of every model, computed from its configuration, against the card's peak.

Per token of a training step (backward = 2 × forward, so 3 × the forward's counts):

- matmuls: 2·in·out FLOPs per ``nn.Linear`` / GPT-2 ``Conv1D`` (the tied LM head included) and their
  activations in and out in bf16 (2 B each); SeRpEnt's resampled branches see at least κ·L tokens (arXiv
  2501.11729 Eq. 13 bounds the compressed length below by κ·L), so theirs count κ times, a lower bound;
- sequence mixing, per layer: causal attention 2·L·d FLOPs (QKᵀ and AV, half of them masked) and q, k, v, o in
  bf16; an FFT long convolution (DLR, H3) 2 real FFTs of size 2L, 2.5·n·log₂n FLOPs each per channel (the kernel's
  spectrum is shared by the batch), input and output in float32; the selective scan (Mamba, SeRpEnt's branches)
  ≈ 9·N FLOPs per channel of d_inner (discretise, update, read out), reading x, Δ, z (d_inner each) and B, C (N
  each) and writing y, in float32 (the fused kernel's minimum); the block scan (BDLRNN, arXiv 2309.07412 §3.3) a
  b × b matrix-vector product per block, 2·d·b FLOPs, reading every block A_k (d·b floats) and v_k, writing x_k;
- the loss: ≈ 5·V FLOPs (log-softmax and its gradient) and the logits in bf16 and float32.

These are lower bounds (each tensor moves once, no recomputation, no launch overhead): the step cannot be faster
than max(FLOPs / peak FLOP/s, bytes / peak bandwidth). A target is *capped* when even that bound, against the
compiled GPT-2's measured step, cannot reach it.
"""

from __future__ import annotations

import math

import torch
from _gpu_common import Context, Section
from _gpu_models import MODELS, build_model, shape_for

# NVIDIA's data sheets: dense bf16 tensor-core FLOP/s (no sparsity) and HBM bytes/s; first match of the name wins
CARDS = (
    ("H200", 989e12, 4.8e12),
    ("H100 PCIe", 756e12, 2.0e12),
    ("H100 NVL", 835e12, 3.9e12),
    ("H100", 989e12, 3.35e12),  # SXM (HBM3), e.g. "NVIDIA H100 80GB HBM3"
    ("A100 80GB", 312e12, 2.04e12),
    ("A100", 312e12, 1.56e12),
)


def card_peaks(device: torch.device) -> tuple[str, float | None, float | None]:
    """(device name, peak bf16 FLOP/s, peak bytes/s) for a card of ``CARDS``, else (name, None, None)."""
    if device.type != "cuda":
        return "CPU", None, None
    name = torch.cuda.get_device_name(device)
    for key, flops, bandwidth in CARDS:
        if key in name:
            return name, flops, bandwidth
    return name, None, None


def linear_terms(name: str, model: torch.nn.Module) -> tuple[float, float]:
    """Forward FLOPs and bytes per token of every matmul (bf16 activations in and out)."""
    from transformers.pytorch_utils import Conv1D

    rates = getattr(model.config, "resampling_rates", [])
    flops = data = 0.0
    for path, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            fan_in, fan_out = module.in_features, module.out_features
        elif isinstance(module, Conv1D):
            fan_in, fan_out = module.weight.shape
        else:
            continue
        share = next((rates[i] for i in range(len(rates)) if f"resampled.{i}." in path and "step_proj" not in path), 1)
        flops += 2 * fan_in * fan_out * share
        data += 2 * (fan_in + fan_out) * share
    return flops, data


def mixer_terms(name: str, config, length: int) -> tuple[float, float]:
    """Forward FLOPs and bytes per token of the sequence mixing of all layers (see the module docstring)."""
    if name == "gpt2":
        return config.n_layer * 2 * length * config.n_embd, config.n_layer * 8 * config.n_embd
    d, layers = config.hidden_size, config.num_hidden_layers
    if name.startswith("h3") or name == "dlr":
        attention = len(getattr(config, "attention_layers", []))
        fft = 2 * 2.5 * 2 * length * math.log2(2 * length) / length * d  # two FFTs of 2L per channel, per token
        return (layers - attention) * fft + attention * 2 * length * d, (layers - attention) * 8 * d + attention * 8 * d
    if name == "bdlrnn":
        b = config.block_size
        return layers * 2 * d * b, layers * 4 * (d * b + 2 * d)
    widths = config.branch_widths(d) if config.resampling_rates else [d]
    rates = [1, *config.resampling_rates]
    inner, n = [config.expand * w for w in widths], config.state_size
    flops = sum(r * 9 * e * n for r, e in zip(rates, inner))
    return layers * flops, layers * sum(r * 4 * (4 * e + 2 * n) for r, e in zip(rates, inner))


def per_token(name: str, model: torch.nn.Module, length: int) -> tuple[float, float]:
    """Training FLOPs and bytes per token: 3 × the forward's (matmuls, mixing, loss)."""
    vocab = model.config.vocab_size
    linear_flops, linear_bytes = linear_terms(name, model)
    mixer_flops, mixer_bytes = mixer_terms(name, model.config, length)
    return 3 * (linear_flops + mixer_flops + 5 * vocab), 3 * (linear_bytes + mixer_bytes + 6 * vocab)


def bound_ms(flops: float, data: float, tokens: int, peaks: tuple) -> float | None:
    """The step's lower bound in ms on the card: max(FLOPs / peak, bytes / bandwidth); None for an unknown card."""
    _, peak_flops, peak_bandwidth = peaks
    if peak_flops is None:
        return None
    return 1e3 * tokens * max(flops / peak_flops, data / peak_bandwidth)


def arithmetic(ctx: Context) -> dict:
    """{(name, length): (FLOPs/token, bytes/token, bound ms or None)} for every model and length of the plan."""
    peaks, table = card_peaks(ctx.device), {}
    for name in MODELS:
        model = build_model(name, shape_for(ctx.plan["train_user_shape"]), "meta")
        for length, batch in ctx.plan["train_lengths"]:
            flops, data = per_token(name, model, length)
            table[(name, length)] = (flops, data, bound_ms(flops, data, length * batch, peaks))
    return table


def write_arithmetic(ctx: Context, section: Section, results: dict) -> None:
    """The arithmetic table: per model and length, FLOPs and bytes per token, the bound, and the measured step."""
    card, peak_flops, peak_bandwidth = card_peaks(ctx.device)
    known = f"{peak_flops / 1e12:.0f} TFLOP/s bf16 dense, {peak_bandwidth / 1e12:.2f} TB/s" if peak_flops else "–"
    section.text(
        f"### Arithmetic per token (`_gpu_arithmetic.py`)\n\nCard: {card}; peaks: {known}. Bound = max(FLOPs / "
        "peak, bytes / bandwidth) × tokens per step, a lower bound on the step (each tensor moved once). Measured: "
        "the model's faster row (compiled or eager)."
    )
    table = section.table(["model", "L", "GFLOP/token", "MB/token", "bound ms", "measured ms", "of the bound"])
    for (name, length), (flops, data, bound) in arithmetic(ctx).items():
        measured = best_row(results, name, length)
        ms = f"{measured[1]:.1f} ({measured[0]})" if measured else "–"
        share = f"{bound / measured[1]:.0%}" if measured and bound else "–"
        bound_text = "–" if bound is None else f"{bound:.1f}"
        table.add(name, length, f"{flops / 1e9:.3g}", f"{data / 1e6:.3g}", bound_text, ms, share)


def best_row(results: dict, name: str, length: int) -> tuple[str, float] | None:
    """(mode, ms) of the model's fastest measured row at ``length``, or None."""
    timed = [(mode, r["ms"]) for (n, l_, mode), r in results.items() if n == name and l_ == length and "ms" in r]
    return min(timed, key=lambda entry: entry[1]) if timed else None
