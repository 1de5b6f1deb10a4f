"""experiments/copy_probe.py: a model that knows every next token scores a repeat loss of 0 and top-1 of 1; one
that knows nothing scores log V everywhere; the repeat is the rows' last quarter, its first token excepted."""

import math
import os
import sys
from types import SimpleNamespace

import torch

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "experiments")
)
import copy_probe

VOCAB = 50


class Oracle:
    """Logits that put all mass on the true next token of x (the last position's on token 0)."""

    def __call__(self, x):
        target = torch.cat([x[:, 1:], torch.zeros_like(x[:, :1])], dim=1)
        return SimpleNamespace(logits=torch.nn.functional.one_hot(target, VOCAB).float() * 100)


class Uniform:
    def __call__(self, x):
        return SimpleNamespace(logits=torch.zeros(*x.shape, VOCAB))


def test_an_oracle_copies_perfectly_and_a_uniform_model_not_at_all():
    ids = torch.randint(0, VOCAB, (4, 32), generator=torch.Generator().manual_seed(0))
    for shuffle in (False, True):
        perfect = copy_probe.probe(Oracle(), ids, shuffle)
        assert perfect["loss, repeat"] < 1e-6 and perfect["top-1, repeat"] == 1.0
        blind = copy_probe.probe(Uniform(), ids, shuffle)
        assert math.isclose(blind["loss, repeat"], math.log(VOCAB), rel_tol=1e-6)
        assert math.isclose(blind["loss, first 3/4"], math.log(VOCAB), rel_tol=1e-6)


def test_the_repeat_is_scored_from_its_second_token():
    ids = torch.arange(4 * 32).reshape(4, 32) % VOCAB

    class WrongOnlyAtRepeatStart(Oracle):
        def __call__(self, x):
            out = super().__call__(x)
            out.logits[:, 32 - 8 - 1] = 0  # the prediction of the repeat's first token: uniform
            return out

    result = copy_probe.probe(WrongOnlyAtRepeatStart(), ids, shuffle=False)
    assert result["loss, repeat"] < 1e-6 and result["top-1, repeat"] == 1.0
