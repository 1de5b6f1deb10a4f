#!/usr/bin/env python
"""LoRA fine-tuning of any ssmhub family with PEFT and ``Trainer``, then merge the adapters and save.

``--target_modules family`` (default) adapts the projections around each family's recurrence
(:data:`FAMILY_TARGETS`) and leaves the recurrence's own parameters (Λ, A_log, Δ, long kernels) and the
LM head frozen; ``all-linear`` is PEFT's every-Linear-but-the-output choice; or name modules, comma-separated.
Data flags are run_clm.py's (``--train_file``, ``--dataset_name``, ``--block_size``, ``--packing``).
The merged model, a plain ssmhub folder, goes to ``<output_dir>/merged``.

    python examples/peft/run_lora.py --model_name_or_path runs/clm --output_dir runs/lora --do_train \\
        --max_train_samples 64 --max_steps 10
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import torch
import transformers
from peft import LoraConfig, get_peft_model
from transformers import (
    AutoModelForCausalLM,
    DataCollatorWithFlattening,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
    default_data_collator,
)

from ssmhub.data.causal_lm import CausalLMDataArguments, load_documents, prepare_causal_lm_data
from ssmhub.script_arguments import ModelArguments, build_model, load_script_tokenizer
from ssmhub.training.process_group import end_process_group

# Leaf names of the Linear layers LoRA adapts by default, per model_type: the input and output projections of
# each mixer and its MLP. BDLRNN's transition network and input map are its projections.
FAMILY_TARGETS = {
    "dlr": ("output_linear", "up_proj", "down_proj"),
    "h3": ("in_proj", "out_proj", "qkv_proj", "up_proj", "down_proj"),
    "serpent": ("in_proj", "x_proj", "out_proj"),
    "bdlrnn": ("transition", "in_proj"),
    "mamba": ("in_proj", "x_proj", "out_proj"),
}


@dataclass
class LoraArguments:
    """The LoRA adapters: rank, scale, dropout and which Linear layers get them."""

    lora_r: int = field(default=8, metadata={"help": "Rank of the adapters."})
    lora_alpha: int = field(default=16, metadata={"help": "Scale: the update is (alpha / r) B A."})
    lora_dropout: float = field(default=0.0, metadata={"help": "Dropout on the adapters' input."})
    target_modules: str = field(
        default="family", metadata={"help": "'family' (FAMILY_TARGETS), 'all-linear', or comma-separated names."}
    )


def family_target_modules(model) -> list[str]:
    """The full names of the Linear layers of ``model`` that :data:`FAMILY_TARGETS` names for its model_type
    (a leaf, or the Sequential holding it, is named there)."""
    model_type = model.config.model_type
    if model_type not in FAMILY_TARGETS:
        raise ValueError(f"--target_modules family knows {sorted(FAMILY_TARGETS)}; name the modules for {model_type!r}")
    wanted = set(FAMILY_TARGETS[model_type])
    return [
        name
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and wanted & set(name.split(".")[-2:])
    ]


def lora_config(args: LoraArguments, model) -> LoraConfig:
    """PEFT's config for ``args`` on ``model``."""
    if args.target_modules == "family":
        targets = family_target_modules(model)
    elif args.target_modules == "all-linear":
        targets = "all-linear"
    else:
        targets = [name.strip() for name in args.target_modules.split(",") if name.strip()]
    return LoraConfig(
        r=args.lora_r, lora_alpha=args.lora_alpha, lora_dropout=args.lora_dropout,
        target_modules=targets, task_type="CAUSAL_LM",
    )  # fmt: skip


def main(argv: list[str] | None = None):
    """Parse the flags (or ``argv``), fine-tune with LoRA, merge and save; returns the merged model."""
    parser = HfArgumentParser((ModelArguments, LoraArguments, CausalLMDataArguments, TrainingArguments))
    model_args, lora_args, data_args, training_args = parser.parse_args_into_dataclasses(args=argv)
    transformers.set_seed(training_args.seed)
    tokenizer = load_script_tokenizer(model_args)
    data = prepare_causal_lm_data(load_documents(data_args, model_args.cache_dir), tokenizer, data_args)
    base = build_model(model_args, AutoModelForCausalLM, tokenizer)
    model = get_peft_model(base, lora_config(lora_args, base))
    model.print_trainable_parameters()
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=data["train"],
        processing_class=tokenizer,
        data_collator=DataCollatorWithFlattening() if data_args.packing else default_data_collator,
    )
    if training_args.do_train:
        trainer.train()
    trainer.save_model()  # the adapters alone
    merged = model.merge_and_unload()
    merged.save_pretrained(f"{training_args.output_dir}/merged")
    tokenizer.save_pretrained(f"{training_args.output_dir}/merged")
    return merged


if __name__ == "__main__":
    main(sys.argv[1:])
    end_process_group()  # before exit: a launched process must not leave it to interpreter shutdown
