"""What README.md and docs/ say about the code and the measurements stays true: read from the code and the results.

Defaults and choices are read from the code (the options' tuples, the scan choice, the command-line parsers), and
the GPU numbers and card name from ``benchmarks/results/gpu.md``, so a change on either side that leaves a page
behind fails here, naming the page and the claim.
"""

from __future__ import annotations

import itertools
import re
import shlex
import types
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
GPU_RESULTS = ROOT / "benchmarks" / "results" / "gpu.md"
SHELL_BLOCK = re.compile(r"^```[a-z]*\n(.*?)^```", re.S | re.M)
OPTIONAL_PART = re.compile(r"\[(--[^\[\]]*)\]")  # "[--mixed_precision bf16]" in a usage line


def page_text(name: str) -> str:
    return (ROOT / name).read_text(encoding="utf-8")


def joined(text: str) -> str:
    """A page's text with line breaks inside sentences made spaces (a claim may wrap)."""
    return re.sub(r"\s*\n\s*", " ", text)


# --------------------------------------------------------------------------------------------- ssmhub-train's flags
def test_every_ssmhub_train_flag_has_a_one_line_help():
    from ssmhub.training.config import TrainConfig, build_arg_parser

    parser = build_arg_parser()
    flags = {action.dest: action for action in parser._actions if action.dest not in ("help", "config")}
    assert set(flags) == set(TrainConfig.field_names())
    for name, action in flags.items():
        what = (action.help or "").split(" Default: ")[0]
        assert len(what.split()) >= 3 and "\n" not in what, f"--{name} has no help of its own: {action.help!r}"
        assert "%" not in action.help, f"--{name}: argparse would read % in {action.help!r}"


def train_commands() -> list[tuple[str, list[str]]]:
    """Every ``ssmhub-train`` command (also ``-m ssmhub.training.cli`` under a launcher) in the pages' non-Python
    code blocks: (page, its arguments), comments and ``[...]`` optional parts' brackets dropped."""
    commands = []
    for page in PAGES:
        for block in SHELL_BLOCK.findall(page.read_text(encoding="utf-8")):
            if block.lstrip().startswith(("import ", "from ")):
                continue
            for line in block.replace("\\\n", " ").splitlines():
                if "ssmhub-train" not in line and "ssmhub.training.cli" not in line:
                    continue
                words = shlex.split(OPTIONAL_PART.sub(r"\1", line), comments=True)
                for start in ("ssmhub-train", "ssmhub.training.cli"):
                    if start in words:
                        argv = [word for word in words[words.index(start) + 1 :] if word != "..."]  # "...": the rest
                        commands.append((page.relative_to(ROOT).as_posix(), argv))
    return commands


TRAIN_COMMANDS = train_commands()


def test_the_docs_show_ssmhub_train_commands():
    pages = {page for page, _ in TRAIN_COMMANDS}
    assert {"docs/long-documents.md", "docs/training.md"} <= pages, pages


@pytest.mark.parametrize("page,argv", TRAIN_COMMANDS, ids=[f"{p}:{' '.join(a)[:60]}" for p, a in TRAIN_COMMANDS])
def test_every_ssmhub_train_command_of_the_docs_parses(page, argv, tmp_path):
    """Its flags exist and take the values shown; a stateful one names a model that stateful training accepts."""
    from ssmhub.preflight import check_stateful_model
    from ssmhub.training.config import config_from_args
    from ssmhub.training.trainer import _model_config_alone

    if "--config" in argv:  # run.yaml stands for the reader's file: an empty one here
        argv[argv.index("--config") + 1] = str(tmp_path / "run.yaml")
        (tmp_path / "run.yaml").write_text("{}\n", encoding="utf-8")
    config = config_from_args(argv)
    if config.stateful:
        check_stateful_model(_model_config_alone(config), "the model", "(other model)", "(window)")


def test_the_long_documents_page_trains_every_family_statefully():
    import ssmhub  # noqa: F401  (registers the families)
    from ssmhub.models.auto import FAMILIES

    stateful_types = {
        next((a for f, a in itertools.pairwise(argv) if f == "--model_type"), "dlr")
        for page, argv in TRAIN_COMMANDS
        if page == "docs/long-documents.md" and "--stateful" in argv
    }
    assert set(FAMILIES) <= stateful_types, stateful_types


# --------------------------------------------------------------------------------------------- defaults and choices
@pytest.mark.parametrize(
    "module,owner",
    [("ssmhub.layers.bdlrnn_options", "BDLRNNConfig"), ("ssmhub.layers.mamba_options", "SerpentConfig")],
)
def test_the_gpu_page_lists_each_scan_choice_of_the_code(module, owner):
    import importlib

    choices = importlib.import_module(module).SCANS
    row = re.search(rf"`{owner}\(scan=(.*?)\)`", page_text("docs/gpu.md"))
    assert row, f"docs/gpu.md names no {owner}(scan=...)"
    assert set(re.findall(r'"(\w+)"', row.group(1))) == set(choices)


def test_the_gpu_page_lists_the_fft_backends_of_the_code():
    from ssmhub.layers.longconv_options import LongConvOptions
    from ssmhub.ops.fftconv import BACKENDS

    row = re.search(r"`H3Config\(fft_backend=(.*?)\)`", page_text("docs/gpu.md"))
    listed = re.findall(r'"(\w+)"', row.group(1))
    assert set(listed) == set(BACKENDS) and listed[0] == LongConvOptions.fft_backend


def test_auto_scans_take_the_triton_kernel_on_cuda_as_the_pages_say(monkeypatch):
    """BDLRNN's ``scan="auto"`` (the default of both scans) picks the Triton kernel for float32 blocks on CUDA where
    the kernel can run, else the parallel scan there and the loop on the CPU; docs/families/bdlrnn.md and
    docs/gpu.md say so."""
    from ssmhub.layers import bdlrnn
    from ssmhub.layers.bdlrnn_options import BDLRNNOptions
    from ssmhub.layers.mamba_options import MambaOptions

    assert BDLRNNOptions.scan == MambaOptions.scan == "auto"
    blocks = types.SimpleNamespace(
        is_cuda=True, dtype=torch.float32, device=torch.device("cuda"), shape=(1, 4, 2, 8, 8)
    )
    monkeypatch.setattr(bdlrnn, "can_run_block_scan", lambda device, size: (True, ""))
    assert bdlrnn._choose_scan("auto", blocks) == "triton"
    monkeypatch.setattr(bdlrnn, "can_run_block_scan", lambda device, size: (False, "triton: not installed"))
    assert bdlrnn._choose_scan("auto", blocks) == "parallel"
    assert bdlrnn._choose_scan("auto", torch.zeros(1, 4, 2, 8, 8)) == "sequential"
    bdlrnn = joined(page_text("docs/families/bdlrnn.md"))
    assert re.search(r'the default `scan="auto"` takes the Triton kernel .*? on CUDA', bdlrnn)
    assert "parallel scan on CUDA and the loop on CPU" not in bdlrnn
    gpu_table = re.search(r"block-diagonal LRNN scan \| (.*?) \|", page_text("docs/gpu.md")).group(1)
    assert gpu_table.startswith("Triton kernel")


# --------------------------------------------------------------------------------------------- GPU results
def cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def results_table(section: str, index: int = 0) -> list[dict[str, str]]:
    """The ``index``-th table under the heading of gpu.md that starts with ``section``, one dict per row."""
    text = GPU_RESULTS.read_text(encoding="utf-8")
    lines = text[text.index(f"## {section}") :].split("\n## ")[0].splitlines()
    tables, current = [], []
    for line in [*lines, ""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            tables.append(current)
            current = []
    header, _, *rows = tables[index]
    return [dict(zip(cells(header), cells(row))) for row in rows]


def number(cell: str) -> float:
    return float(re.search(r"[\d,.]+", cell).group(0).replace(",", ""))


def card() -> str:
    """The card's model name in gpu.md (``H100`` of "NVIDIA H100 80GB HBM3")."""
    device = re.search(r"^Device: NVIDIA (\S+)", GPU_RESULTS.read_text(encoding="utf-8"), re.M)
    return device.group(1)


def stated(text: str, value: float) -> bool:
    """Whether ``text`` (a number as a page writes it) is ``value`` rounded to the digits the page shows."""
    decimals = len(text.split(".")[1]) if "." in text else 0
    return abs(float(text) - value) <= 0.5 * 10**-decimals + 1e-9


def test_pages_name_only_the_card_the_results_were_measured_on():
    cards = re.compile(r"\b(?:[AHBL]\d{2,3}|V100|T4|RTX \d{4})\b")
    for page in PAGES:
        for named in cards.findall(page.read_text(encoding="utf-8")):
            assert named == card(), f"{page.relative_to(ROOT)} names {named}; benchmarks/results/gpu.md, {card()}"


def test_decode_speed_ups_on_the_pages_are_the_results():
    speed_ups = {row["family"]: number(row["speed-up"]) for row in results_table("d. Decode")}
    ms = [number(row["graph ms/token"]) for row in results_table("d. Decode")]
    decoding = joined(page_text("docs/decoding.md"))
    low, high, fast, slow = re.search(
        r"ran ([\d.]+)× \(DLR\) to ([\d.]+)× \(Mamba, BDLRNN\) .*? ([\d.]+)–([\d.]+) ms/token", decoding
    ).groups()
    assert stated(low, speed_ups["dlr"]) and stated(high, max(speed_ups.values()))
    assert stated(high, speed_ups["mamba"]) and stated(high, speed_ups["bdlrnn"])
    assert stated(fast, min(ms)) and stated(slow, max(ms))
    gpu = joined(page_text("docs/gpu.md"))
    low, high = re.search(r"CUDA graph\*\*: ([\d.]+)× to ([\d.]+)× eager", gpu).groups()
    assert stated(low, min(speed_ups.values())) and stated(high, max(speed_ups.values()))
    readme = joined(page_text("README.md"))
    low, high = re.search(r"CUDA graphs \((\d+)-(\d+)× eager decode", readme).groups()
    assert stated(low, min(speed_ups.values())) and stated(high, max(speed_ups.values()))
    assert "not yet timed on a GPU" not in decoding


def test_training_ratios_against_gpt2_on_the_gpu_page_are_the_results():
    ratios = {row["model (width × layers)"].split()[0]: number(row["vs GPT-2"]) for row in results_table("e. Train")}
    gpu = joined(page_text("docs/gpu.md"))
    names = {"DLR": "dlr", "H3": "h3", "Mamba": "mamba", "BDLRNN": "bdlrnn", "SeRpEnt": "serpent"}
    claim = re.search(r"every family was slower than GPT-2 there, (.*?) \(section e", gpu).group(1)
    found = dict(re.findall(r"(\w+) ([\d.]+)×", claim))
    assert set(found) == set(names)
    for label, family in names.items():
        assert stated(found[label], ratios[family]), (label, found[label], ratios[family])
    assert all(ratios[family] < 1 for family in names.values())  # "every family was slower"


def test_scan_speed_ups_on_the_pages_are_the_results():
    selective = results_table("b. Scan")
    at = {row["T"]: row for row in selective}
    gpu = joined(page_text("docs/gpu.md"))
    claim = re.search(r"selective scan's Triton kernel ([\d.]+)× the pure-torch chunked scan at T (\d+)", gpu)
    assert stated(claim.group(1), number(at[claim.group(2)]["Triton speed-up over torch"]))
    low, t_low, high, t_high = re.search(
        r"block scan's ([\d.]+)× torch's parallel scan at T (\d+) \(([\d.]+)× at T (\d+)\)", gpu
    ).groups()
    block = {row["T"]: number(row["Triton speed-up over torch"]) for row in results_table("b. Scan", index=1)}
    assert stated(low, block[t_low]) and stated(high, block[t_high])
    page = joined(page_text("docs/families/bdlrnn.md"))
    low, t_low, high, t_high = re.search(
        r"ran ([\d.]+)× the parallel scan's speed at T (\d+) and ([\d.]+)× at T (\d+)", page
    ).groups()
    assert stated(low, block[t_low]) and stated(high, block[t_high])


def test_the_device_tests_state_on_the_gpu_page_is_the_results():
    text = joined(GPU_RESULTS.read_text(encoding="utf-8"))
    failed, passed = re.search(r"Stopped at the budget: (\d+) failed, (\d+) passed", text).groups()
    percent = re.search(r"progress (\d+)%", text).group(1)
    gpu = joined(page_text("docs/gpu.md"))
    claim = re.search(r"stopped by the suite's deadline at (\d+)%, with (\d+) passed and (\d+) failed", gpu)
    assert claim and claim.groups() == (percent, passed, failed)
