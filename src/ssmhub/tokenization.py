"""Tokenizers for ssmhub models: train a small byte-level BPE, or load an existing tokenizer.

Both return a ``transformers.PreTrainedTokenizerFast`` (in transformers 5 an alias of
``TokenizersBackend``), so a trained tokenizer saves with ``save_pretrained`` next to a model and
reloads with ``AutoTokenizer.from_pretrained``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

__all__ = ["ENDOFTEXT", "encode_document", "load_tokenizer", "train_bpe_tokenizer"]

ENDOFTEXT = "<|endoftext|>"
_BYTE_ALPHABET_SIZE = 256


def train_bpe_tokenizer(
    texts: Iterable[str],
    vocab_size: int,
    special_tokens: Iterable[str] = (ENDOFTEXT,),
    padding_side: str = "right",
    min_frequency: int = 2,
    model_max_length: int | None = None,
) -> PreTrainedTokenizerFast:
    """Train a GPT-2 style byte-level BPE on ``texts``.

    Every byte is in the base alphabet, so any string encodes without an unknown token. The first
    special token (``"<|endoftext|>"`` by default, id 0) serves as bos, eos, unk and pad token;
    padding works in batches (``padding_side`` ``"right"`` for training, ``"left"`` for batched
    generation). No special tokens are added when encoding: documents are joined with eos by the
    caller (see :func:`ssmhub.data.pack_token_windows`).

    Args:
        texts: training texts (any iterable of strings; it is consumed once).
        vocab_size: final vocabulary size, special tokens included; at least 256 + their number.
        special_tokens: tokens never split by the BPE, given the first ids.
        padding_side: ``"right"`` or ``"left"``.
        min_frequency: a pair must occur this often to be merged.
        model_max_length: recorded on the tokenizer (None: no limit, right for recurrent models).
    """
    special_tokens = list(special_tokens)
    if not special_tokens:
        raise ValueError("special_tokens must hold at least one token (used as eos/bos/unk/pad)")
    if vocab_size < _BYTE_ALPHABET_SIZE + len(special_tokens):
        raise ValueError(
            f"vocab_size must be at least {_BYTE_ALPHABET_SIZE + len(special_tokens)} (256 bytes + "
            f"{len(special_tokens)} special tokens); got {vocab_size}"
        )
    if padding_side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right'; got {padding_side!r}")

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)

    eos = special_tokens[0]
    kwargs = {"model_max_length": model_max_length} if model_max_length is not None else {}
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=eos,
        eos_token=eos,
        unk_token=eos,
        pad_token=eos,
        padding_side=padding_side,
        clean_up_tokenization_spaces=False,
        **kwargs,
    )


def encode_document(tokenizer, text: str) -> list[int]:
    """Token ids of a whole document, no special tokens added, with no warning about its length."""
    return tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]


def load_tokenizer(path: str | os.PathLike, **kwargs) -> PreTrainedTokenizerFast:
    """Load a fast tokenizer from a folder (``AutoTokenizer.from_pretrained``) or a ``tokenizer.json`` file.

    A bare ``tokenizer.json`` carries no special-token roles: when ``"<|endoftext|>"`` is in its
    vocabulary and ``kwargs`` set none, it becomes the bos/eos/unk token and the pad token, as for
    :func:`train_bpe_tokenizer`. ``kwargs`` go to the tokenizer's constructor.
    """
    path = Path(path)
    if path.is_dir():
        return AutoTokenizer.from_pretrained(path, **kwargs)
    if not path.is_file():
        raise FileNotFoundError(f"no tokenizer folder or tokenizer.json file at {path}")
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(path), **kwargs)
    if ENDOFTEXT in tokenizer.get_vocab():
        for role in ("bos_token", "eos_token", "unk_token", "pad_token"):
            if role not in kwargs and getattr(tokenizer, role) is None:
                setattr(tokenizer, role, ENDOFTEXT)
    return tokenizer
