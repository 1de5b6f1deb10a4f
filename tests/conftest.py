"""Session-wide test settings: tokenized-window caches go to a temporary folder, never ~/.cache; tensors go to
the device named by ``$SSMHUB_TEST_DEVICE`` (default: the CPU; benchmarks/gpu_suite.py sets ``cuda``)."""

from __future__ import annotations

import getpass
import os
import tempfile

import pytest
import torch

from ssmhub.data import CACHE_DIR_ENV

TEST_DEVICE_ENV = "SSMHUB_TEST_DEVICE"
FAILURE_LOG_ENV = "SSMHUB_TEST_FAILURE_LOG"  # benchmarks/gpu_suite.py: each failure's traceback, as it happens


def _run_tests_on(device: str) -> None:
    """Make ``device`` torch's default device, and ``torch.Generator()`` a generator on it (tests seed their
    inputs with generators, which would otherwise stay on the CPU and refuse a CUDA default device)."""
    torch.set_default_device(device)
    cpu_generator = torch.Generator

    class DefaultDeviceGenerator(cpu_generator):
        def __new__(cls, device=None):
            return cpu_generator.__new__(cls, device if device is not None else torch.get_default_device())

    torch.Generator = DefaultDeviceGenerator


if os.environ.get(TEST_DEVICE_ENV, "cpu") != "cpu":
    _run_tests_on(os.environ[TEST_DEVICE_ENV])


def _inductor_cache_per_capability() -> None:
    """One torch.compile cache per ``ATEN_CPU_CAPABILITY`` (``make test`` and ``make test-portable`` run one after
    the other). Inductor writes a graph's C++ for the vector ISA that variable picks, but its graph cache keys the
    graph without it, so a process of the other capability gets code it then builds for its own ISA: SeRpEnt's
    compiled decode step gave wrong numbers from AVX-512 code built for AVX2, and aborted the other way round."""
    base = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or os.path.join(
        tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}"
    )
    capability = os.environ.get("ATEN_CPU_CAPABILITY", "default")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(base, f"capability-{capability}")


_inductor_cache_per_capability()


@pytest.fixture
def one_thread():
    """One torch thread for the test (``pytestmark = pytest.mark.usefixtures("one_thread")``): small batched LAPACK
    calls (the modal fits, the Hankel eigensolvers) run fastest and steadiest so on a shared 2-core CI machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True, scope="session")
def _token_cache_in_tmp(tmp_path_factory):
    previous = os.environ.get(CACHE_DIR_ENV)
    os.environ[CACHE_DIR_ENV] = str(tmp_path_factory.mktemp("ssmhub-cache"))  # subprocesses inherit it
    yield
    if previous is None:
        os.environ.pop(CACHE_DIR_ENV, None)
    else:
        os.environ[CACHE_DIR_ENV] = previous


@pytest.fixture(autouse=True, scope="session")
def _hugging_face_caches_in_tmp(tmp_path_factory):
    """``evaluate``'s module copies go to a temporary folder, never ~/.cache: it reads these variables when first
    imported, inside a test. ``datasets`` is imported while tests are collected, so a test that loads files
    through it passes its own ``cache_dir``."""
    names = ("HF_MODULES_CACHE", "HF_EVALUATE_CACHE", "HF_DATASETS_CACHE")
    previous = {name: os.environ.get(name) for name in names}
    root = tmp_path_factory.mktemp("hf-cache")
    os.environ.update({name: str(root / name.lower()) for name in names})
    yield
    for name, value in previous.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def pytest_runtest_logreport(report):
    """With ``$SSMHUB_TEST_FAILURE_LOG`` set, append each failure's traceback to that file when it happens (in the
    controlling process under pytest-xdist), so that a run stopped by a time limit still tells why tests failed."""
    path = os.environ.get(FAILURE_LOG_ENV)
    if not path or not report.failed or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    with open(path, "a", encoding="utf-8") as log:
        log.write(f"### {report.nodeid} ({report.when})\n\n```\n{report.longreprtext[-4000:]}\n```\n\n")
