"""Training options users ask for by name: ``ssmhub-train --compile`` (Accelerate's dynamo plugin, fullgraph) and
transformers' ``TrainingArguments(torch_compile=True)`` train to eager's losses; so does ``ssmhub-train
--gradient_checkpointing``.

The backend is ``aot_eager`` (Dynamo's capture and AOTAutograd's graph without Inductor's C++ code generation,
minutes on a 2-core CPU); tests/conformance/test_compiled_training.py checks each family's step. Two computations
of the same steps: losses within TRAINING_REL (tests/training/training_helpers.py derives it)."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo
from training_helpers import losses, same_losses, tiny_args
from transformers import Trainer, TrainingArguments, default_data_collator

import ssmhub
from ssmhub.training.cli import main


@pytest.mark.parametrize("layout", ["plain", "packing"])
def test_ssmhub_train_compile_gives_eager_losses(tiny_data_dir, tmp_path, layout):
    torch._dynamo.reset()
    extra = {"packing": None} if layout == "packing" else {}
    flags = {"save_steps": 0, "max_steps": 3, "eval_steps": 3, **extra}
    main(tiny_args(tiny_data_dir, tmp_path / "eager", **flags))
    main(tiny_args(tiny_data_dir, tmp_path / "compiled", compile=None, compile_backend="aot_eager", **flags))
    same_losses(losses(tmp_path / "compiled"), losses(tmp_path / "eager"), what="train")
    same_losses(losses(tmp_path / "compiled", "validation"), losses(tmp_path / "eager", "validation"))


def test_ssmhub_train_compile_stateful_gives_eager_losses(tiny_pg19_dir, tmp_path):
    """Stateful rows (each row's documents back to back, its state carried window to window) hand their documents'
    sizes to the model from the host, so the compiled forward needs no data-dependent size."""
    torch._dynamo.reset()
    flags = {"dataset": "pg19", "stateful": None, "save_steps": 0, "max_steps": 3, "eval_steps": 3}
    main(tiny_args(tiny_pg19_dir, tmp_path / "eager", per_device_train_batch_size=2, **flags))
    compiled = {"compile": None, "compile_backend": "aot_eager", "per_device_train_batch_size": 2}
    main(tiny_args(tiny_pg19_dir, tmp_path / "compiled", **compiled, **flags))
    same_losses(losses(tmp_path / "compiled"), losses(tmp_path / "eager"), what="train")


def test_unknown_compile_backend_is_refused_before_training(tiny_data_dir, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(tiny_args(tiny_data_dir, tmp_path / "run", compile=None, compile_backend="no-such-backend"))
    assert "compile_backend" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def _trainer_losses(tmp_path, compile_: bool) -> list[float]:
    torch.manual_seed(0)
    config = ssmhub.DLRConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, state_size=4, pad_token_id=0)
    model = ssmhub.DLRForCausalLM(config)
    rows = torch.randint(1, 64, (8, 12), generator=torch.Generator().manual_seed(1))
    data = [{"input_ids": row.tolist(), "labels": row.tolist()} for row in rows]
    args = TrainingArguments(
        str(tmp_path / f"trainer-{compile_}"),
        max_steps=3,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        torch_compile=compile_,
        torch_compile_backend="aot_eager" if compile_ else None,
    )
    trainer = Trainer(model=model, args=args, train_dataset=data, data_collator=default_data_collator)
    trainer.train()
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


def test_trainer_torch_compile_gives_eager_losses(tmp_path):
    torch._dynamo.reset()
    eager, compiled = _trainer_losses(tmp_path, False), _trainer_losses(tmp_path, True)
    same_losses(dict(enumerate(compiled)), dict(enumerate(eager)), what="Trainer(torch_compile=True)")


def test_ssmhub_train_gradient_checkpointing_gives_the_same_losses(tiny_data_dir, tmp_path):
    """Recomputing each block's activations in the backward is the same computation (same ops, same inputs):
    losses within TRAINING_REL."""
    flags = {"save_steps": 0, "max_steps": 3, "eval_steps": 3}
    main(tiny_args(tiny_data_dir, tmp_path / "plain", **flags))
    main(tiny_args(tiny_data_dir, tmp_path / "checkpointed", gradient_checkpointing=None, **flags))
    same_losses(losses(tmp_path / "checkpointed"), losses(tmp_path / "plain"), what="train")
