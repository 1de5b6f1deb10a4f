import pytest
import torch
from families import FAMILIES


@pytest.fixture(params=FAMILIES, ids=lambda f: f.name)
def family(request):
    return request.param


@pytest.fixture
def causal_lm(family):
    if family.causal_lm is None:
        pytest.skip(f"{family.name} has no causal LM")
    torch.manual_seed(0)
    return family.causal_lm(family.config()).eval()


@pytest.fixture
def classifier(family):
    if family.sequence_classification is None:
        pytest.skip(f"{family.name} has no sequence classifier")
    torch.manual_seed(0)
    return family.sequence_classification(family.config(num_labels=3)).eval()


@pytest.fixture
def tagger(family):
    if family.token_classification is None:
        pytest.skip(f"{family.name} has no token classifier")
    torch.manual_seed(0)
    return family.token_classification(family.config(num_labels=3)).eval()


def random_ids(batch, length, vocab=64, seed=0):
    return torch.randint(1, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def any_model(family):
    """The family's causal LM, or its classifier where it has no LM (checks that hold for every head)."""
    torch.manual_seed(0)
    if family.causal_lm is not None:
        return family.causal_lm(family.config()).eval()
    return family.sequence_classification(family.config(num_labels=3)).eval()
