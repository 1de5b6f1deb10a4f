"""benchmarks/_memory.py: the peak resident memory of a block, against allocations of known size."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
from _memory import peak_rss_above_baseline, peak_rss_available

MB = 2**20
pytestmark = pytest.mark.skipif(not peak_rss_available(), reason="needs Linux's VmHWM and clear_refs")


def test_peak_counts_what_setup_keeps_and_block_allocates_but_not_setup_transients():
    def setup():
        transient = torch.ones(200 * MB // 4)  # touched, then freed: must not count
        del transient
        return torch.ones(40 * MB // 4)  # kept: counts

    def block(kept):
        scratch = torch.ones(100 * MB // 4)  # counts at its peak
        return float(scratch[0] + kept[0])

    nbytes, kept = peak_rss_above_baseline(setup, block)
    assert kept.numel() == 40 * MB // 4
    assert 140 * MB - 2 * MB <= nbytes <= 140 * MB + 30 * MB, nbytes / MB
