"""H3's ``fft_backend``: every backend computes the same model (issue 6), checked on a whole hybrid LM."""

import pytest
import torch

import ssmhub
from ssmhub.models.cache_argument import CACHE_FIELD

CONFIG = dict(
    vocab_size=97,
    hidden_size=32,
    num_hidden_layers=2,
    intermediate_size=64,
    attention_layers=[1],
    num_attention_heads=4,
    max_kernel_length=64,
)


@pytest.mark.parametrize("block_size", [2, 4, 16])
def test_butterfly_backend_gives_the_torch_fft_model(block_size):
    torch.manual_seed(0)
    reference = ssmhub.H3ForCausalLM(ssmhub.H3Config(**CONFIG)).eval()
    model = ssmhub.H3ForCausalLM(
        ssmhub.H3Config(**CONFIG, fft_backend="butterfly", butterfly_block_size=block_size)
    ).eval()
    model.load_state_dict(reference.state_dict())
    ids = torch.randint(0, 97, (2, 80))  # longer than max_kernel_length: taps beyond L_max are zero
    torch.testing.assert_close(model(ids).logits, reference(ids).logits, atol=2e-5, rtol=1e-5)
    # decoding with the backend's prefill state continues like the reference (to float32 round-off)
    out = model(ids[:, :50], use_cache=True)
    step = model(ids[:, 50:51], cache=getattr(out, CACHE_FIELD), use_cache=True).logits
    torch.testing.assert_close(step[:, 0], reference(ids[:, :51]).logits[:, -1], atol=2e-5, rtol=1e-5)


def test_bad_backend_options_are_named():
    with pytest.raises(ValueError, match="fft_backend"):
        ssmhub.H3Config(**CONFIG, fft_backend="cufft")
    with pytest.raises(ValueError, match="butterfly_block_size"):
        ssmhub.H3Config(**CONFIG, butterfly_block_size=12)
