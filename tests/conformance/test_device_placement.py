"""Every tensor a model makes lands on its inputs' device, never on torch's default device: every family.

A model moved to a GPU while torch's default device stays the CPU (the usual case), or a CPU model used where
the default device was set to a GPU, fails at the first tensor made without ``device=`` (``torch.tensor(...)``,
``torch.zeros(n)``, ``torch.as_tensor(t)``, which moves ``t`` there). A CPU-only machine cannot run the first
case, so this suite runs the second with the ``meta`` device as the default: the model and its inputs stay on
the CPU, and :class:`FirstTensorOnTheDefaultDevice` fails at the op that first puts a tensor on ``meta`` from
inputs that are all elsewhere, naming it. Oracle: nothing lands there through training, packed rows, stateful
windows, greedy, padded and prompt-lookup decoding, cache crop/fork/save/load, a preallocated cache and H3
distillation."""

import pytest
import torch
from conftest import random_ids
from families import FAMILIES
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

import ssmhub
from ssmhub.models.cache_argument import CACHE_FIELD

ELSEWHERE = "meta"


def _on_default_device(tree) -> bool:
    return any(isinstance(t, torch.Tensor) and t.device.type == ELSEWHERE for t in tree_flatten(tree)[0])


class FirstTensorOnTheDefaultDevice(TorchFunctionMode):
    """Raise at the first op whose output is on the default device while none of its inputs is."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if _on_default_device(out) and not _on_default_device((args, kwargs)):
            raise AssertionError(f"{getattr(func, '__name__', func)} made a tensor on torch's default device")
        return out


@pytest.fixture
def default_device_elsewhere():
    """Inside the test, torch's default device is ``meta`` and every op is watched; the model and data were made
    on the CPU before (``random_ids`` and the fixtures below make them outside the watch)."""
    previous = torch.get_default_device()
    torch.set_default_device(ELSEWHERE)
    try:
        with FirstTensorOnTheDefaultDevice():
            yield
    finally:
        # The CPU is the default without a default device set: set_default_device("cpu") would leave a device
        # mode active for every later test, and Dynamo cannot trace some tensor methods through it (the compiled
        # decode tests then fail when they run after this one).
        torch.set_default_device(None if previous.type == "cpu" else previous)


def on_cpu(fn, *args, **kwargs):
    """Run ``fn`` with the CPU as the default device (to make test data inside a watched test)."""
    with torch.device("cpu"):
        return fn(*args, **kwargs)


def _build(family, **config):
    torch.manual_seed(0)
    with torch.device("cpu"):
        if family.causal_lm is not None:
            return family.causal_lm(family.config(**config)).eval()
        return family.sequence_classification(family.config(num_labels=3, **config)).eval()


@pytest.fixture(params=FAMILIES, ids=lambda f: f.name)
def cpu_model(request):
    return _build(request.param)


def _lm(model):
    if "CausalLM" not in type(model).__name__:
        pytest.skip(f"{type(model).__name__} has no causal LM head")
    return model


def test_training_steps_and_packed_rows(cpu_model, default_device_elsewhere):
    ids = on_cpu(random_ids, 2, 12)
    labels = ids if "CausalLM" in type(cpu_model).__name__ else on_cpu(torch.tensor, [0, 2])
    cpu_model.train()
    cpu_model(ids, labels=labels).loss.backward()
    positions = on_cpu(torch.tensor, [[0, 1, 2, 3, 0, 1, 2, 3, 4, 5, 6, 7]] * 2)
    cpu_model(ids, position_ids=positions).logits.sum().backward()


def test_stateful_windows_through_a_cache(cpu_model, default_device_elsewhere):
    lm = _lm(cpu_model).train()
    cache = on_cpu(ssmhub.RecurrentCache, lm.config.num_hidden_layers)
    ids = on_cpu(random_ids, 2, 12)
    for start in (0, 6):
        lm(ids[:, start : start + 6], labels=ids[:, start : start + 6], cache=cache, use_cache=True).loss.backward()
        cache.detach_()


@torch.no_grad()
def test_decoding(cpu_model, default_device_elsewhere):
    lm = _lm(cpu_model)
    ids = on_cpu(random_ids, 2, 10)
    lm.generate(ids[:1], max_new_tokens=4, do_sample=False)
    lm.generate(on_cpu(torch.cat, [ids[:1], ids[:1, :4]], 1), max_new_tokens=6, prompt_lookup_num_tokens=3)
    mask = on_cpu(torch.ones_like, ids)
    mask[1, :3] = 0
    lm.generate(ids, attention_mask=mask, max_new_tokens=3, do_sample=False)
    static = lm.static_cache(2, 16)
    lm.generate(ids, max_new_tokens=3, do_sample=False, **{CACHE_FIELD: static})


@torch.no_grad()
def test_cache_crop_fork_save_and_load(cpu_model, default_device_elsewhere, tmp_path):
    lm = _lm(cpu_model)
    ids = on_cpu(random_ids, 1, 10)
    cache = getattr(lm(ids[:, :6], use_cache=True), CACHE_FIELD)
    cache.activate_past_recording()
    lm(ids[:, 6:], cache=cache, use_cache=True)
    cache.crop(-2)
    lm(ids[:, :1], cache=cache.fork(), use_cache=True)  # the fork replays the kept tokens at once
    cache.save(tmp_path / "prompt.safetensors", lm)
    loaded = ssmhub.RecurrentCache.load(tmp_path / "prompt.safetensors", lm)
    lm(ids[:, :1], cache=loaded, use_cache=True)


@torch.no_grad()
def test_h3_distillation(default_device_elsewhere):
    family = next(f for f in FAMILIES if f.name == "h3")
    model = on_cpu(_build, family)
    model.distill_for_decoding(2)
    model.generate(on_cpu(random_ids, 1, 6), max_new_tokens=3, do_sample=False)
