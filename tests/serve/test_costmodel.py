"""The backend's cost model: its fit, the splitter, and the rule for what runs inline on the event loop."""

import math

import pytest
from edgedistill.serve.costmodel import INLINE_TOKENIZE_CHARS, BackendCost, Load, Timing, group_shapes, runs_inline
from edgedistill.serve.settings import Settings
from hypothesis import given
from hypothesis import strategies as st

LIGHT = Load(max_delay=0.0, queued=0, busy=False, idle_for=math.inf)
SERVER_INLINE_MAX = Settings.model_fields["inline_infer_ms"].default / 1000


@pytest.mark.parametrize("attention", [0.0, 2e-7])
def test_backend_cost_fit_recovers_its_terms(attention):
    shapes = [(rows, longest) for rows in (1, 32) for longest in (1, 32, 64)]
    timings = [(rows, n, 3e-4 + 2e-5 * rows * n + attention * rows * n * n) for rows, n in shapes]
    cost = BackendCost.fit(timings)
    assert cost.overhead == pytest.approx(3e-4, rel=1e-6)
    assert cost.per_token == pytest.approx(2e-5, rel=1e-6)
    assert cost.per_token_length == pytest.approx(attention, abs=1e-12)
    with pytest.raises(ValueError, match="two or more shapes"):
        BackendCost.fit([(1, 32, 1e-3), (1, 32, 2e-3)])


@pytest.mark.parametrize("seconds", [math.nan, math.inf])
def test_backend_cost_fit_refuses_timings_that_are_not_finite(seconds):
    with pytest.raises(ValueError, match=r"needs finite timings, got \[\(1, 32, (nan|inf)\)\]"):
        BackendCost.fit([(1, 8, 1e-3), (1, 32, seconds)])


def test_backend_cost_fit_is_the_least_error_with_no_negative_terms():
    # longer calls that took less time: no term growing with the length can explain it without going below zero
    cost = BackendCost.fit([(1, 10, 2e-3), (1, 20, 1e-3), (1, 40, 1e-3)])
    assert (cost.per_token, cost.per_token_length) == (0.0, 0.0)
    assert cost.overhead == pytest.approx(1 / 900), "the c least in (c / 2e-3 - 1)**2 + 2 * (c / 1e-3 - 1)**2"


def launch_bound_timings() -> list[Timing]:
    """Warm-up timings of a backend whose calls take 3 ms at every shape (a small model on a GPU), within 1 %."""
    shapes = [(rows, longest) for longest in (1, 64, 128) for rows in (1, 32) for _ in range(3)]
    return [Timing(rows, longest, 3e-3 * (0.99 if i % 2 else 1.01)) for i, (rows, longest) in enumerate(shapes)]


def test_backend_cost_fit_of_calls_flat_in_their_shape_is_a_per_call_cost():
    assert BackendCost.fit(launch_bound_timings()).overhead == pytest.approx(3e-3, rel=0.01)


def test_a_call_of_a_launch_bound_backend_is_not_run_inline():
    cost = BackendCost.fit(launch_bound_timings())
    assert not runs_inline(cost.seconds([(1, 16)]), SERVER_INLINE_MAX, LIGHT)


def test_backend_cost_scale_follows_measured_times_without_changing_the_split():
    cost = BackendCost(1e-4, 1e-5)
    lengths = [2, 2, 3, 30, 31, 60]
    before = cost.split(lengths)
    for _ in range(30):
        cost.observe([(6, 60)], 2 * cost.unscaled([(6, 60)]))
    assert cost.scale == pytest.approx(2.0, rel=1e-2)
    assert cost.split(lengths) == before


def _cheapest_split(lengths: list[int], cost: BackendCost) -> float:
    """The least expected time over every way to cut `lengths` into consecutive groups (brute force)."""
    best = math.inf
    for mask in range(1 << (len(lengths) - 1)):
        cuts = [i + 1 for i in range(len(lengths) - 1) if mask >> i & 1] + [len(lengths)]
        groups = [(end - start, lengths[end - 1]) for start, end in zip([0, *cuts], cuts, strict=False)]
        best = min(best, cost.unscaled(groups))
    return best


@given(
    lengths=st.lists(st.integers(1, 64), min_size=1, max_size=9).map(sorted),
    overhead=st.sampled_from([0.0, 1e-5, 3e-4, 1e-2]),
    attention=st.sampled_from([0.0, 1e-7]),
)
def test_backend_cost_split_is_the_cheapest_cut(lengths, overhead, attention):
    cost = BackendCost(overhead, 1.6e-5, attention)
    cuts = cost.split(lengths)
    assert cuts[-1] == len(lengths)
    assert cuts == sorted(set(cuts))
    groups = [(end - start, lengths[end - 1]) for start, end in zip([0, *cuts], cuts, strict=False)]
    if overhead == 0:
        assert cuts == [len(lengths)], "with no overhead known, a batch is not split"
    else:
        assert cost.unscaled(groups) == pytest.approx(_cheapest_split(lengths, cost))


def test_backend_cost_fits_timing_records():
    cost = BackendCost.fit([Timing(1, 8, 1e-3), Timing(4, 8, 4e-3)])
    assert cost.call(2, 8) == pytest.approx(2e-3)


def test_backend_cost_with_no_overhead_known_counts_all_time_per_padded_token():
    cost = BackendCost.per_token_only([(2, 10), (1, 30)], 5e-3)
    assert cost.overhead == 0.0
    assert cost.per_token == pytest.approx(1e-4)


def test_group_shapes_are_rows_and_longest_of_each_group():
    assert group_shapes([2, 2, 3, 30, 31], [3, 5]) == [(3, 3), (2, 31)]


def test_work_within_the_limit_runs_inline():
    assert runs_inline(0.001, 0.002)


def test_work_at_the_limit_runs_inline():
    assert runs_inline(0.002, 0.002)


def test_work_over_the_limit_goes_to_the_thread():
    assert not runs_inline(0.003, 0.002)


def test_work_of_unknown_cost_goes_to_the_thread():
    assert not runs_inline(math.inf, 0.002)


def test_a_quick_request_at_light_load_skips_the_queue():
    assert runs_inline(0.001, 0.002, LIGHT)


def test_a_slow_request_at_light_load_queues():
    assert not runs_inline(0.003, 0.002, LIGHT)


@pytest.mark.parametrize(
    "load",
    [
        Load(max_delay=0.001, queued=0, busy=False, idle_for=math.inf),
        Load(max_delay=0.0, queued=1, busy=False, idle_for=math.inf),
        Load(max_delay=0.0, queued=0, busy=True, idle_for=math.inf),
        Load(max_delay=0.0, queued=0, busy=False, idle_for=0.002),
    ],
    ids=["queue-delay-asked", "rows-queued", "batch-running", "batch-finished-within-the-limit"],
)
def test_a_quick_request_queues_unless_the_load_is_light(load):
    assert not runs_inline(0.001, 0.002, load)


def test_short_texts_are_tokenized_inline():
    assert runs_inline(INLINE_TOKENIZE_CHARS, INLINE_TOKENIZE_CHARS)


def test_long_texts_are_tokenized_in_a_thread():
    assert not runs_inline(INLINE_TOKENIZE_CHARS + 1, INLINE_TOKENIZE_CHARS)
