"""The (S, W) map of packed rows (ssmhub.layers.packing) against a loop over each row's segments: exact with the
sizes read from the rows, with the sizes given as host integers (or larger bounds, spare slots padding), and
built once for every layer of a forward."""

from itertools import pairwise

import pytest
import torch

from ssmhub.layers.packing import PackedRows, split_documents


def _reference(starts: torch.Tensor, continuing: bool) -> list[tuple[int, int, int, bool]]:
    """Each segment as (row, begin, end, continues), row by row, in a Python loop."""
    segments = []
    B, L = starts.shape
    for b in range(B):
        cuts = [0] + [t for t in range(1, L) if starts[b, t]] + [L]
        for i, (begin, end) in enumerate(pairwise(cuts)):
            segments.append((b, begin, end, continuing and i == 0 and not bool(starts[b, 0])))
    return segments


def _random_starts(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    B, L = int(torch.randint(1, 5, (1,), generator=g)), int(torch.randint(1, 13, (1,), generator=g))
    return torch.rand(B, L, generator=g) < torch.rand(1, generator=g)


def _check(starts, continuing, segments, spare: int = 0):
    reference = _reference(starts, continuing)
    L = starts.shape[1]
    width = segments.valid.shape[1]
    assert segments.valid.shape[0] == len(reference) + spare
    assert width >= max(end - begin for _, begin, end, _ in reference)
    for s, (row, begin, end, continues) in enumerate(reference):
        size = end - begin
        first = 0 if continues else width - size  # fresh segments right-aligned, a continued one left-aligned
        expected_valid = torch.zeros(width, dtype=torch.bool)
        expected_valid[first : first + size] = True
        assert torch.equal(segments.valid[s], expected_valid)
        assert segments.index[s, first : first + size].tolist() == [row * L + t for t in range(begin, end)]
        assert (int(segments.row[s]), bool(segments.continues[s])) == (row, continues)
        assert segments.slot[row * L + begin : row * L + end].tolist() == [s * width + first + j for j in range(size)]
    assert not segments.valid[len(reference) :].any()  # spare segments hold nothing
    last = [max(s for s, seg in enumerate(reference) if seg[0] == b) for b in range(starts.shape[0])]
    assert segments.last.tolist() == last


@pytest.mark.parametrize("continuing", [False, True])
@pytest.mark.parametrize("seed", range(40))
def test_the_map_equals_a_loop_over_segments(seed, continuing):
    starts = _random_starts(seed)
    _check(starts, continuing, split_documents(starts, continuing))
    count = len(_reference(starts, continuing))
    width = max(end - begin for _, begin, end, _ in _reference(starts, continuing))
    _check(starts, continuing, split_documents(starts, continuing, count, width))  # sizes from the collator
    _check(starts, continuing, split_documents(starts, continuing, count + 2, width + 3), spare=2)  # bounds


def test_sizes_below_the_rows_are_refused():
    starts = torch.tensor([[True, False, False, True, False]])  # segments of 3 and 2 tokens
    with pytest.raises(RuntimeError, match="longer than their width bound"):
        split_documents(starts, False, count=2, width=2)
    with pytest.raises(RuntimeError, match="more segments than their count bound"):
        split_documents(starts, False, count=1, width=3)


def test_packed_rows_build_the_map_once_and_check_their_shape(monkeypatch):
    rows = PackedRows(torch.tensor([[True, False, True]]), count=2, width=2)
    calls = []
    original = split_documents
    monkeypatch.setattr("ssmhub.layers.packing.split_documents", lambda *a: calls.append(a) or original(*a))
    assert rows.segments(False) is rows.segments(False)
    rows.segments(True)
    assert [continuing for _, continuing, _, _ in calls] == [False, True]
    assert PackedRows.of(rows, (1, 3)) is rows
    with pytest.raises(ValueError, match=r"document_starts must have shape \(2, 3\)"):
        PackedRows.of(torch.zeros(1, 3, dtype=torch.bool), (2, 3))


def test_a_native_mixer_passes_the_rows_on_to_the_mixers_inside_it(monkeypatch):
    """SeRpEnt's base branch packs natively; its resampling branches batch their documents with the rows it was
    given: one map for both branches, with the caller's sizes (no read)."""
    from ssmhub.layers import SerpentMixer

    calls = []
    original = split_documents
    monkeypatch.setattr("ssmhub.layers.packing.split_documents", lambda *a: calls.append(a[2:]) or original(*a))
    torch.manual_seed(0)
    mixer = SerpentMixer(12, resampling_rates=[0.5, 0.25], resampling_window=3, num_distance_features=2)
    starts = torch.zeros(2, 8, dtype=torch.bool)
    starts[0, 3] = starts[1, 5] = True
    x = torch.randn(2, 8, 12)
    y, _ = mixer(x, document_starts=PackedRows(starts, count=4, width=5))
    assert calls == [(4, 5)]
    assert torch.equal(y, mixer(x, document_starts=starts)[0])  # the same map as the sizes read from the rows
