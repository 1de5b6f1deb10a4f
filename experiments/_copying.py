"""One training step on a copying batch, shared by the copying studies (``induction_steps.py``,
``copy_curriculum.py``)."""

from __future__ import annotations

import torch

from ssmhub.metrics import token_nll


def copy_step(model, optimizer, x: torch.Tensor, n: int, max_grad_norm: float | None = None) -> tuple[float, float]:
    """One step of next-token loss on ``x`` (B, 2n) = [r, r] (clipped to ``max_grad_norm`` if given); returns the
    repeat's mean loss and top-1 accuracy (the predictions of tokens n + 1 .. 2n − 1, each a copy)."""
    logits = model(x).logits[:, :-1]  # position t predicts token t + 1
    nll = token_nll(logits, x[:, 1:])  # (B, 2n - 1)
    optimizer.zero_grad()
    nll.mean().backward()
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    with torch.no_grad():
        top1 = (logits[:, n:].argmax(-1) == x[:, n + 1 :]).float().mean().item()
    return nll[:, n:].mean().item(), top1
