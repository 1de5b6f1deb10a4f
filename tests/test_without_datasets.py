"""ssmhub imports and runs its models without ``datasets`` and ``evaluate``: the project's GPU machines have
torch, transformers, accelerate and triton but cannot install those two (issue 28 §3)."""

import subprocess
import sys

BLOCKED = ("datasets", "evaluate")

SCRIPT = f"""
import importlib.abc, sys

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ImportError(f"{{name}} is not installed on this machine")
        return None

sys.meta_path.insert(0, Block())
import torch
import ssmhub
from ssmhub.evaluation import perplexity  # noqa: F401  (the modules that use datasets import it lazily)
from ssmhub.training import trainer  # noqa: F401
model = ssmhub.DLRForCausalLM(ssmhub.DLRConfig(vocab_size=16, hidden_size=8, num_hidden_layers=1, state_size=4))
print(model.generate(torch.tensor([[1, 2]]), max_new_tokens=2, do_sample=False).shape)
"""


def test_ssmhub_runs_without_datasets_and_evaluate():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "torch.Size([1, 4])" in done.stdout
