"""Publishing a trained model: its model card (``README.md``) and the upload to the Hugging Face Hub."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..fileio import write_text_atomic
from ..metrics.functional import perplexity
from ..preflight import first_line

__all__ = ["HubPushError", "push_folder_to_hub", "render_model_card", "write_model_card"]


class HubPushError(RuntimeError):
    """The upload to the Hub failed (the local folder is complete)."""


def _fmt(value) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


_WITH_CODE = """Without ssmhub, the folder carries the model's code (saved with `--save_code`):

```python
from transformers import AutoModelForCausalLM, AutoTokenizer

model = AutoModelForCausalLM.from_pretrained("{where}", trust_remote_code=True)
tokenizer = AutoTokenizer.from_pretrained("{where}", trust_remote_code=True)
```"""

_WITHOUT_CODE = """The tokenizer is a plain transformers tokenizer and loads without ssmhub
(`AutoTokenizer.from_pretrained("{where}")`); the model needs `pip install ssmhub` (this folder was saved
without `--save_code`, so it carries no code for `trust_remote_code=True`)."""

# The model card; render_model_card fills its fields (str.format).
_MODEL_CARD = """---
library_name: transformers
tags:
- ssmhub
- {model_type}
- text-generation
datasets:
- {data}
{base_model_metadata}---

# {model_type} language model trained with ssmhub

A `{model_type}` causal language model (ssmhub family `{model_type}`; {size})
trained with `ssmhub-train`{continued_from} on **{data}** for **{steps}** optimizer steps
(**{tokens_seen:,}** tokens seen, windows of {seq_len} tokens). Tokenizer: {tokenizer}.

## Results

| metric | value |
|---|---|
{metric_rows}

Perplexity is token-level under this model's own tokenizer (not comparable to word-level results).

## How to load it

With ssmhub installed (`import ssmhub` registers the family with the Auto classes):

```python
import ssmhub
from transformers import AutoModelForCausalLM, AutoTokenizer

model = AutoModelForCausalLM.from_pretrained("{where}")
tokenizer = AutoTokenizer.from_pretrained("{where}")
```

{without_ssmhub}

## Model config

```json
{model_config_json}
```

## Training config

```json
{train_config_json}
```
"""


def render_model_card(
    *,
    model_type: str,
    model_config: dict,
    train_config: dict,
    steps: int,
    tokens_seen: int,
    metrics: dict,
    repo_id: str | None = None,
    with_code: bool = False,
) -> str:
    """The README.md of a trained model folder: family, config, data, steps, tokens, metrics and how to load it."""
    size_fields = [k for k in ("hidden_size", "num_hidden_layers", "state_size", "vocab_size") if k in model_config]
    data = train_config.get("dataset")
    base_model = train_config.get("model_name_or_path")
    tokenizer = (
        train_config.get("tokenizer")
        or (f"the one of `{base_model}`" if base_model else None)
        or f"byte-level BPE of {train_config.get('vocab_size')} tokens trained on the {data} train split"
    )
    on_the_hub = base_model and not Path(base_model).exists()  # the Hub's base_model field takes repo ids only
    return _MODEL_CARD.format(
        model_type=model_type,
        data=data,
        base_model_metadata=f"base_model: {base_model}\n" if on_the_hub else "",
        continued_from=f" from `{base_model}`" if base_model else "",
        size=", ".join(f"{k}={model_config[k]}" for k in size_fields),
        steps=steps,
        tokens_seen=tokens_seen,
        seq_len=train_config.get("seq_len"),
        tokenizer=tokenizer,
        metric_rows="\n".join(f"| {name} | {_fmt(value)} |" for name, value in metrics.items()),
        where=repo_id or "path/to/this/folder",
        without_ssmhub=(_WITH_CODE if with_code else _WITHOUT_CODE).format(where=repo_id or "path/to/this/folder"),
        model_config_json=json.dumps(model_config, indent=2, sort_keys=True, default=str),
        train_config_json=json.dumps(train_config, indent=2, sort_keys=True, default=str),
    )


def write_model_card(folder: str | os.PathLike, **kwargs) -> Path:
    """Write :func:`render_model_card` into ``folder/README.md``."""
    return write_text_atomic(Path(folder) / "README.md", render_model_card(**kwargs))


def push_folder_to_hub(folder: str | os.PathLike, repo_id: str, private: bool = False) -> str:
    """Upload ``folder`` (without its checkpoints) to the Hub repo ``repo_id``; the token comes from $HF_TOKEN.

    Raises HubPushError with a one-line message (never the token) on any failure.
    """
    from huggingface_hub import HfApi

    token = os.environ.get("HF_TOKEN") or None
    try:
        if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
            raise ConnectionError("HF_HUB_OFFLINE is set")
        api = HfApi(token=token)
        url = api.create_repo(repo_id, private=private, exist_ok=True)
        api.upload_folder(folder_path=str(folder), repo_id=repo_id, ignore_patterns=["checkpoints/*", "checkpoints"])
    except Exception as err:
        reason = first_line(err)
        if token:
            reason = reason.replace(token, "***")
        raise HubPushError(
            f"push to the Hub repo {repo_id!r} failed ({type(err).__name__}: {reason}); the model is saved "
            f"locally in {folder}"
        ) from None
    return str(url)


def final_metrics(train_loss: float | None, eval_loss: float | None) -> dict:
    """The metrics table of a model card."""
    metrics = {}
    if train_loss is not None:
        metrics["final train loss"] = train_loss
    if eval_loss is not None:
        metrics["validation loss"] = eval_loss
        metrics["validation perplexity"] = perplexity(eval_loss, 1)  # eval_loss: mean NLL per token
    return metrics
