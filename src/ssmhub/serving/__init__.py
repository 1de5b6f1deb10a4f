"""Serving ssmhub models with an engine that owns requests, batches and state slots (vLLM): an adapter above the
models, never a second model. :mod:`.flat_batch` maps an engine's flat batch onto the mixer protocol,
:mod:`.state_pages` a mixer's state onto a slot's bytes, :mod:`.servable` says what can be served;
:mod:`.vllm_plugin` (vLLM's entry point) and :mod:`.vllm_model` are the only modules that import vLLM."""
