"""vLLM's entry point (``vllm.general_plugins``): every ssmhub causal-LM architecture served by ssmhub's adapter.

vLLM runs :func:`register` in each of its processes, possibly more than once; it only registers names (the model
class is imported lazily by vLLM where it builds the model). With it, ``LLM(model=FOLDER)`` and the OpenAI server
load any saved ssmhub causal-LM folder (``trust_remote_code=True`` folders too). A transformers
``MambaForCausalLM`` folder is served through ssmhub on a CPU, where vLLM's own Mamba-1 cannot run (its CPU build
has no selective-scan kernel); on other platforms vLLM's own Mamba stays in charge.
"""

from __future__ import annotations

__all__ = ["register"]

_MODEL_CLASS = "ssmhub.serving.vllm_model:SsmhubForCausalLM"
_HYBRID_MODEL_CLASS = "ssmhub.serving.vllm_model:SsmhubHybridForCausalLM"  # H3: attention layers beside recurrent


def register() -> None:
    from vllm import ModelRegistry
    from vllm.model_executor.models.config import MODELS_CONFIG_MAP
    from vllm.platforms import current_platform

    import ssmhub  # noqa: F401  (registers every family's config with AutoConfig, which vLLM reads the folder with)

    from .servable import SERVED_ARCHITECTURES
    from .vllm_config import SsmhubHybridModelConfig, SsmhubModelConfig

    for architecture in SERVED_ARCHITECTURES:
        if architecture == "MambaForCausalLM" and not current_platform.is_cpu():
            continue
        hybrid = architecture == "H3ForCausalLM"
        ModelRegistry.register_model(architecture, _HYBRID_MODEL_CLASS if hybrid else _MODEL_CLASS)
        # one state slot per request, the hybrid's caches paged together, the folder checked before engines start
        MODELS_CONFIG_MAP[architecture] = SsmhubHybridModelConfig if hybrid else SsmhubModelConfig
