"""``RecurrentTrainer``: transformers' ``Trainer`` with an ssmhub model's parameter groups and a schedule that can
run over a time budget instead of a number of steps.

Two parts of DLR's training protocol (arXiv 2212.00768 §A.6, Tables 8-9) that ``Trainer`` does not give:

- *no weight decay on the recurrence parameters* ("weight decay is not applied to DLR parameters", §3.1's
  setup, and the whole of §A.6): ``Trainer``'s default optimizer decays every matrix, Λ and W included.
  Here an ssmhub model's optimizer is built over ``model.optimizer_param_groups(weight_decay, lr)`` (no decay
  on recurrences, norms, biases and embeddings; the recurrence parameters at ``config.recurrence_learning_rate``
  when it is set), with the optimizer class and its arguments that ``TrainingArguments`` name (``--optim``,
  betas, epsilon). Any other model (a transformers baseline) gets ``Trainer``'s own optimizer.
- *a cosine learning-rate schedule with linear warmup* over the whole run (§A.6): transformers' schedules
  count ``max_steps``, which a run stopped after a number of CPU minutes
  (:class:`~ssmhub.training.time_budget.TimeBudgetCallback`) does not know in advance. With ``budget`` given,
  the schedule ``TrainingArguments`` ask for (``lr_scheduler_type``, warmup) is multiplied by
  ``½(1 + cos(π·spent/budget))``, so the learning rate reaches zero as the budget runs out.
"""

from __future__ import annotations

import math

from torch.optim.lr_scheduler import LambdaLR
from transformers import Trainer

from .time_budget import TimeBudgetCallback

__all__ = ["RecurrentTrainer", "anneal_over_budget"]


def anneal_over_budget(scheduler: LambdaLR, budget: TimeBudgetCallback) -> LambdaLR:
    """Multiply each of ``scheduler``'s step factors by ``½(1 + cos(π·f))``, ``f`` the share of ``budget``'s
    seconds spent (capped at 1); returns ``scheduler``, changed in place. The factor reads ``budget.spent``,
    which the callback updates after every step, so it lags the clock by at most one step."""
    if not isinstance(scheduler, LambdaLR):
        raise ValueError(
            f"a schedule over a time budget needs a LambdaLR schedule (every lr_scheduler_type but "
            f"reduce_lr_on_plateau); got {type(scheduler).__name__}"
        )

    def budget_factor() -> float:
        spent = min(budget.spent / budget.seconds, 1.0)
        return 0.5 * (1.0 + math.cos(math.pi * spent))

    def annealed(step_factor):
        def factor(step: int) -> float:  # a plain function: LambdaLR.state_dict() then stores None for it
            return step_factor(step) * budget_factor()

        return factor

    scheduler.lr_lambdas = [annealed(step_factor) for step_factor in scheduler.lr_lambdas]
    return scheduler


class RecurrentTrainer(Trainer):
    """``Trainer`` whose optimizer uses an ssmhub model's ``optimizer_param_groups`` (see the module's docstring)
    and, given ``budget``, whose learning-rate schedule is annealed to zero over that time budget.

    Args (beside ``Trainer``'s):
        budget: the :class:`TimeBudgetCallback` that stops training (it must also be in ``callbacks``), or None
            for the step schedule alone.
    """

    def __init__(self, *args, budget: TimeBudgetCallback | None = None, **kwargs):
        if budget is not None and not isinstance(budget, TimeBudgetCallback):
            raise ValueError(f"budget must be a TimeBudgetCallback or None; got {type(budget).__name__}")
        if budget is not None and budget not in (kwargs.get("callbacks") or []):
            raise ValueError("budget must also be one of the Trainer's callbacks (it measures the time spent)")
        super().__init__(*args, **kwargs)
        self.budget = budget

    def create_optimizer(self, model=None):
        model = self.model if model is None else model
        if self.optimizer is None and hasattr(model, "optimizer_param_groups"):
            optimizer_class, optimizer_kwargs = self.get_optimizer_cls_and_kwargs(self.args, model)
            groups = model.optimizer_param_groups(weight_decay=self.args.weight_decay, lr=self.args.learning_rate)
            self.optimizer = optimizer_class(groups, **optimizer_kwargs)
        return super().create_optimizer(model)

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        created_here = self.lr_scheduler is None
        scheduler = super().create_scheduler(num_training_steps, optimizer)
        if created_here and self.budget is not None:
            anneal_over_budget(scheduler, self.budget)
        return scheduler
