"""Perplexity of a trained H3 language model before and after distilling its long convolutions into modal form.

What is measured
----------------
A trained ``H3ForCausalLM`` folder (e.g. the WikiText-2 run of issue 5, trained with ``ssmhub-train``) is
scored by ``ssmhub-eval``'s own code (:func:`ssmhub.evaluation.cli.run_evaluation`: sliding windows of
``--max-length`` tokens advancing by ``--stride``, exact NLL sums, top-1/top-5) on a WikiText split scored
as one stream, first as trained (exact long convolutions), then after ``model.distill_for_decoding(N)`` for
each ``--modes`` N. Each distilled model goes through ``save_pretrained`` + ``from_pretrained`` before it is
scored, so the numbers are those of the model a user would load. Reported per N: the relative L2 error of the
fitted kernels (mean / median / max over every channel of every layer), token perplexity, its change against
the exact model, top-1 accuracy, and the fitting time.

The issue's target: distilled perplexity within 1% of the exact model's at N ≤ 64.

Run: ``python benchmarks/h3_distillation.py --model runs/h3-wt2`` (a few minutes for a 4-layer 256-wide model).

Synthetic section (issue 30): ``--synthetic RUN.pt`` takes the checkpoint of an ``ssmhub-synthetic`` H3 run on a
regression task (e.g. Shift at L 512, where the exact model reaches R² ≥ 0.99) or a token task (e.g. MQAR) and
reports the held-out R² (token tasks: accuracy over the labelled positions) of the exact model and of each
distillation in ``--configs`` (``method:N`` or ``method:N:tolerance``, each optionally ``/dense`` for the
dense Hankel eigensolver instead of the default truncated one; the reference Hankel/ESPRIT fit is ``hankel``),
with the kernel errors, the heads left exact and the decode state per sequence; and the Hankel singular values
of the trained kernels (table and ``<name>_hsv.png``)::

    ssmhub-synthetic --task shift --model_type h3 --max_steps 300 --checkpoint run.pt
    python benchmarks/h3_distillation.py --synthetic run.pt --configs hankel:64 best:64 best:255:0.05
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
import time

import torch
from transformers import AutoTokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import markdown_table, write_report
from _scoring import score_stream

SYNTHETIC_CONFIGS = ["hankel:16", "hankel:64", "best:16", "best:64", "best:255:0.05"]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--model", help="a trained (undistilled) H3ForCausalLM folder with its tokenizer")
    p.add_argument("--synthetic", help="instead: the checkpoint of an ssmhub-synthetic H3 run on a regression task")
    p.add_argument(
        "--configs",
        nargs="+",
        default=None,
        help="method:N[:tolerance][/eigensolver] distillations to score (eigensolver: truncated, the default, or "
        "dense; synthetic default: hankel:16 hankel:64 best:16 best:64 best:255:0.05; language model default: "
        "--method:N for each --modes)",
    )
    p.add_argument("--eval-examples", type=int, default=None, help="synthetic: held-out examples (default: the run's)")
    p.add_argument("--method", default="best", help="fit method of the language-model section")
    p.add_argument(
        "--truncate-taps",
        type=int,
        nargs="*",
        default=[64],
        help="language model: control rows with every kernel cut to its first T taps (none: no control)",
    )
    p.add_argument("--modes", type=int, nargs="+", default=[8, 16, 32, 64], help="N values to distill to")
    p.add_argument("--dataset", default="wikitext-2")
    p.add_argument("--split", default="validation")
    p.add_argument("--max-length", type=int, default=512, help="tokens per evaluation window")
    p.add_argument("--stride", type=int, default=256, help="how far a window advances")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--data-dir", default=None, help="default: $SSMHUB_DATA_DIR")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    p.add_argument("--name", default="h3_distillation", help="results/<name>.md")
    p.add_argument("--no-write", action="store_true", help="print only; do not write the results file")
    return p.parse_args(argv)


def score(folder: str, args) -> tuple[dict, float]:
    """ssmhub-eval's result for ``folder`` and its wall time."""
    start = time.perf_counter()
    result = score_stream(
        folder, args.dataset, args.split, args.max_length, args.stride, args.batch_size, args.data_dir
    )
    return result, time.perf_counter() - start


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.synthetic:
        return synthetic_main(args)
    if not args.model:
        raise SystemExit("give --model (a language model folder) or --synthetic (a synthetic run checkpoint)")
    return language_model_main(args)


def language_model_main(args) -> int:
    """The language-model section: perplexity of the exact model, of a kernel-truncation control, and of
    every distillation in ``--configs``, each saved and reloaded before it is scored."""
    import ssmhub

    script_start = time.perf_counter()
    base = ssmhub.H3ForCausalLM.from_pretrained(args.model)
    if base.config.decode_num_modes is not None:
        raise SystemExit(f"{args.model} is already distilled (decode_num_modes={base.config.decode_num_modes})")
    exact, exact_s = score(args.model, args)
    exact_ppl = exact["token_perplexity"]
    print(f"exact: token ppl {exact_ppl:.4f}, top-1 {exact['top1_accuracy']:.4f} ({exact_s:.0f} s)", flush=True)
    exact_bytes = sum(m.kv_state_bytes() for m in _long_conv_mixers(base))
    rows = [["exact", "-", "-", "-", f"{exact_bytes:,}", "-", f"{exact_ppl:.4f}", "-", _top1(exact), "-"]]

    def add_row(label, config, folder, errors="-", exact_heads="-", state="-", fit_s="-"):
        result, _ = score(folder, args)
        ppl = result["token_perplexity"]
        change = 100 * (ppl / exact_ppl - 1)
        within = "yes" if abs(change) <= 1 else "no"
        rows.append(
            [label, config, errors, exact_heads, state, fit_s, f"{ppl:.4f}", f"{change:+.3f}%", _top1(result), within]
        )
        print("  " + " | ".join(str(c) for c in rows[-1]), flush=True)

    with tempfile.TemporaryDirectory(prefix="h3_distillation.") as workdir:
        for taps in args.truncate_taps:
            folder = os.path.join(workdir, f"taps{taps}")
            truncated_copy(args.model, taps, folder)
            add_row("kernels cut to their first taps (control)", f"{taps} taps", folder)
        for spec in _lm_configs(args):
            method, modes, tolerance, eigensolver = _parse_config(spec)
            model = ssmhub.H3ForCausalLM.from_pretrained(args.model)
            start = time.perf_counter()
            reports = model.distill_for_decoding(modes, tolerance, method, eigensolver)
            fit_s = time.perf_counter() - start
            errors = torch.cat([r.errors for r in reports.values()])
            heads = sum(m.num_heads for m in _long_conv_mixers(model))
            folder = os.path.join(workdir, spec.replace(":", "_").replace("/", "_"))
            model.save_pretrained(folder)
            AutoTokenizer.from_pretrained(args.model).save_pretrained(folder)
            add_row(
                "distilled",
                spec,
                folder,
                errors=f"{errors.mean():.4f} / {errors.median():.4f} / {errors.max():.4f}",
                exact_heads=f"{sum(len(r.exact_heads) for r in reports.values())} / {heads}",
                state=f"{_state_bytes(reports):,}",
                fit_s=f"{fit_s:.1f}",
            )

    headers = [
        "model",
        "distillation (method:N[:tolerance])",
        "kernel rel. L2 error (mean / median / max)",
        "heads left exact",
        "long-conv decode state (bytes / sequence)",
        "fit s",
        "token ppl",
        "ppl change",
        "top-1 %",
        "within 1%",
    ]
    table = markdown_table(headers, rows)
    cfg = base.config
    notes = [
        f"- Model: `{args.model}`: H3, hidden {cfg.hidden_size}, {cfg.num_hidden_layers} layers, L_max "
        f"{cfg.max_kernel_length}, attention layers {list(cfg.attention_layers)}, vocab {cfg.vocab_size}.",
        f"- Scored with ssmhub-eval's code on {args.dataset} {args.split} as one stream: windows of "
        f"{args.max_length} tokens, stride {args.stride} (every scored token but the first window's sees at least "
        f"{args.max_length - args.stride} tokens of context), {exact['num_tokens']:,} tokens scored.",
        "- Control: every long-convolution kernel cut to its first taps (the exact regularized taps, zero beyond), "
        "saved as a model with that L_max; if it costs perplexity, the kernels' far taps matter and the "
        "distillation has something to lose.",
        "- Distilled models are saved and reloaded (`save_pretrained` / `from_pretrained`) before scoring; error "
        "column: the kernels the model now computes with (0 for heads left exact); decode state: the long "
        "convolutions' only (complex64 modes, float32 windows of L_max − 1 inputs for exact heads).",
        f"- Whole script wall time: {time.perf_counter() - script_start:.0f} s; torch threads "
        f"{torch.get_num_threads()}.",
    ]
    notes_text = "\n".join(notes)
    print()
    print(table)
    print()
    print(notes_text)
    if not args.no_write:
        path = write_report(
            args.name,
            "H3 distillation: perplexity of exact vs modal (distilled) long convolutions",
            ["## Results\n\n" + table, "## Notes\n\n" + notes_text],
        )
        print(f"\nwrote {path}")
    return 0


def _lm_configs(args) -> list[str]:
    """The language-model section's distillations: ``--configs`` when given, else ``--method:N`` per ``--modes``."""
    return args.configs or [f"{args.method}:{n}" for n in args.modes]


def _parse_config(spec: str) -> tuple[str, int, float | None, str]:
    """``method:N[:tolerance][/eigensolver]`` -> (method, N, tolerance or None, eigensolver, default truncated)."""
    fit, _, eigensolver = spec.partition("/")
    method, modes, *tolerance = fit.split(":")
    return method, int(modes), float(tolerance[0]) if tolerance else None, eigensolver or "truncated"


def _top1(result: dict) -> str:
    return f"{100 * result['top1_accuracy']:.2f}"


def _long_conv_mixers(model) -> list:
    return [m for m in model.modules() if type(m).__name__ == "H3Mixer"]


def truncated_copy(folder: str, taps: int, out: str) -> None:
    """Save ``folder``'s H3 with every long-convolution kernel cut to its first ``taps`` regularized taps.

    The copy has L_max = ``taps`` and no kernel regularizer, and its raw kernels are the original's regularized
    taps, so it computes with exactly the original's kernels up to ``taps`` and zero beyond. Checked: on an
    input no longer than ``taps`` the two models' logits agree.
    """
    import ssmhub
    from ssmhub.layers.longconv import LongConvKernel

    model = ssmhub.H3ForCausalLM.from_pretrained(folder).eval()
    if taps >= model.config.max_kernel_length:
        raise SystemExit(f"--truncate-taps {taps} must be below the model's L_max {model.config.max_kernel_length}")
    with torch.no_grad():
        kernels = {
            n + ".ssm.kernel": m.full_kernel()[:, :taps].clone()
            for n, m in model.named_modules()
            if isinstance(m, LongConvKernel) and m.max_kernel_length == model.config.max_kernel_length
        }
        config = copy.deepcopy(model.config)
        config.max_kernel_length, config.kernel_regularization_order = taps, []
        cut = ssmhub.H3ForCausalLM(config).eval()
        state = model.state_dict() | kernels
        cut.load_state_dict(state)
        probe = torch.randint(0, config.vocab_size, (1, taps))
        torch.testing.assert_close(cut(probe).logits, model(probe).logits, rtol=1e-4, atol=1e-4)
    cut.save_pretrained(out)
    AutoTokenizer.from_pretrained(folder).save_pretrained(out)


def _state_bytes(reports) -> int:
    return sum(r.state_bytes for r in reports.values())


def hsv_summary(model, plot_path: str | None) -> str:
    """Per layer: how many Hankel singular values each head needs before its tail's energy falls below 5%, 1%."""
    values = model.hankel_singular_values()
    rows = []
    for name, sigma in values.items():
        energy = sigma.double().pow(2)
        tail = (energy.flip(-1).cumsum(-1).flip(-1) / energy.sum(-1, keepdim=True)).sqrt()  # (H, T): ‖σ_{k≥r}‖/‖σ‖
        needed = [(tail > tol).sum(-1).float() for tol in (0.05, 0.01)]  # states r with tail(r) ≤ tol
        rows.append([name, sigma.shape[0], *(f"{n.median():.0f} / {n.max():.0f}" for n in needed)])
    if plot_path:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, len(values), figsize=(5 * len(values), 3.5), squeeze=False)
        for ax, (name, sigma) in zip(axes[0], values.items()):
            normed = sigma / sigma[:, :1].clamp(min=1e-30)
            for q in (0.1, 0.5, 0.9):
                ax.semilogy(normed.quantile(q, dim=0).numpy(), label=f"heads' {int(100 * q)}th percentile")
            ax.set(title=name, xlabel="k", ylabel="σ_k / σ_1", ylim=(1e-6, 1.5))
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(plot_path, dpi=90)
    headers = ["layer", "heads", "real states r for 5% tail (median / max)", "for 1% tail (median / max)"]
    return markdown_table(headers, rows)


def synthetic_main(args) -> int:
    """The synthetic section: exact vs distilled R² (token tasks: accuracy) of a trained ssmhub-synthetic H3."""
    from ssmhub.data.synthetic import fixed_eval_set
    from ssmhub.training.synthetic import SyntheticRunConfig, _build_model, evaluate, validate_run

    start_all = time.perf_counter()
    payload = torch.load(args.synthetic, weights_only=False, map_location="cpu")
    run = SyntheticRunConfig(**payload["config"])
    task, model_config, _ = validate_run(run)
    examples = args.eval_examples or run.eval_examples
    inputs, targets = fixed_eval_set(task, examples, seed=run.eval_seed)
    base = _build_model(task, model_config).eval()
    base.load_state_dict(payload["model"])
    metric, label = ("r2", "R²") if task.kind == "regression" else ("accuracy", "accuracy")
    exact_r2 = evaluate(base, task, inputs, targets, run.eval_batch_size, torch.device("cpu"))[metric]
    mixers = _long_conv_mixers(base.backbone)
    exact_bytes = sum(m.kv_state_bytes() for m in mixers)
    print(f"exact {label} {exact_r2:.4f}; exact long-conv state {exact_bytes} bytes per sequence", flush=True)
    rows = [["exact", "-", "-", "-", "-", f"{exact_bytes:,}", "-", f"{exact_r2:.4f}", "-"]]
    for spec in args.configs or SYNTHETIC_CONFIGS:
        method, modes, tolerance, eigensolver = _parse_config(spec)
        model = copy.deepcopy(base)
        begin = time.perf_counter()
        reports = model.backbone.distill_for_decoding(modes, tolerance, method, eigensolver)
        fit_s = time.perf_counter() - begin
        errors = torch.cat([r.fit_errors if tolerance is None else r.errors for r in reports.values()])
        exact_heads = sum(len(r.exact_heads) for r in reports.values())
        orders = torch.cat([r.orders[r.orders > 0] for r in reports.values()]).float()
        r2 = evaluate(model, task, inputs, targets, run.eval_batch_size, torch.device("cpu"))[metric]
        row = [
            method if eigensolver == "truncated" else f"{method} ({eigensolver} eigh)",
            modes,
            "-" if tolerance is None else tolerance,
            f"{errors.mean():.4f} / {errors.max():.4f}",
            f"{exact_heads} / {sum(m.num_heads for m in mixers)}",
            f"{_state_bytes(reports):,}",
            "-" if not orders.numel() else f"{orders.mean():.1f}",
            f"{r2:.4f}",
            f"{fit_s:.0f}",
        ]
        rows.append(row)
        print("  " + " | ".join(str(c) for c in row), flush=True)
    headers = [
        "fit",
        "N budget",
        "tolerance",
        "kernel rel. L2 error (mean / max)",
        "heads left exact",
        "long-conv decode state (bytes / sequence)",
        "mean order of distilled heads",
        label,
        "fit s",
    ]
    table = markdown_table(headers, rows)
    plot = None if args.no_write else os.path.join(os.path.dirname(__file__), "results", f"{args.name}_hsv.png")
    hsv = hsv_summary(base.backbone, plot)
    notes = "\n".join(
        [
            f"- Model: `ssmhub-synthetic` H3 on {run.task} (L {run.seq_len}), {run.num_layers} layers, width "
            f"{run.hidden_size}, {run.max_steps} steps × {run.batch_size}, lr {run.lr or 1e-3} ({run.lr_schedule}), "
            f"matmul precision {run.matmul_precision}, seed {run.seed}"
            + (f", vocab {run.vocab_size}, {run.num_kv_pairs} pairs" if run.task == "mqar" else "")
            + "; "
            + (
                f"R² is the mean batch R² over {examples} held-out examples"
                if metric == "r2"
                else f"accuracy over every labelled position of {examples} held-out examples"
            )
            + f" (eval seed {run.eval_seed}), as in synthetic.md.",
            "- `hankel` is the reference Hankel/ESPRIT fit (before issue 30), `best` the per-head best of it, "
            "balanced truncation and frequency-sampling poles; with a tolerance the order is chosen per head "
            "(1, 2, 4, … up to the budget) and a head no order fits within the tolerance stays exact.",
            "- Error column: without tolerance the fit's error of every head; with one, of the kernels the model now "
            "computes with (0 for exact heads). Decode state: the long convolutions' only (complex64 modes, float32 "
            "windows), per sequence; the shift convolutions add the same small window in every row.",
            f"- Whole run {time.perf_counter() - start_all:.0f} s; torch threads {torch.get_num_threads()}.",
        ]
    )
    print(table, "\n", hsv, "\n", notes, sep="\n")
    if not args.no_write:
        sections = [
            f"## Exact vs distilled {label}\n\n" + table,
            "## Notes\n\n" + notes,
            "## Hankel singular values of the trained kernels\n\n"
            + hsv
            + "\n\n![Hankel singular values]("
            + os.path.basename(plot)
            + ")",
        ]
        print(
            "wrote",
            write_report(args.name, f"H3 distillation on synthetic {run.task}: exact vs distilled {label}", sections),
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
