#!/usr/bin/env python
"""Train or fine-tune any ssmhub family as a causal language model with transformers' ``Trainer``.

The shape of transformers' ``examples/pytorch/language-modeling/run_clm.py``: ``HfArgumentParser`` over
model, data and ``TrainingArguments`` flags. Data: WikiText or PG-19 from ``$SSMHUB_DATA_DIR`` (or the
Hub), or your own text files through ``datasets``. By default documents are concatenated and cut into
``--block_size`` blocks; ``--packing`` instead keeps documents apart (pieces of at most ``--block_size``
tokens) and batches them with ``DataCollatorWithFlattening``: every ssmhub model restarts its state at each
document, so each runs as if alone, with no padding. Evaluation reports token perplexity from summed NLL
and top-1/top-5 next-token accuracy (ssmhub's ``evaluate`` modules).

    python examples/language-modeling/run_clm.py --output_dir runs/clm --do_train --do_eval \\
        --max_train_samples 64 --max_eval_samples 16 --max_steps 10
"""

from __future__ import annotations

import sys

import transformers
from transformers import (
    AutoModelForCausalLM,
    DataCollatorWithFlattening,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
    default_data_collator,
)

from ssmhub.data.causal_lm import CausalLMDataArguments, load_documents, prepare_causal_lm_data
from ssmhub.metrics.trainer_hooks import CausalLMMetrics, preprocess_causal_lm_logits
from ssmhub.script_arguments import ModelArguments, build_model, load_script_tokenizer
from ssmhub.training.process_group import end_process_group


def main(argv: list[str] | None = None) -> dict:
    """Parse the flags (or ``argv``), train and/or evaluate, save the model; returns the metrics."""
    parser = HfArgumentParser((ModelArguments, CausalLMDataArguments, TrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses(args=argv)
    transformers.set_seed(training_args.seed)
    tokenizer = load_script_tokenizer(model_args)
    data = prepare_causal_lm_data(load_documents(data_args, model_args.cache_dir), tokenizer, data_args)
    model = build_model(model_args, AutoModelForCausalLM, tokenizer)
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=data["train"] if training_args.do_train else None,
        eval_dataset=data.get("validation") if training_args.do_eval else None,
        processing_class=tokenizer,
        data_collator=DataCollatorWithFlattening() if data_args.packing else default_data_collator,
        compute_metrics=CausalLMMetrics() if training_args.do_eval else None,
        preprocess_logits_for_metrics=preprocess_causal_lm_logits if training_args.do_eval else None,
    )
    metrics = {}
    if training_args.do_train:
        metrics.update(trainer.train().metrics)
        trainer.save_model()
        trainer.save_metrics("train", metrics)
        trainer.save_state()  # trainer_state.json: the log history (losses per step)
    if training_args.do_eval:
        eval_metrics = trainer.evaluate()
        trainer.save_metrics("eval", eval_metrics)
        metrics.update(eval_metrics)
    return metrics


if __name__ == "__main__":
    main(sys.argv[1:])
    end_process_group()  # before exit: a launched process must not leave it to interpreter shutdown
