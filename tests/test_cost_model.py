"""The cost model's derivations give numbers a reader can work out by hand: the ring's message steps
and bytes per rank, the bytes of each bucket at a cap, and the world size from which a step's
all-reduce outlasts its compute (rubric item design.numbers). The rest of the model, built on
them, recovers what it is given: the α-β fit and its bootstrap interval, the overlap with backward
as a traced backward makes each bucket ready, the best bucket size with one flat all-reduce among
the candidates, halving-doubling, DDP's buckets taken as sent; and the published figures carry
their sources.

analysis/cost_model.py holds the derivations, so it runs only in a child process with the code
under test (grading/launch.py run_alone): `cost_model_gives` sends it the calls and gets plain
numbers back, and the assertions are made here. The cost model is imported inside the function run
there, never at the top: this module is also imported by the process that decides the tests
(grading/judge.py)."""
import dataclasses

import numpy as np
import pytest

from analysis.cost_model import FIRST_BUCKET_MB as COST_MODEL_FIRST_BUCKET_MB
from analysis.traces import gradient_readiness
from grading.launch import run_alone
from manual_allreduce import FIRST_BUCKET_MB

pytestmark = pytest.mark.rubric("design.numbers")

MiB = 2**20
KiB = 2**10
# A made-up model's gradient bytes, in registration order: the last one is produced first.
LAYOUT = [768 * KiB, 64 * KiB, 512 * KiB, 256 * KiB, 1536 * KiB, 128 * KiB]
# The MLP 784-512-256-128-10 in fp32: each layer's weight, then its bias.
MLP_LAYOUT = [784 * 512 * 4, 512 * 4, 512 * 256 * 4, 256 * 4, 256 * 128 * 4, 128 * 4, 128 * 10 * 4,
              10 * 4]


def call(name, *args, **kwargs):
    """One call of cost_model's function `name`, to be made in the child."""
    return name, args, kwargs


def cost_model_gives(*calls):
    """What cost_model returns for each of `calls`, made in one child, as plain numbers."""
    return run_alone(make_calls, calls)


def make_calls(calls):
    """Each call's result, as plain Python numbers and lists. Run in a child."""
    from analysis import cost_model

    return [plain(getattr(cost_model, name)(*args, **kwargs)) for name, args, kwargs in calls]


def plain(value):
    """`value` with numpy's numbers and arrays as Python's and a Fit as a dict (bandwidth_gbps
    included): what comes back from a child."""
    if dataclasses.is_dataclass(value):
        return plain(dict(dataclasses.asdict(value), bandwidth_gbps=value.bandwidth_gbps))
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    return value


# --- The derivations, against numbers worked by hand ----------------------------------------------

def test_the_ring_takes_2_n_minus_1_steps_and_each_rank_sends_2_n_minus_1_over_n_of_the_buffer():
    buffer = 4 * MiB
    worlds = [1, 2, 3, 8]
    results = cost_model_gives(*[call("ring_coefficients", world) for world in worlds],
                               call("ring_coefficients", np.array(worlds)),
                               call("allreduce_time", buffer, 8, 25e-6, 0.8e-9))
    *each, together, seconds = results
    # n = 1: nothing to exchange. n = 2: one exchange per phase, each rank sends its half twice.
    # n = 3: 4 steps, 2 x 2/3 of 4 MiB. n = 8: 14 steps, 2 x 7/8 of 4 MiB = 7 MiB.
    expected_steps = [0, 2, 4, 14]
    expected_bytes = [0, 4 * MiB, 16 * MiB / 3, 7 * MiB]
    for world, (steps, fraction), want_steps, want_bytes in zip(worlds, each, expected_steps,
                                                                expected_bytes):
        assert steps == want_steps, f"message steps at n = {world}"
        assert fraction * buffer == pytest.approx(want_bytes), f"bytes per rank at n = {world}"
    # an array of world sizes gives arrays of both, element by element (fit_alpha_beta's use)
    steps, fractions = together
    assert steps == expected_steps
    assert [fraction * buffer for fraction in fractions] == pytest.approx(expected_bytes)
    # one all-reduce of 4 MiB at n = 8: 14 x 25 µs + 7 MiB x 0.8 ns/B = 0.35 + 5.8720256 ms
    assert seconds == pytest.approx(6.2220256e-3)


def test_buckets_take_gradients_last_first_up_to_their_cap_with_a_smaller_first_bucket():
    # In launch order the gradients are 128, 1536, 256, 512, 64 and 768 KiB.
    results = cost_model_gives(call("bucket_sizes", LAYOUT, 1, 0.5),
                               call("bucket_sizes", LAYOUT, 2, 1),
                               call("bucket_sizes", LAYOUT, 2, None),
                               call("bucket_sizes", LAYOUT, 4, 0.5))
    in_kib = [[nbytes / KiB for nbytes in buckets] for buckets in results]
    # 1 MiB, first 0.5: 128 | 1536 alone (larger than the cap) | 256 + 512 + 64 | 768
    assert in_kib[0] == [128, 1536, 832, 768]
    # 2 MiB, first 1: 128 (1536 would pass 1 MiB) | 1536 + 256 | 512 + 64 + 768
    assert in_kib[1] == [128, 1792, 1344]
    # 2 MiB, no separate first cap: 128 + 1536 + 256 | 512 + 64 + 768
    assert in_kib[2] == [1920, 1344]
    # 4 MiB, first 0.5: 128 | the rest, 3136 KiB
    assert in_kib[3] == [128, 3136]
    for buckets in results:
        assert sum(buckets) == sum(LAYOUT) and all(isinstance(size, int) for size in buckets)


def test_a_bucket_may_fill_its_cap_exactly_and_the_first_cap_is_the_smaller_of_the_two():
    results = cost_model_gives(call("bucket_sizes", [512 * KiB] * 3, 1, None),
                               call("bucket_sizes", [512 * KiB] * 3, 1, 0.5),
                               call("bucket_sizes", LAYOUT, 0.25, 1))
    # three 512 KiB gradients at 1 MiB: two fill the first bucket exactly, the third goes alone
    assert results[0] == [1 * MiB, 512 * KiB]
    # with a 0.5 MiB first cap the first bucket holds one, the next two fill 1 MiB
    assert results[1] == [512 * KiB, 1 * MiB]
    # a 0.25 MiB cap with a 1 MiB first cap: the first is 0.25 MiB too, so every gradient of
    # the layout goes alone
    assert [nbytes / KiB for nbytes in results[2]] == [128, 1536, 256, 512, 64, 768]


def test_the_mlps_gradients_fall_into_the_buckets_worked_by_hand():
    # default cost_model first bucket (1 MiB, BucketedSync's)
    at_25, at_quarter = cost_model_gives(call("bucket_sizes", MLP_LAYOUT, 25),
                                         call("bucket_sizes", MLP_LAYOUT, 0.25))
    # 25 MiB: every tensor but the first weight fits in the first 1 MiB bucket:
    # 40 + 5,120 + 512 + 131,072 + 1,024 + 524,288 + 2,048 = 664,104 bytes; then 784 x 512 x 4
    assert at_25 == [664_104, 1_605_632]
    # 0.25 MiB (262,144 bytes): the last layers up to the second bias (137,768), then the second
    # weight alone, the first bias alone, the first weight alone
    assert at_quarter == [137_768, 524_288, 2_048, 1_605_632]


def test_communication_dominates_from_the_first_world_size_whose_all_reduce_outlasts_compute():
    beta, = cost_model_gives(call("link_beta", 10))
    # 10 Gbit/s: 8 bits per byte / 1e10 bits per second
    assert beta == pytest.approx(0.8e-9)
    # 2.5 MB over 10 Gbit/s links with alpha = 25 µs: T(n) = 50 µs (n - 1) + 4 ms (n - 1) / n
    compute, nbytes, alpha = 10e-3, 2.5e6, 25e-6
    results = cost_model_gives(
        call("crossover_world_size", compute, nbytes, alpha, beta),
        call("crossover_world_size", compute, nbytes, alpha, beta, largest=122),
        call("crossover_world_size", compute, nbytes, alpha, beta, largest=121),
        call("crossover_world_size", 1e-3, nbytes, alpha, beta),
        call("crossover_world_size", compute, nbytes, 0.0, beta),
        call("crossover_world_size", 4.5e-3, nbytes, alpha, beta, algorithm="halving-doubling"),
        call("crossover_world_size", compute, nbytes, alpha, beta, algorithm="halving-doubling"))
    # T(121) = 6.0 + 3.967 = 9.967 ms < 10 ms <= T(122) = 6.05 + 3.967 = 10.017 ms
    assert results[0] == 122
    # the search goes up to `largest`, included
    assert results[1] == 122 and results[2] is None
    # 1 ms: already T(2) = 0.05 + 2 ms; one rank communicates nothing, so 2 is the smallest answer
    assert results[3] == 2
    # without latency the ring's time stays below 4 ms: never
    assert results[4] is None
    # halving-doubling pays 2 ceil(log2 n) x 25 µs: T(1024) = 0.5 + 3.996 ms < 4.5 ms, and
    # T(1025) = 0.55 + 3.996 ms >= 4.5 ms; at 10 ms never (at most 1 + 4 ms up to 2^20 ranks)
    assert results[5] == 1025 and results[6] is None


# --- What is built on them ------------------------------------------------------------------------

def synthetic_points(alpha, beta, noise, seed=0):
    """(world sizes, sizes, times) of the ring model, with relative Gaussian noise: the times
    written by hand, 2(n-1) alpha + 2(n-1)/n N beta."""
    rng = np.random.default_rng(seed)
    worlds, sizes = np.meshgrid([2, 3, 4, 8], 4096 * 4.0 ** np.arange(8))
    worlds = worlds.ravel()
    sizes = sizes.ravel()
    times = 2 * (worlds - 1) * alpha + 2 * (worlds - 1) / worlds * sizes * beta
    return worlds, sizes, times * (1 + noise * rng.standard_normal(len(times)))


def test_the_fit_recovers_alpha_and_beta_exactly_from_exact_data():
    fit, = cost_model_gives(call("fit_alpha_beta", *synthetic_points(25e-6, 0.8e-9, noise=0.0)))
    assert fit["alpha"] == pytest.approx(25e-6, rel=1e-9)
    assert fit["beta"] == pytest.approx(0.8e-9, rel=1e-9)
    assert fit["max_relative_error"] < 1e-9
    assert fit["bandwidth_gbps"] == pytest.approx(1 / 0.8e-9 / 1e9)


def test_the_fit_recovers_alpha_and_beta_within_a_few_percent_under_small_noise():
    fits = cost_model_gives(*[call("fit_alpha_beta",
                                   *synthetic_points(25e-6, 0.8e-9, noise=0.02, seed=seed))
                              for seed in range(3)])
    for seed, fit in enumerate(fits):
        assert fit["alpha"] == pytest.approx(25e-6, rel=0.05), seed
        assert fit["beta"] == pytest.approx(0.8e-9, rel=0.05), seed
        assert 0 < fit["median_relative_error"] < 0.05, seed


def test_the_fit_never_returns_a_negative_latency_or_bandwidth():
    worlds, sizes, _ = synthetic_points(0, 1e-9, noise=0.0)
    # below a pure-bandwidth line: alpha would go negative
    times = 2 * (worlds - 1) / worlds * sizes * 1e-9 - 1e-7
    fit, = cost_model_gives(call("fit_alpha_beta", worlds, sizes, np.abs(times)))
    assert fit["alpha"] >= 0 and fit["beta"] > 0


def test_overlap_hides_all_but_what_is_left_after_backward():
    alone, hidden, late, flat, flat_time = cost_model_gives(
        call("exposed_after_backward", 1.0, [1.0], [0.3]),
        call("exposed_after_backward", 1.0, [0.5, 1.0], [0.3, 0.3]),
        call("exposed_after_backward", 1.0, [0.5, 1.0], [0.8, 0.3]),
        call("project_step", 0.01, 0.005, [10**6] * 4, [0.25, 0.5, 0.75, 1.0], 16, 25e-6, 1e-9),
        call("allreduce_time", 4 * 10**6, 16, 25e-6, 1e-9))
    # One bucket, ready as backward ends: nothing overlaps. Two buckets, the first ready halfway
    # through backward: the first hides.
    assert alone == pytest.approx(0.3)
    assert hidden == pytest.approx(0.3)
    # the first runs past backward's end, and the second waits for it
    assert late == pytest.approx(0.6)
    # one flat all-reduce after backward: all of it is exposed
    assert flat["exposed_s"] == pytest.approx(flat_time)
    assert flat["efficiency"] == pytest.approx(0.01 / (0.01 + flat["exposed_s"]))


def backward_trace(instants, steps=(5, 6, 7)):
    """A Chrome trace as `mlp_ddp.py --trace` writes one: per step a backward span of 1 ms and an
    instant as each gradient is accumulated, at its share of backward (`instants`:
    {parameter: share})."""
    events = []
    for step in steps:
        start = step * 10_000.0  # microseconds
        events.append({"ph": "X", "name": "backward", "pid": 0, "tid": 0, "ts": start,
                       "dur": 1000.0, "args": {"step": step}})
        events += [{"ph": "i", "s": "t", "name": f"gradient {name}", "pid": 0, "tid": 0,
                    "ts": start + 1000.0 * share, "args": {"step": step}}
                   for name, share in instants.items()]
    return events


# A CNN-like model in registration order: two convolutions, then a large fully connected layer
# and a small one. Backward reaches the large layer early and spends most of its time in the
# convolutions, whose gradients are small.
CNN_LIKE = {"conv1.weight": (1152, 0.99), "conv2.weight": (73_728, 0.85),
            "fc1.weight": (4_718_592, 0.15), "fc2.weight": (5_120, 0.02)}


def test_a_bucket_is_ready_when_its_last_gradient_is_as_the_trace_measured_it():
    readiness = gradient_readiness(backward_trace(
        {name: share for name, (_, share) in CNN_LIKE.items()}))
    param_bytes = [nbytes for nbytes, _ in CNN_LIKE.values()]
    shares = [readiness[name] for name in CNN_LIKE]
    order, buckets, steady = cost_model_gives(
        call("backward_order", param_bytes, shares),
        call("bucket_ready_shares", [5_120 + 4_718_592, 73_728 + 1152],
             list(zip(param_bytes[::-1], shares[::-1]))),
        call("bucket_ready_shares", [5_120 + 4_718_592, 73_728 + 1152],
             [(5_120 + 4_718_592, 0.98), (73_728 + 1152, 1.0)]))
    # the trace gives each gradient's share, and backward produces them last layer first
    assert shares == pytest.approx([0.99, 0.85, 0.15, 0.02])
    assert [nbytes for nbytes, _ in order] == param_bytes[::-1]
    # fc1 with fc2 is ready when fc1 is, at 15 % of backward, though it holds 98 % of the bytes:
    # a steady byte rate would have it ready at 98 %
    assert buckets == pytest.approx([0.15, 0.99])
    assert steady == pytest.approx([0.98, 1.0])


def test_measured_readiness_lets_the_large_bucket_hide_behind_the_convolutions_backward():
    param_bytes = [nbytes for nbytes, _ in CNN_LIKE.values()]
    measured = [share for _, share in CNN_LIKE.values()]
    # a steady byte rate: each gradient ready when the bytes before it and its own are produced
    produced = np.cumsum(param_bytes[::-1]) / sum(param_bytes)
    steady = list(produced[::-1])
    # 4 MiB buckets: fc2 alone (the first bucket's 1 MiB cap), fc1 alone, the convolutions
    compute, backward, world, alpha, beta = 0.1, 0.05, 2, 100e-6, 8e-9
    with_trace, at_steady_rate, flat = cost_model_gives(
        call("project_step", compute, backward, param_bytes, measured, world, alpha, beta, 4),
        call("project_step", compute, backward, param_bytes, steady, world, alpha, beta, 4),
        call("project_step", compute, backward, param_bytes, measured, world, alpha, beta))
    fc1_seconds = 2 * alpha + 4_718_592 * beta  # n = 2: 2 steps, each rank sends the buffer
    convolutions_seconds = 2 * alpha + (73_728 + 1152) * beta
    # fc1's all-reduce starts at 15 % of backward and is done before backward ends; only the
    # convolutions' bucket, ready at 99 %, is exposed
    assert with_trace["exposed_s"] == pytest.approx(convolutions_seconds - 0.01 * backward)
    # at a steady byte rate fc1 is ready at 98 % and almost all of its all-reduce is exposed
    assert at_steady_rate["exposed_s"] > fc1_seconds
    assert with_trace["exposed_s"] < flat["exposed_s"] / 10


def test_best_bucket_picks_one_flat_all_reduce_where_it_beats_every_bucket_size():
    # Every gradient is ready at the very end of backward, so buckets hide nothing, and each
    # extra all-reduce pays 2(n-1) alpha: one flat all-reduce is the best "bucket".
    param_bytes = [MiB] * 4
    late = [0.97, 0.98, 0.99, 1.0]
    compute, backward, world, alpha, beta = 0.01, 0.005, 64, 25e-6, 0.32e-9
    best, flat, *buckets = cost_model_gives(
        call("best_bucket", compute, backward, param_bytes, late, world, alpha, beta),
        call("project_step", compute, backward, param_bytes, late, world, alpha, beta),
        *[call("project_step", compute, backward, param_bytes, late, world, alpha, beta, size)
          for size in (0.25, 1, 4, 25)])
    bucket_mb, projection = best
    assert bucket_mb is None and projection == flat
    # every bucket size is slower than flat: the first bucket's 1 MiB cap makes two all-reduces
    # at least
    assert all(bucketed["step_s"] > flat["step_s"] for bucketed in buckets)


def test_best_bucket_picks_buckets_where_overlap_pays_for_their_latency():
    # The same gradients ready evenly through backward, with a long backward and little latency:
    # the earlier buckets hide, and the best size beats flat.
    param_bytes = [MiB] * 4
    even = [1.0, 0.75, 0.5, 0.25]
    best, flat = cost_model_gives(
        call("best_bucket", 0.2, 0.1, param_bytes, even, 8, 5e-6, 8e-9),
        call("project_step", 0.2, 0.1, param_bytes, even, 8, 5e-6, 8e-9))
    bucket_mb, projection = best
    assert bucket_mb is not None and projection["step_s"] < flat["step_s"]


def ddp_without_its_layout():
    """messages_per_step('ddp') without the layout DDP sent: the error's message. Run in a
    child."""
    from analysis import cost_model

    try:
        cost_model.messages_per_step("ddp", MLP_LAYOUT)
    except ValueError as error:
        return str(error)
    return None


def test_ddps_messages_are_the_buckets_it_was_seen_to_send_never_a_rule():
    sent = [662_056, 1_607_680]
    messages, = cost_model_gives(call("messages_per_step", "ddp", MLP_LAYOUT, 0.25,
                                      ddp_layout=sent))
    assert messages == sent
    # without the recorded layout there is no answer
    assert "layout" in run_alone(ddp_without_its_layout)


def test_the_bootstrap_interval_is_a_point_for_exact_data_and_holds_the_truth_under_noise():
    exact = synthetic_points(25e-6, 0.8e-9, noise=0.0)
    noisy = synthetic_points(25e-6, 0.8e-9, noise=0.05, seed=1)
    exact_fits, noisy_fits = cost_model_gives(call("bootstrap_fits", *exact, draws=200),
                                              call("bootstrap_fits", *noisy, draws=200))
    # exact points: every resample fits the same alpha and beta
    alphas, betas = zip(*exact_fits)
    assert len(exact_fits) == 200
    assert alphas == pytest.approx([25e-6] * 200, rel=1e-6)
    assert betas == pytest.approx([0.8e-9] * 200, rel=1e-6)
    # 5 % noise: the 95 % intervals hold the true values and are not points
    alpha_interval, beta_interval = cost_model_gives(
        call("interval", [alpha for alpha, _ in noisy_fits]),
        call("interval", [beta for _, beta in noisy_fits]))
    assert alpha_interval[0] < 25e-6 < alpha_interval[1]
    assert beta_interval[0] < 0.8e-9 < beta_interval[1]


def test_a_small_message_out_of_line_widens_the_alpha_interval():
    # One world size, the medians of eight sizes exactly on the model; then the 256 KiB point
    # four times slower than the 1 MiB one, as a noisy machine measured it.
    worlds = np.full(8, 2)
    sizes = 4096 * 4.0 ** np.arange(8)
    times = 2 * 200e-6 + sizes * 1.2e-9
    outlier = times.copy()
    outlier[3] = 2 * outlier[4]
    clean_fits, outlier_fits = cost_model_gives(call("bootstrap_fits", worlds, sizes, times),
                                                call("bootstrap_fits", worlds, sizes, outlier))
    clean, wide = cost_model_gives(call("interval", [alpha for alpha, _ in clean_fits]),
                                   call("interval", [alpha for alpha, _ in outlier_fits]))
    assert clean[1] - clean[0] == pytest.approx(0, abs=1e-12)
    assert wide[1] - wide[0] > 20e-6


@pytest.mark.parametrize("world, steps", [(2, 2), (4, 4), (5, 6), (256, 16)])
def test_halving_doubling_pays_2_log2_n_message_steps_and_the_rings_bandwidth_term(world, steps):
    calls = [call("ring_coefficients", world), call("halving_doubling_coefficients", world)]
    calls += [call("allreduce_time", 10**6, world, alpha, 1e-9, algorithm)
              for alpha in (0, 25e-6) for algorithm in ("ring", "halving-doubling")]
    (_, ring_fraction), (message_steps, sent_fraction), *seconds = cost_model_gives(*calls)
    assert message_steps == steps and sent_fraction == pytest.approx(ring_fraction)
    ring_free, halving_free, ring, halving = seconds
    # with no latency the two cost the same; with latency halving-doubling is never slower
    assert halving_free == pytest.approx(ring_free)
    assert halving <= ring


def test_projections_cap_the_first_bucket_as_bucketed_sync_does():
    # the cost model's default first bucket is BucketedSync's, so every projection uses the
    # layout training uses
    assert FIRST_BUCKET_MB == COST_MODEL_FIRST_BUCKET_MB
