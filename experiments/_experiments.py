"""Imported first by every study here: benchmarks/'s helpers (``_report``) become importable, and the reports they
write go to ``experiments/results/`` instead of ``benchmarks/results/``."""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "benchmarks"))

import _report  # noqa: E402

_report.RESULTS_DIR = os.path.join(HERE, "results")
