import pytest
import torch
from families import FAMILIES
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoModelForTokenClassification


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


AUTO_CLASSES = {  # Auto class name -> (class, the suffix of the ssmhub classes it loads)
    "AutoModelForCausalLM": (AutoModelForCausalLM, "ForCausalLM"),
    "AutoModelForSequenceClassification": (AutoModelForSequenceClassification, "ForSequenceClassification"),
    "AutoModelForTokenClassification": (AutoModelForTokenClassification, "ForTokenClassification"),
}


def auto_class_name(model) -> str:
    """The name of the transformers Auto class that loads ``model``'s head."""
    return next(name for name, (_, suffix) in AUTO_CLASSES.items() if type(model).__name__.endswith(suffix))


def auto_class(model):
    """The transformers Auto class that loads ``model``'s head (AutoModelForCausalLM, ...)."""
    return AUTO_CLASSES[auto_class_name(model)][0]


def every_head(family) -> dict:
    """Each head the family has (causal LM, sequence and token classifier), keyed by the Auto class
    that loads it, each built from seed 0 and in eval mode."""
    classes = {
        "AutoModelForCausalLM": family.causal_lm,
        "AutoModelForSequenceClassification": family.sequence_classification,
        "AutoModelForTokenClassification": family.token_classification,
    }
    heads = {}
    for name, cls in classes.items():
        if cls is not None:
            torch.manual_seed(0)
            heads[name] = cls(family.config() if name == "AutoModelForCausalLM" else family.config(num_labels=3))
    return {name: model.eval() for name, model in heads.items()}


def random_labels(model, ids, seed=0):
    """Labels of ``model``'s head for ``ids`` (B, L), drawn from a fixed seed: the ids themselves for a
    causal LM (its loss shifts them), a class per row for a sequence classifier, a class per position
    for a token classifier."""
    gen = torch.Generator().manual_seed(seed)
    name = auto_class_name(model)
    if name == "AutoModelForCausalLM":
        return ids.clone()
    num_labels = model.config.num_labels
    if name == "AutoModelForSequenceClassification":
        return torch.randint(0, num_labels, ids.shape[:1], generator=gen)
    return torch.randint(0, num_labels, ids.shape, generator=gen)
