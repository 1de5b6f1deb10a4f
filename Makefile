# ssmhub: every target sets itself up on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Offline data (WikiText, PG-19, tokenizers); unset it to use the Hugging Face Hub as a user would.
SSMHUB_DATA_DIR ?= $(if $(wildcard ../shared/data),$(abspath ../shared/data),)
export SSMHUB_DATA_DIR

.PHONY: venv demo test test-all lint bench clean

$(VENV)/.installed: setup.py pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned to the CPU wheel on these machines, so no CUDA build is downloaded
	$(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(PY) -m ssmhub.demo

lint: venv
	$(PY) -m ruff check src tests benchmarks examples

test: lint
	$(PY) -m pytest -q

test-all: lint
	$(PY) -m pytest -q -m ""

bench: venv
	$(PY) benchmarks/decode_vs_context.py
	$(PY) benchmarks/fftconv_vs_direct.py
	$(PY) benchmarks/train_throughput.py

clean:
	rm -rf $(VENV) runs build dist src/*.egg-info .pytest_cache .ruff_cache
