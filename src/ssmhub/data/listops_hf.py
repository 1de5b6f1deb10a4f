"""ListOps for transformers users: a word-level tokenizer of its 17-token vocabulary and a ``DatasetDict``.

Kept apart from :mod:`.listops` so the generator needs neither ``tokenizers`` nor ``datasets``.
"""

from __future__ import annotations

from .listops import LISTOPS, VOCABULARY, ListOpsSpec, listops_splits

__all__ = ["listops_dataset_dict", "listops_tokenizer"]


def listops_tokenizer():
    """A ``PreTrainedTokenizerFast`` with one id per ListOps token (:data:`~.listops.VOCABULARY`).

    Tokens are split on whitespace; the parentheses of the LRA release's files are dropped first, so its
    ``.tsv`` rows and this package's texts give the same ids. Padding is ``<pad>`` (id 0).
    """
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: index for index, token in enumerate(VOCABULARY)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.normalizer = normalizers.Replace(Regex(r"[()]"), " ")
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", unk_token="<unk>")


def listops_dataset_dict(spec: ListOpsSpec = LISTOPS, seed: int = 0):
    """``datasets.DatasetDict`` with ``train``, ``validation`` and ``test`` of :func:`~.listops.listops_splits`."""
    import datasets  # imported here: ssmhub runs without datasets

    return datasets.DatasetDict(
        {split: datasets.Dataset.from_list(rows) for split, rows in listops_splits(spec, seed).items()}
    )
