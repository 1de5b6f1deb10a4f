"""Tokenizers for ssmhub models: train a small byte-level BPE, or load an existing tokenizer.

Both return a ``transformers.PreTrainedTokenizerFast`` (in transformers 5 an alias of
``TokenizersBackend``), so a trained tokenizer saves with ``save_pretrained`` next to a model and
reloads with ``AutoTokenizer.from_pretrained``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

__all__ = [
    "DOCUMENT_PIECE_CHARS",
    "ENDOFTEXT",
    "PAD_TOKEN",
    "PLAIN_CHAT_TEMPLATE",
    "encode_document",
    "encode_documents",
    "ensure_pad_token",
    "load_tokenizer",
    "resolve_tokenizer",
    "train_bpe_tokenizer",
]

ENDOFTEXT = "<|endoftext|>"
# The pad token of ssmhub's tokenizers, distinct from EOS: transformers' DataCollatorForLanguageModeling
# sets the label of every pad-id token to -100, so with pad = eos a fine-tuned model never learns to stop.
PAD_TOKEN = "<|pad|>"
# The chat template of ssmhub's trained tokenizers: a base language model has no chat format of its own, so a chat
# is laid out as plain text ("user: Hello\nassistant:"), which is what a chat request to a served model
# (apply_chat_template, vLLM's chat completions) needs a template for.
PLAIN_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
_BYTE_ALPHABET_SIZE = 256


def train_bpe_tokenizer(
    texts: Iterable[str],
    vocab_size: int,
    special_tokens: Iterable[str] = (ENDOFTEXT,),
    padding_side: str = "left",
    min_frequency: int = 2,
    model_max_length: int | None = None,
    pad_token: str | None = PAD_TOKEN,
    chat_template: str | None = PLAIN_CHAT_TEMPLATE,
) -> PreTrainedTokenizerFast:
    """Train a GPT-2 style byte-level BPE on ``texts``.

    Every byte is in the base alphabet, so any string encodes without an unknown token. The first
    special token (``"<|endoftext|>"`` by default, id 0) serves as bos, eos and unk token; ``pad_token``
    (``"<|pad|>"``, id 1 by default) is a special token of its own, inside ``vocab_size``, so that
    ``DataCollatorForLanguageModeling(tokenizer, mlm=False)`` keeps the labels of real EOS tokens
    (it ignores every pad-id token); ``pad_token=None`` makes the eos token the pad token (the
    tokenizers ssmhub wrote before). Padding is on the left by default, what batched generation of a
    causal LM needs (the last position of each row is its last real token). No special tokens are
    added when encoding: documents are joined with eos by the caller (see
    :func:`ssmhub.data.pack_token_windows`).

    Args:
        texts: training texts (any iterable of strings; it is consumed once).
        vocab_size: final vocabulary size, special tokens included; at least 256 + their number.
        special_tokens: tokens never split by the BPE, given the first ids.
        padding_side: ``"left"`` or ``"right"``.
        min_frequency: a pair must occur this often to be merged.
        model_max_length: recorded on the tokenizer (None: no limit, right for recurrent models).
        pad_token: the pad token, added after ``special_tokens`` unless it is one of them; None: the eos.
        chat_template: the Jinja template of ``apply_chat_template`` and of chat requests to a served model
            (:data:`PLAIN_CHAT_TEMPLATE`: the turns as plain text); None: no chat template.
    """
    special_tokens = list(special_tokens)
    if not special_tokens:
        raise ValueError("special_tokens must hold at least one token (used as eos/bos/unk)")
    if pad_token is not None and pad_token == special_tokens[0]:
        raise ValueError(f"pad_token must differ from the eos token {special_tokens[0]!r} (pad_token=None for that)")
    if pad_token is not None and pad_token not in special_tokens:
        special_tokens.append(pad_token)
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
        pad_token=pad_token if pad_token is not None else eos,
        padding_side=padding_side,
        clean_up_tokenization_spaces=False,
        chat_template=chat_template,
        **kwargs,
    )


# Documents are encoded in pieces of about this many characters (see encode_document).
DOCUMENT_PIECE_CHARS = 1 << 16
_PIECES_PER_CALL = 4  # pieces encoded together (in parallel by the tokenizer), bounding its memory


def encode_document(tokenizer, text: str, piece_chars: int = DOCUMENT_PIECE_CHARS) -> list[int]:
    """Token ids of a whole document, no special tokens added, with no warning about its length.

    A fast tokenizer holds every token's string, offsets and word id while it encodes, about 600 bytes
    per token of peak memory (600 MB for a 1 MB book). Documents longer than ``piece_chars`` are
    therefore encoded in pieces when that cannot change the ids: for a byte-level pre-tokenizer
    without prefix space (GPT-2, GPT-NeoX, ssmhub's BPE) a cut right after a ``"\n"`` that has a
    non-space character on each side falls between two pre-tokens, and BPE never merges across
    pre-tokens. Other tokenizers encode the whole text at once.
    """
    if len(text) <= piece_chars or not _cuts_at_newlines_are_exact(tokenizer):
        return tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
    pieces = _split_at_newlines(text, piece_chars)
    ids: list[int] = []
    for start in range(0, len(pieces), _PIECES_PER_CALL):
        for piece_ids in tokenizer(pieces[start : start + _PIECES_PER_CALL], add_special_tokens=False, verbose=False)[
            "input_ids"
        ]:
            ids.extend(piece_ids)
    return ids


def encode_documents(tokenizer, texts: list[str], piece_chars: int = DOCUMENT_PIECE_CHARS) -> list[list[int]]:
    """:func:`encode_document` of each text; the short ones go through the tokenizer as one batch."""
    ids: list[list[int] | None] = [None] * len(texts)
    short = [i for i, text in enumerate(texts) if len(text) <= piece_chars]
    if short:
        encoded = tokenizer([texts[i] for i in short], add_special_tokens=False, verbose=False)["input_ids"]
        for i, doc_ids in zip(short, encoded):
            ids[i] = doc_ids
    for i, doc_ids in enumerate(ids):
        if doc_ids is None:
            ids[i] = encode_document(tokenizer, texts[i], piece_chars)
    return ids


def _cuts_at_newlines_are_exact(tokenizer) -> bool:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return False
    pre_tokenizer = json.loads(backend.to_str()).get("pre_tokenizer") or {}
    return (
        pre_tokenizer.get("type") == "ByteLevel"
        and not pre_tokenizer.get("add_prefix_space", True)
        and pre_tokenizer.get("use_regex", True)
    )


def _split_at_newlines(text: str, piece_chars: int) -> list[str]:
    """Cut ``text`` into pieces of at least ``piece_chars`` characters, each cut right after a ``"\n"``
    with a non-space character before and after it (a piece may be longer when there is no such cut)."""
    pieces, start = [], 0
    while len(text) - start > piece_chars:
        cut = start + piece_chars
        while cut < len(text) and not (
            text[cut - 1] == "\n" and not text[cut - 2].isspace() and not text[cut].isspace()
        ):
            cut = text.find("\n", cut) + 1 or len(text)
        pieces.append(text[start:cut])
        start = cut
    pieces.append(text[start:])
    return [piece for piece in pieces if piece]


def ensure_pad_token(tokenizer, max_vocab_size: int | None = None) -> bool:
    """Give ``tokenizer`` a pad token distinct from its eos token, and left padding, in place, for a model
    that is yet to be built (its vocabulary is ``len(tokenizer)`` afterwards, or ``max_vocab_size``).

    A tokenizer without a pad token, or whose pad token is its eos token (GPT-2's once a pad is set, the
    NeoX ``tokenizer.json`` loaded by :func:`load_tokenizer`, ssmhub folders saved before this change),
    gets :data:`PAD_TOKEN` added as a special token with the next free id. ``max_vocab_size`` (a
    ``vocab_size`` forced on the model) bounds the ids: when the new id would not fit, the tokenizer is
    left as it is and False is returned, so that the caller can say so; otherwise True. Embeddings are
    never resized: call this before the model is built, not on a trained model's tokenizer.
    """
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is not None and tokenizer.pad_token_id != tokenizer.eos_token_id:
        return True
    if PAD_TOKEN not in tokenizer.get_vocab() and max_vocab_size is not None and len(tokenizer) >= max_vocab_size:
        return False
    tokenizer.add_special_tokens({"pad_token": PAD_TOKEN})
    return True


def resolve_tokenizer(name: str | os.PathLike, cache_dir: str | None = None):
    """The tokenizer ``name`` names, resolved the one way every ssmhub tool resolves a tokenizer option (``ssmhub-train
    --tokenizer`` and ``--model_name_or_path``, ``ssmhub-eval --tokenizer``, the example scripts' ``--tokenizer_name``):
    a local folder or ``tokenizer.json`` file (:func:`load_tokenizer`), else a Hub id (``AutoTokenizer``, downloads
    into ``cache_dir``)."""
    if Path(name).exists():
        return load_tokenizer(name)
    return AutoTokenizer.from_pretrained(str(name), cache_dir=cache_dir)


def load_tokenizer(path: str | os.PathLike, **kwargs) -> PreTrainedTokenizerFast:
    """Load a fast tokenizer from a folder (``AutoTokenizer.from_pretrained``) or a ``tokenizer.json`` file.

    A bare ``tokenizer.json`` carries no special-token roles: when ``"<|endoftext|>"`` is in its
    vocabulary and ``kwargs`` set none, it becomes the bos/eos/unk token, and the pad token is
    :data:`PAD_TOKEN` where the vocabulary has it, else the eos token, as for :func:`train_bpe_tokenizer`.
    ``kwargs`` go to the tokenizer's constructor.
    """
    path = Path(path)
    if path.is_dir():
        return AutoTokenizer.from_pretrained(path, **kwargs)
    if not path.is_file():
        raise FileNotFoundError(f"no tokenizer folder or tokenizer.json file at {path}")
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(path), **kwargs)
    vocab = tokenizer.get_vocab()
    if ENDOFTEXT in vocab:
        pad = PAD_TOKEN if PAD_TOKEN in vocab else ENDOFTEXT
        roles = {"bos_token": ENDOFTEXT, "eos_token": ENDOFTEXT, "unk_token": ENDOFTEXT, "pad_token": pad}
        for role, token in roles.items():
            if role not in kwargs and getattr(tokenizer, role) is None:
                setattr(tokenizer, role, token)
    return tokenizer
