"""The online training loop (ssmhub.training.online) against a hand-written loop, its cadences, early stop, resume."""

from __future__ import annotations

import torch
from training_helpers import same_run_state

from ssmhub.training.online import OnlineRun, new_progress, set_learning_rates, train_online
from ssmhub.training.run_state import load_run_state


def _parts(seed: int = 0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    return model, optimizer, torch.Generator().manual_seed(seed)


def _loss_of(model):
    def loss(generator: torch.Generator) -> torch.Tensor:
        x = torch.randn(4, 3, generator=generator)
        return (model(x) - x[:, :2].flip(-1)).pow(2).mean()

    return loss


def _halving(step: int) -> float:
    return 0.5**step


def test_the_loop_takes_the_steps_of_a_hand_written_one():
    """Same ops on the same inputs in the same order: the same bits."""
    model, optimizer, data = _parts()
    run = OnlineRun(model, optimizer, data, config={})
    train_online(run, _loss_of(model), 5, lr_factor=_halving)

    reference, ref_optimizer, ref_data = _parts()
    losses = []
    for step in range(5):
        for group in ref_optimizer.param_groups:
            group["lr"] = 0.1 * 0.5**step
        x = torch.randn(4, 3, generator=ref_data)
        loss = (reference(x) - x[:, :2].flip(-1)).pow(2).mean()
        ref_optimizer.zero_grad()
        loss.backward()
        ref_optimizer.step()
        losses.append(loss.item())
    for got, expected in zip(model.parameters(), reference.parameters()):
        assert torch.equal(got, expected)
    assert run.progress["step"] == 5 and run.progress["loss"] == losses[-1]
    assert [g["lr"] for g in optimizer.param_groups] == [0.1 * 0.5**4] and optimizer.param_groups[0]["base_lr"] == 0.1
    assert torch.equal(data.get_state(), ref_data.get_state())


def test_each_cadence_fires_at_its_multiples_and_the_last_step(tmp_path):
    model, optimizer, data = _parts()
    saved_at, evaluated, lines = [], [], []

    class Spy(OnlineRun):
        def save(self):
            saved_at.append(self.progress["step"])
            super().save()

    run = Spy(model, optimizer, data, config={"seed": 0}, checkpoint=str(tmp_path / "run.pt"))
    train_online(
        run,
        _loss_of(model),
        7,
        evaluate=lambda step: evaluated.append(step) or False,
        eval_every=3,
        log=lines.append,
        log_every=2,
        checkpoint_every=4,
    )
    assert (evaluated, saved_at) == ([3, 6, 7], [4, 7])
    assert [line.split(":")[0] for line in lines] == ["step 2/7", "step 4/7", "step 6/7", "step 7/7"]
    assert load_run_state(tmp_path / "run.pt", {"seed": 0}, ())["progress"]["step"] == 7
    assert run.progress["train_s"] > 0 and run.wall_s() >= run.progress["elapsed_s"] > 0


def test_an_evaluation_that_returns_true_ends_the_run_after_its_checkpoint(tmp_path):
    model, optimizer, data = _parts()
    run = OnlineRun(model, optimizer, data, config={}, checkpoint=str(tmp_path / "run.pt"))
    train_online(run, _loss_of(model), 10, evaluate=lambda step: step == 4, eval_every=2, checkpoint_every=2)
    assert run.progress["step"] == 4
    assert load_run_state(tmp_path / "run.pt", {}, ())["progress"]["step"] == 4


def test_a_resumed_run_trains_like_an_uninterrupted_one(tmp_path):
    whole, pieces = tmp_path / "whole.pt", tmp_path / "pieces.pt"
    model, optimizer, data = _parts()
    uninterrupted = OnlineRun(model, optimizer, data, config={}, checkpoint=str(whole))
    train_online(uninterrupted, _loss_of(model), 6, lr_factor=_halving, checkpoint_every=3)

    model, optimizer, data = _parts()
    train_online(
        OnlineRun(model, optimizer, data, {}, str(pieces)), _loss_of(model), 3, lr_factor=_halving, checkpoint_every=3
    )
    model, optimizer, data = _parts(seed=1)  # another start: everything comes from the checkpoint
    resumed = OnlineRun(model, optimizer, data, config={}, checkpoint=str(pieces))
    resumed.resume(load_run_state(pieces, {}, ()))
    assert resumed.progress["step"] == 3
    train_online(resumed, _loss_of(model), 6, lr_factor=_halving, checkpoint_every=3)
    a, b = load_run_state(whole, {}, ()), load_run_state(pieces, {}, ())
    assert a["progress"]["step"] == b["progress"]["step"] == 6
    same_run_state(b, a)


def test_a_checkpoint_without_a_newer_progress_field_resumes_with_its_fresh_value(tmp_path):
    """Checkpoints written before a field existed (``train_s`` before ssmhub-regular counted it) still load."""
    path = tmp_path / "run.pt"
    model, optimizer, data = _parts()
    run = OnlineRun(model, optimizer, data, config={}, checkpoint=str(path), progress=new_progress(best=-1.0))
    train_online(run, _loss_of(model), 2, checkpoint_every=2)
    saved = load_run_state(path, {}, ())
    del saved["progress"]["train_s"], saved["progress"]["best"]
    again = OnlineRun(*_parts(), config={}, progress=new_progress(best=-1.0))
    again.resume(saved)
    assert again.progress["step"] == 2 and again.progress["train_s"] == 0.0 and again.progress["best"] == -1.0


def test_set_learning_rates_scales_every_group_from_the_rate_it_was_built_with():
    optimizer = torch.optim.SGD([{"params": [torch.zeros(1)], "lr": 1.0}, {"params": [torch.zeros(1)], "lr": 0.5}])
    set_learning_rates(optimizer, 0.5)
    set_learning_rates(optimizer, 0.25)  # of the built rate, not of the current one
    assert [g["lr"] for g in optimizer.param_groups] == [0.25, 0.125]
