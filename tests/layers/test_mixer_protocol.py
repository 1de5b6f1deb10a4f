"""The token-mixer protocol (ssmhub.layers.mixer.TokenMixer), checked once for every mixer.

Each property is held to an independent form of the same numbers: packed documents to each document run
alone, the history of states to prefixes run alone, the declared layout to what a forward returns.
"""

from __future__ import annotations

import pytest
import torch

from ssmhub.layers import (
    BDLRNNMixer,
    CausalSelfAttention,
    DLRMixer,
    H3Mixer,
    MambaMixer,
    ResamplingBranch,
    SerpentMixer,
)
from ssmhub.layers.mixer import TokenMixer

WIDTH = 12
TOL = 1e-5  # recurrent states are float32 (complex64): the recurrence and its parallel form agree to that

MIXERS = {
    "dlr": lambda: DLRMixer(WIDTH, state_size=4),
    "dlr-prod": lambda: DLRMixer(WIDTH, state_size=3, kernel_type="prod"),
    "bdlrnn": lambda: BDLRNNMixer(WIDTH, block_size=4, transition_hidden_size=16),
    "attention": lambda: CausalSelfAttention(WIDTH, num_attention_heads=3),
    "h3": lambda: H3Mixer(WIDTH, max_kernel_length=6, ssm_num_heads=4, squash_lambda=0.0),
    "h3-ssm": lambda: H3Mixer(WIDTH, max_kernel_length=6, kernel_type="diagonal_ssm", ssm_state_size=4),
    "mamba": lambda: MambaMixer(WIDTH, state_size=4),
    "mamba-sequential": lambda: MambaMixer(WIDTH, state_size=4, scan="sequential"),
    "bdlrnn-parallel": lambda: BDLRNNMixer(WIDTH, block_size=4, transition_hidden_size=16, scan="parallel"),
    "bdlrnn-zero-x0": lambda: BDLRNNMixer(WIDTH, block_size=4, transition_hidden_size=16, learned_initial_state=False),
    "resampling-branch": lambda: ResamplingBranch(
        WIDTH, 4, 0.5, resampling_window=3, num_distance_features=2, expand=2, state_size=4
    ),
    "serpent": lambda: SerpentMixer(WIDTH, resampling_rates=[0.5], resampling_window=3, num_distance_features=2),
}
NONCAUSAL = {
    "dlr-bidirectional": (lambda: DLRMixer(WIDTH, state_size=4, bidirectional=True), "bidirectional"),
    "serpent-faithful": (
        lambda: SerpentMixer(WIDTH, resampling_rates=[0.5], resampling_window=3, resampling_mode="faithful"),
        "resampling_mode='causal'",
    ),
}


@pytest.fixture(params=sorted(MIXERS), ids=str)
def mixer(request) -> TokenMixer:
    torch.manual_seed(0)
    return MIXERS[request.param]().double().eval()


def _inputs(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, length, WIDTH, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def _assert_states_equal(got: dict, expected: dict) -> None:
    assert got.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], atol=TOL, rtol=TOL, msg=name)


def test_every_mixer_subclasses_the_protocol(mixer):
    assert isinstance(mixer, TokenMixer)


def test_init_state_follows_the_declared_layout(mixer):
    state = mixer.init_state(3)
    layout = mixer.state_layout(3)
    assert state.keys() == layout.keys()
    for name, (shape, dtype) in layout.items():
        assert state[name].dtype == dtype, name
        assert tuple(state[name].shape) == tuple(0 if n is None else n for n in shape), name
    _, returned = mixer(_inputs(3, 5), return_state=True)
    mixer.check_state(returned, 3)  # a forward's state passes the same check a step makes


def test_a_state_of_the_wrong_layout_is_refused_before_any_work(mixer):
    state = mixer.init_state(2)
    name = next(iter(state))
    with pytest.raises(ValueError, match="state must hold"):
        mixer(_inputs(2, 3), state={**state, name: state[name][:1]})
    with pytest.raises(ValueError, match="state must hold"):
        mixer.step(_inputs(2, 1)[:, 0], {k: v for k, v in state.items() if k != name})
    with pytest.raises(ValueError, match="x_t must have shape"):
        mixer.step(_inputs(2, 2), state)
    with pytest.raises(ValueError, match="x must have shape"):
        mixer(_inputs(2, 3)[..., :-1])


def test_a_step_from_coefficients_formed_once_is_the_step(mixer):
    """The step coefficients formed once and handed to step (what a serving engine does for its decode rows) change
    no bit: the same operations on the same inputs."""
    with torch.no_grad():
        _, state = mixer(_inputs(2, 4), return_state=True)
        x_t = _inputs(2, 1, seed=2)[:, 0]
        y, new = mixer.step(x_t, state)
        y_given, new_given = mixer.step(x_t, state, mixer.step_coefficients())
    assert y_given.equal(y) and new_given.keys() == new.keys()
    assert all(new_given[name].equal(value) for name, value in new.items())


def test_step_coefficients_are_kept_until_a_parameter_changes(mixer):
    """Decoding forms the step coefficients once (:meth:`kept_step_coefficients`): the same tensors from step to step
    without gradients; an in-place update of the parameters (an optimizer step, a load) forms them again, equal to
    fresh ones; with gradients on they are formed anew (a kept value would carry a stale graph)."""
    with torch.no_grad():
        first = mixer.kept_step_coefficients()
        if not first:  # a mixer whose step derives nothing from its parameters alone
            return
        assert mixer.kept_step_coefficients() is first
        before = {name: value.clone() for name, value in first.items()}
        for parameter in mixer.parameters():
            parameter.mul_(1.5)
        again = mixer.kept_step_coefficients()
        fresh = mixer.step_coefficients()
    assert again is not first and again.keys() == fresh.keys()
    assert all(again[name].equal(fresh[name]) for name in fresh)  # the same operations on the same inputs
    assert any(not again[name].equal(before[name]) for name in before)
    with torch.enable_grad():
        assert mixer.kept_step_coefficients() is not again


def test_packed_documents_equal_each_document_alone(mixer):
    """A row holding documents of lengths 3, 4, 2 back to back gives, on every position, what each document
    gives when run alone from the start; its final state continues as the last document's does (attention keeps
    the earlier documents' keys, masked, so the states are equivalent rather than equal)."""
    lengths = [3, 4, 2]
    x = _inputs(2, sum(lengths))
    starts = torch.zeros(2, sum(lengths), dtype=torch.bool)
    starts[:, [0, 3, 7]] = True
    y, state = mixer(x, state=None, return_state=True, document_starts=starts)
    begin = 0
    for length in lengths:
        alone, alone_state = mixer(x[:, begin : begin + length], return_state=True)
        torch.testing.assert_close(y[:, begin : begin + length], alone, atol=TOL, rtol=TOL)
        begin += length
    more = _inputs(2, 3, seed=3)
    torch.testing.assert_close(mixer(more, state=state)[0], mixer(more, state=alone_state)[0], atol=TOL, rtol=TOL)


def test_a_document_start_in_one_row_leaves_the_other_row_alone(mixer):
    x = _inputs(2, 6)
    starts = torch.zeros(2, 6, dtype=torch.bool)
    starts[0, 0] = starts[1, 0] = starts[1, 4] = True
    y = mixer(x, document_starts=starts)[0]
    torch.testing.assert_close(y[0], mixer(x[:1])[0][0], atol=TOL, rtol=TOL)
    torch.testing.assert_close(y[1, 4:], mixer(x[1:, 4:])[0][0], atol=TOL, rtol=TOL)


def test_packed_rows_equal_the_stepwise_reference_with_a_state_and_padding(mixer):
    """The batched-documents form against the one-token recurrence that resets at every start: outputs, final
    state and gradients, for rows that continue an incoming state, start fresh at 0, and hold left padding."""
    prefix_state = mixer(_inputs(2, 3, seed=2), return_state=True)[1]
    x = _inputs(2, 8).requires_grad_()
    starts = torch.zeros(2, 8, dtype=torch.bool)
    starts[0, [3, 4]] = True  # row 0 continues the incoming state for 3 tokens, then documents of 1 and 4
    starts[1, [0, 6]] = True  # row 1 restarts at once: documents of 6 and 2
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[1, :2] = 0  # its first document is left-padded
    y, state = mixer(x, mask, prefix_state, return_state=True, document_starts=starts)
    y_ref, state_ref = mixer._forward_documents_stepwise(x * mask[..., None], mask, prefix_state, True, starts)
    torch.testing.assert_close(y, y_ref, atol=TOL, rtol=TOL)
    more = _inputs(2, 3, seed=3)  # attention's key caches differ in length (masked keys): compare what follows
    torch.testing.assert_close(mixer(more, state=state)[0], mixer(more, state=state_ref)[0], atol=TOL, rtol=TOL)
    if not isinstance(mixer, CausalSelfAttention):
        _assert_states_equal(state, state_ref)
    weights = torch.randn_like(y)
    (grad,) = torch.autograd.grad((y * weights).sum(), x)
    (grad_ref,) = torch.autograd.grad((y_ref * weights).sum(), x)
    torch.testing.assert_close(grad, grad_ref, atol=TOL, rtol=TOL)


NATIVE_PACKING = sorted(name for name, make in MIXERS.items() if make().native_packing)  # the mixers that say so


@pytest.mark.parametrize("name", NATIVE_PACKING)
def test_native_packed_forms_run_the_row_itself_not_a_batch_of_documents(name, monkeypatch):
    """Mixers with a native packed form never call the protocol's batch of documents (whose cost is S×W)."""

    def refuse(*args, **kwargs):
        raise AssertionError("split_documents called: the generic packed form ran")

    monkeypatch.setattr("ssmhub.layers.packing.split_documents", refuse)
    torch.manual_seed(0)
    mixer = MIXERS[name]()
    if isinstance(mixer, SerpentMixer):  # its resampling branches still batch their documents
        mixer = SerpentMixer(WIDTH, resampling_rates=[])
    starts = torch.zeros(2, 6, dtype=torch.bool)
    starts[:, [0, 2]] = True
    mixer(torch.randn(2, 6, WIDTH), document_starts=starts)


@pytest.mark.parametrize("continuing", [False, True])
def test_long_packed_rows_equal_the_stepwise_reference(mixer, continuing):
    """Documents of lengths 1, 2, 17, 5, 15 (starts on and off the selective scan's 16-step chunks, longer than
    every kernel here), rows that differ, with and without an incoming state: outputs, final state, gradients."""
    length = 40
    x = _inputs(2, length, seed=5).requires_grad_()
    starts = torch.zeros(2, length, dtype=torch.bool)
    starts[0, [0, 1, 3, 20, 25]] = True
    starts[1, [16, 17, 32]] = True
    starts[1, 0] = not continuing
    state = mixer(_inputs(2, 4, seed=6), return_state=True)[1] if continuing else None
    y, final = mixer(x, state=state, return_state=True, document_starts=starts)
    y_ref, final_ref = mixer._forward_documents_stepwise(x, None, state, True, starts)
    torch.testing.assert_close(y, y_ref, atol=TOL, rtol=TOL)
    if not isinstance(mixer, CausalSelfAttention):
        _assert_states_equal(final, final_ref)
    weights = torch.randn_like(y)
    (grad,) = torch.autograd.grad((y * weights).sum(), x)
    (grad_ref,) = torch.autograd.grad((y_ref * weights).sum(), x)
    torch.testing.assert_close(grad, grad_ref, atol=TOL, rtol=TOL)


@pytest.mark.parametrize("name", sorted(NONCAUSAL))
def test_packed_rows_of_a_mixer_that_reads_later_tokens_equal_each_document_alone(name):
    mixer = NONCAUSAL[name][0]().eval()
    x = torch.randn(1, 7, WIDTH)
    starts = torch.zeros(1, 7, dtype=torch.bool)
    starts[0, [0, 2]] = True
    y = mixer(x, document_starts=starts)[0]
    torch.testing.assert_close(y[:, :2], mixer(x[:, :2])[0], atol=TOL, rtol=TOL)
    torch.testing.assert_close(y[:, 2:], mixer(x[:, 2:])[0], atol=TOL, rtol=TOL)


def test_document_starts_of_the_wrong_shape_are_refused(mixer):
    with pytest.raises(ValueError, match="document_starts must have shape"):
        mixer(_inputs(2, 4), document_starts=torch.zeros(2, 3, dtype=torch.bool))


@pytest.mark.parametrize("name", sorted(NONCAUSAL))
def test_a_mixer_that_reads_later_tokens_has_no_state(name):
    build, says = NONCAUSAL[name]
    mixer = build()
    x = torch.randn(1, 4, WIDTH)
    assert mixer(x)[0].shape == (1, 4, WIDTH)  # it mixes, statelessly
    for call in (
        lambda: mixer.init_state(1),
        lambda: mixer(x, return_state=True),
        lambda: mixer.step(x[:, 0], {}),
    ):
        with pytest.raises(ValueError, match=says):
            call()
