"""Packed vs padded training throughput on WikiText-103's real article lengths (issue 26 §1).

The same tokens are trained on three ways, per family (DLR, H3 with pure long convolutions, Mamba as
``SerpentConfig(resampling_rates=[])``, BDLRNN), at a small size:

- ``padded``: every article cut into ``seq_len`` windows, its last window right-padded (``attention_mask`` 0,
  labels -100), each window a row;
- ``packed (generic)``: the articles back to back in rows of ``seq_len``, ``position_ids`` restarting at 0 at
  every article start (and at a row start, as ``DataCollatorWithFlattening`` gives them), labels -100 on each
  document's first token, every mixer forced through the protocol's batch of documents
  (:meth:`TokenMixer._forward_documents`, an (S, W) batch: S documents, W the longest);
- ``packed (native)``: the same rows through each mixer's own packed form where it has one.

A training step is forward, backward and an AdamW step. Throughput is real (non-padding) tokens per second
per training step (the data's mean: padded rows hold ``1 − padding fraction`` real tokens) over the median step
time of ``--repeats`` passes over a few batches spread through the data. The padding
fraction is the share of padded slots in the padded rows; packing can at best remove it, so the best possible
packed/padded ratio is 1 / (1 − padding fraction) (printed for a sweep of ``seq_len``).

    SSMHUB_DATA_DIR=../shared/data python benchmarks/packing.py --threads 1
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import markdown_table, median, write_report


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", default=os.environ.get("SSMHUB_DATA_DIR"), help="the shared data folder")
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[512, 2048], help="row lengths timed")
    parser.add_argument("--tokens-per-step", type=int, default=2048, help="batch size × seq_len")
    parser.add_argument("--batches", type=int, default=1, help="batches timed per pass, spread through the data")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--families", nargs="+", default=["dlr", "h3", "mamba", "bdlrnn"])
    parser.add_argument("--mixers-only", action="store_true", help="time one mixer alone, native vs generic form")
    parser.add_argument("--no-write", action="store_true")
    return parser.parse_args(argv)


def article_token_ids(data_dir: str) -> list[list[int]]:
    """WikiText-103 valid + test articles (every article whole: the real length distribution), GPT-2 tokens."""
    from transformers import AutoTokenizer

    from ssmhub.data.wikitext import load_wikitext, wikitext_articles

    tokenizer = AutoTokenizer.from_pretrained(os.path.join(data_dir, "tokenizers", "gpt2"))
    articles = []
    for split in ("validation", "test"):
        articles += wikitext_articles(load_wikitext("wikitext-103", split, data_dir))
    return [tokenizer(text)["input_ids"] for text in articles]


def padded_rows(docs: list[list[int]], seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each article cut into seq_len windows, the last one right-padded: (ids (R, L), attention_mask (R, L))."""
    ids, mask = [], []
    for doc in docs:
        for begin in range(0, len(doc), seq_len):
            window = doc[begin : begin + seq_len]
            ids.append(window + [0] * (seq_len - len(window)))
            mask.append([1] * len(window) + [0] * (seq_len - len(window)))
    return torch.tensor(ids), torch.tensor(mask)


def packed_rows(docs: list[list[int]], seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The articles back to back in rows of seq_len (the tail that fills no row is dropped): (ids, position_ids),
    positions restarting at 0 at each article and at each row start."""
    stream, starts = [], []
    for doc in docs:
        stream += doc
        starts += [True] + [False] * (len(doc) - 1)
    rows = len(stream) // seq_len
    ids = torch.tensor(stream[: rows * seq_len]).view(rows, seq_len)
    starts = torch.tensor(starts[: rows * seq_len]).view(rows, seq_len)
    starts[:, 0] = True  # a row starting mid-article starts a document there
    index = torch.arange(seq_len).expand(rows, seq_len)
    return ids, index - torch.where(starts, index, 0).cummax(dim=1).values  # (R, L) position in its document


def padding_fraction(docs: list[list[int]], seq_len: int) -> float:
    slots = sum(-(-len(d) // seq_len) * seq_len for d in docs)
    return 1 - sum(len(d) for d in docs) / slots


def make_model(family: str, args, seq_len: int):
    from transformers import AutoModelForCausalLM

    from ssmhub import BDLRNNConfig, DLRConfig, H3Config, SerpentConfig

    common = {"hidden_size": args.hidden_size, "num_hidden_layers": args.layers, "vocab_size": 50257}
    config = {
        "dlr": lambda: DLRConfig(state_size=64, **common),
        "h3": lambda: H3Config(
            max_kernel_length=seq_len, attention_layers=[], intermediate_size=4 * args.hidden_size, **common
        ),
        "mamba": lambda: SerpentConfig(resampling_rates=[], **common),
        "bdlrnn": lambda: BDLRNNConfig(block_size=8, **common),
    }[family]()
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config)


@contextlib.contextmanager
def generic_packing():
    """Every mixer through the protocol's batch of documents (``native_packing`` off)."""
    from ssmhub.layers import BDLRNNMixer, CausalSelfAttention, MambaMixer, SerpentMixer

    classes = (BDLRNNMixer, CausalSelfAttention, MambaMixer, SerpentMixer)
    for cls in classes:
        cls.native_packing = False
    try:
        yield
    finally:
        for cls in classes:
            cls.native_packing = True


def batches(rows: dict[str, torch.Tensor], batch_size: int, count: int) -> list[dict[str, torch.Tensor]]:
    """``count`` batches spread evenly through the rows (the data's order, so articles stay in their rows)."""
    total = next(iter(rows.values())).shape[0] // batch_size
    picks = torch.linspace(0, total - 1, count).round().long().tolist()
    return [{k: v[i * batch_size : (i + 1) * batch_size] for k, v in rows.items()} for i in picks]


def train_inputs(kind: str, batch: dict[str, torch.Tensor]) -> dict:
    """Model inputs with labels."""
    ids = batch["input_ids"]
    if kind == "padded":
        mask = batch["attention_mask"]
        return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}
    labels = ids.masked_fill(batch["position_ids"] == 0, -100)  # the collator's rule: no loss on a first token
    return {"input_ids": ids, "position_ids": batch["position_ids"], "labels": labels}


def step_times(model, optimizer, kind: str, sample: list[dict]) -> list[float]:
    """Seconds of one training step (forward, backward, AdamW) on each batch of the sample."""
    times = []
    for batch in sample:
        inputs = train_inputs(kind, batch)
        start = time.perf_counter()
        model(**inputs).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return times


NATIVE = {"mamba", "bdlrnn"}  # families whose mixers have a native packed form (DLR and H3 run the generic one)


def measure(family: str, args, seq_len: int, data: dict[str, dict]) -> dict[str, float]:
    """Real tokens per second per mode: the data's mean real tokens per step (padded: B·L·(1 − padding fraction);
    packed: B·L) over the median step time. A step's time does not depend on which tokens are padding, so this
    counts every mode's padding at the data's rate whatever batches the timing samples. The modes take turns
    within each repeat, so a change of load hits them alike."""
    batch_size = max(1, args.tokens_per_step // seq_len)
    model = make_model(family, args, seq_len).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    modes = {"padded": ("padded", contextlib.nullcontext), "packed (native)": ("packed", contextlib.nullcontext)}
    if family in NATIVE:
        modes["packed (generic)"] = ("packed", generic_packing)
    samples = {kind: batches(data[kind], batch_size, args.batches) for kind in ("padded", "packed")}
    real = {"padded": float(data["padded"]["attention_mask"].float().mean()), "packed": 1.0}  # real share of slots
    times = {label: [] for label in modes}
    for repeat in range(args.repeats + 1):  # pass 0 warms up
        for label, (kind, context) in modes.items():
            with context():
                spent = step_times(model, optimizer, kind, samples[kind][:1] if repeat == 0 else samples[kind])
            if repeat:
                times[label] += spent
    slots = batch_size * seq_len
    results = {label: slots * real[modes[label][0]] / median(t) for label, t in times.items()}
    results.setdefault("packed (generic)", results["packed (native)"])  # the same code path
    return results


def mixer_timings(args, docs: list[list[int]]) -> str:
    """One mixer alone (forward + backward) on the packed rows' document starts: native vs generic packed form,
    ms per step, median of ``--repeats`` (after one warm-up), the modes taking turns."""
    from ssmhub.layers import BDLRNNMixer, MambaMixer

    makers = {"mamba": lambda: MambaMixer(args.hidden_size), "bdlrnn": lambda: BDLRNNMixer(args.hidden_size)}
    rows = []
    for seq_len in args.seq_lens:
        batch_size = max(1, 4 * args.tokens_per_step // seq_len)  # 4× the training batch: rows hold their share
        _, positions = packed_rows(docs, seq_len)
        picks = torch.linspace(0, positions.shape[0] - 1, batch_size).round().long()  # rows spread through the data
        starts = positions[picks] == 0  # (B, L)
        x = torch.randn(batch_size, seq_len, args.hidden_size)
        for family in args.families:
            if family not in makers:
                continue
            torch.manual_seed(0)
            mixer = makers[family]()
            times = {"native": [], "generic": []}
            for repeat in range(args.repeats + 1):
                for mode, context in (("native", contextlib.nullcontext), ("generic", generic_packing)):
                    with context():
                        start = time.perf_counter()
                        mixer(x, document_starts=starts)[0].sum().backward()
                        if repeat:
                            times[mode].append(time.perf_counter() - start)
            native, generic = median(times["native"]) * 1e3, median(times["generic"]) * 1e3
            docs_in = int(starts.sum())
            rows.append(
                [family, seq_len, batch_size, docs_in, f"{generic:.0f}", f"{native:.0f}", f"{generic / native:.2f}×"]
            )
            print(rows[-1], flush=True)
    headers = ["mixer", "seq_len", "batch", "documents", "generic ms", "native ms", "native speed-up"]
    return markdown_table(headers, rows)


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    docs = article_token_ids(args.data_dir)
    if args.mixers_only:
        table = mixer_timings(args, docs)
        print(table)
        if not args.no_write:
            note = f"Threads: {args.threads}; one mixer, hidden {args.hidden_size}, forward + backward, random x."
            write_report("packing_mixers", "Native vs generic packed form, one mixer alone", [note, table])
        return 0
    lengths = sorted(len(d) for d in docs)
    stats = [
        ("articles", len(docs)),
        ("tokens", sum(lengths)),
        ("median / mean article length", f"{lengths[len(lengths) // 2]} / {sum(lengths) / len(lengths):.0f}"),
    ]
    sweep = [
        (L, f"{padding_fraction(docs, L):.1%}", f"{1 / (1 - padding_fraction(docs, L)):.2f}×")
        for L in (256, 512, 1024, 2048, 4096, 8192)
    ]
    sweep_table = markdown_table(["seq_len", "padding fraction", "best packed/padded = 1/(1 − p)"], sweep)
    print(markdown_table(["WikiText-103 valid+test", "value"], stats), sweep_table, sep="\n\n")
    rows, sections = [], []
    for seq_len in args.seq_lens:
        pad_ids, pad_mask = padded_rows(docs, seq_len)
        pack_ids, pack_pos = packed_rows(docs, seq_len)
        data = {
            "padded": {"input_ids": pad_ids, "attention_mask": pad_mask},
            "packed": {"input_ids": pack_ids, "position_ids": pack_pos},
        }
        docs_per_row = float((pack_pos == 0).sum()) / pack_ids.shape[0]
        for family in args.families:
            r = measure(family, args, seq_len, data)
            base = r["padded"]
            rows.append(
                [
                    family,
                    seq_len,
                    max(1, args.tokens_per_step // seq_len),
                    f"{padding_fraction(docs, seq_len):.1%}",
                    f"{docs_per_row:.2f}",
                    f"{base:.0f}",
                    f"{r['packed (generic)']:.0f} ({r['packed (generic)'] / base:.2f}×)",
                    f"{r['packed (native)']:.0f} ({r['packed (native)'] / base:.2f}×)"
                    if family in NATIVE
                    else "— (generic form)",
                    f"{r['packed (native)'] / r['packed (generic)']:.2f}×" if family in NATIVE else "—",
                ]
            )
            print(rows[-1], flush=True)
    headers = [
        "family",
        "seq_len",
        "batch",
        "padding",
        "docs/row",
        "padded tok/s",
        "packed generic tok/s (vs padded)",
        "packed native tok/s (vs padded)",
        "native vs generic",
    ]
    table = markdown_table(headers, rows)
    print(table)
    sections = [
        f"Threads: {args.threads}. Model: hidden {args.hidden_size}, {args.layers} layers, GPT-2 vocabulary "
        f"(50,257); {args.tokens_per_step} token slots per step; {args.batches} batches per pass, median of "
        f"{args.repeats} passes.",
        markdown_table(["WikiText-103 valid+test", "value"], stats),
        sweep_table,
        table,
    ]
    if not args.no_write:
        write_report("packing", "Packed vs padded training throughput (WikiText-103 article lengths)", sections)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
