"""An alpha-beta cost model of the gradient all-reduce: fitted to the all-reduce benchmark, then
used to predict this machine's communication per step and to project a cluster's.

One all-reduce of N bytes over n ranks costs

    T = a(n) * alpha + b(n) * N * beta

alpha is the fixed cost of one message step (latency, handshake, the call's overhead), beta the
seconds per byte that one rank sends. For the ring (reduce-scatter, then all-gather) there are
a = 2(n-1) dependent steps and each rank sends b * N = 2(n-1)/n * N bytes (Patarasuk & Yuan
2009); the additions of the reduction are folded into beta. gloo's own all-reduce is a ring too
when no algorithm is chosen (gloo/allreduce.cc), so the same form is fitted to both.
Halving-doubling (Rabenseifner's reduce-scatter by recursive halving, then all-gather by recursive
doubling; gloo's `halving_doubling`) sends the same 2(n-1)/n * N bytes in a = 2 ceil(log2 n) steps:
it changes the latency term only.

Everything here is a pure function of numbers (no torch, no files): build_design_doc.py reads
the results, calls these, and records where every input came from.
"""
import math
from dataclasses import dataclass

import numpy as np

# --- Assumptions of the projections (each is quoted, and listed in numbers.json as one) ---
CLUSTER_LINKS_GBIT = (10, 25, 100)  # Ethernet-class links between nodes, Gbit/s
CLUSTER_ALPHA_S = 25e-6  # per message step over TCP between nodes (kernel stack + switch)
PROJECTED_WORLD_SIZES = (8, 16, 32, 64, 128, 256)
BUCKET_CANDIDATES_MB = (0.25, 0.5, 1, 2, 4, 8, 25)  # as --bucket-mb (MiB); 25 is DDP's default
REFERENCE_WORLD_SIZE = 64  # the scenario of the "what each technique buys" table
REFERENCE_LINK_GBIT = 25
LARGER_BATCH_FACTOR = 4  # "larger batches": the per-rank batch times this
DDP_FIRST_BUCKET_MB = 1  # torch DDP caps its first bucket at 1 MiB
# so does manual_allreduce.BucketedSync: its FIRST_BUCKET_MB, kept equal by tests/test_cost_model.py
# (this module stays free of torch)
FIRST_BUCKET_MB = 1

def ring_coefficients(world_size):
    """(a, b) of T = a*alpha + b*N*beta for the ring: 2(n-1) steps, 2(n-1)/n of the buffer sent
    per rank."""
    ranks = np.asarray(world_size, dtype=float)
    return 2 * (ranks - 1), 2 * (ranks - 1) / ranks


def halving_doubling_coefficients(world_size):
    """(a, b) for halving-doubling: 2 ceil(log2 n) steps, the ring's 2(n-1)/n of the buffer per
    rank."""
    ranks = np.asarray(world_size, dtype=float)
    return 2 * np.ceil(np.log2(np.maximum(ranks, 1))), 2 * (ranks - 1) / ranks


ALGORITHMS = {"ring": ring_coefficients, "halving-doubling": halving_doubling_coefficients}


def allreduce_time(nbytes, world_size, alpha, beta, algorithm="ring"):
    """Predicted seconds of one all-reduce of `nbytes` over `world_size` ranks (0 for one rank)."""
    message_steps, sent_fraction = ALGORITHMS[algorithm](world_size)
    return float(message_steps * alpha + sent_fraction * nbytes * beta)


def latency_share(nbytes, world_size, alpha, beta, algorithm="ring"):
    """The latency term's share of one all-reduce's predicted time."""
    message_steps, _ = ALGORITHMS[algorithm](world_size)
    return float(message_steps * alpha) / allreduce_time(nbytes, world_size, alpha, beta, algorithm)


@dataclass(frozen=True)
class Fit:
    """The α-β model fitted to measured all-reduce times, with how well it fits them."""
    alpha: float                   # seconds per message step
    beta: float                    # seconds per byte sent by one rank
    r2: float                      # 1 - residual / total sum of squares, of the times themselves
    median_relative_error: float   # median over points of |predicted - measured| / measured
    max_relative_error: float
    points: int

    @property
    def bandwidth_gbps(self):
        """1 / beta in GB/s (1e9 bytes per second): the fitted bus bandwidth."""
        return 1 / self.beta / 1e9 if self.beta > 0 else math.inf


def fit_alpha_beta(world_sizes, sizes, times, relative=True):
    """Least-squares alpha and beta of the ring model from measured all-reduce times.

    `relative=True` weights each point by 1 / its time, so the fit minimises relative errors: a
    4 KiB message (tens of microseconds) counts as much as a 64 MiB one (tens of milliseconds).
    Unweighted, the large messages decide everything and alpha, which only the small ones
    show, comes out as noise. Both coefficients are kept non-negative (a negative latency or
    bandwidth has no meaning): if the free solution has one below zero, the better fit with
    that one at zero is taken.
    """
    world_sizes = np.asarray(world_sizes, dtype=float)
    sizes = np.asarray(sizes, dtype=float)
    times = np.asarray(times, dtype=float)
    if len(times) < 2:
        raise ValueError("fitting alpha and beta needs at least two measurements")
    message_steps, sent_fraction = ring_coefficients(world_sizes)
    design = np.column_stack([message_steps, sent_fraction * sizes])
    weights = 1 / times if relative else np.ones_like(times)
    weighted = design * weights[:, None]
    target = times * weights

    def solve(columns):
        coefficients = np.zeros(2)
        coefficients[columns] = np.linalg.lstsq(weighted[:, columns], target, rcond=None)[0]
        return coefficients

    coefficients = solve([0, 1])
    if (coefficients < 0).any():
        candidates = [candidate for candidate in (solve([0]), solve([1]))
                      if (candidate >= 0).all()]
        coefficients = min(candidates,
                           key=lambda candidate: np.sum((weighted @ candidate - target) ** 2))
    predicted = design @ coefficients
    relative_errors = np.abs(predicted - times) / times
    total = np.sum((times - times.mean()) ** 2)
    r2 = 1 - np.sum((times - predicted) ** 2) / total if total > 0 else 1.0
    alpha, beta = coefficients
    return Fit(float(alpha), float(beta), float(r2), float(np.median(relative_errors)),
               float(relative_errors.max()), len(times))


def fit_per_world(world_sizes, sizes, times):
    """{world size: Fit} of each world size's points alone (two or more points each)."""
    points = list(zip(world_sizes, sizes, times))
    fits = {}
    for world in sorted({point_world for point_world, _, _ in points}):
        mine = [(point_world, size, time) for point_world, size, time in points
                if point_world == world]
        if len(mine) >= 2:
            fits[world] = fit_alpha_beta(*zip(*mine))
    return fits


def relative_error(predicted, measured):
    """(predicted - measured) / measured: positive where the model overestimates."""
    return (predicted - measured) / measured


# --- Messages per step: what each strategy all-reduces ------------------------------------------

def bucket_sizes(param_bytes, bucket_mb, first_bucket_mb=FIRST_BUCKET_MB):
    """Bytes of each bucket of manual_allreduce.BucketedSync, in launch order.

    `param_bytes` in registration (`parameters()`) order. As BucketedSync: walk the parameters
    in reverse (the order backward produces their gradients) and start a new bucket when the
    next gradient would take the current one past `bucket_mb` MiB; with `first_bucket_mb`, the
    first bucket's cap is the smaller of the two (DDP's small first bucket).
    """
    capacity = min(first_bucket_mb or bucket_mb, bucket_mb) * 2**20
    buckets = []
    size = 0  # bytes in the bucket being filled
    for nbytes in reversed(param_bytes):
        if size and size + nbytes > capacity:
            buckets.append(size)
            size = 0
            capacity = bucket_mb * 2**20
        size += nbytes
    return buckets + [size]


def ddp_bucket_sizes(param_bytes, bucket_mb, first_bucket_mb=DDP_FIRST_BUCKET_MB):
    """Bytes of each bucket of torch DDP (one dtype, one device), in launch order.

    As torch.distributed._compute_bucket_assignment_by_size with limits [1 MiB, bucket_mb MiB]:
    in registration order a bucket closes once it reaches its limit; DDP then reverses the list,
    so the bucket holding the last layers is launched first.
    """
    first_limit = first_bucket_mb * 2**20
    limit = bucket_mb * 2**20
    buckets = []
    size = 0  # bytes in the bucket being filled
    for nbytes in param_bytes:
        size += nbytes
        if size >= (limit if buckets else first_limit):
            buckets.append(size)
            size = 0
    if size:
        buckets.append(size)
    return buckets[::-1]


def messages_per_step(strategy, param_bytes, bucket_mb=25.0, first_bucket_mb=FIRST_BUCKET_MB):
    """Bytes of each all-reduce one training step issues, for a strategy (or 'ddp');
    `first_bucket_mb` as in `bucket_sizes`."""
    if strategy == "per-param":
        return list(param_bytes)
    if strategy in ("flat", "ring", "shm"):
        return [sum(param_bytes)]
    if strategy == "bucketed":
        return bucket_sizes(param_bytes, bucket_mb, first_bucket_mb)
    if strategy == "ddp":
        return ddp_bucket_sizes(param_bytes, bucket_mb)
    raise ValueError(f"unknown strategy {strategy!r}")


def step_comm_time(messages, world_size, alpha, beta):
    """Predicted seconds of one step's all-reduces issued one after another (busy time)."""
    return sum(allreduce_time(nbytes, world_size, alpha, beta) for nbytes in messages)


# --- Overlap with backward, and projections ---------------------------------------------------

def exposed_after_backward(backward_s, bucket_bytes, comm_times):
    """Seconds past the end of backward until the last bucket's all-reduce is done.

    Assumes backward produces gradient bytes at a steady rate, so a bucket is ready when the
    bytes of it and of every bucket before it are produced; the all-reduces run one at a time
    (one communication thread), each starting when its bucket is ready and the previous is done.
    """
    total = sum(bucket_bytes)
    produced = 0
    finish = 0.0
    for nbytes, seconds in zip(bucket_bytes, comm_times):
        produced += nbytes
        finish = max(finish, backward_s * produced / total) + seconds
    return max(0.0, finish - backward_s)


def project_step(compute_s, backward_s, param_bytes, world_size, alpha, beta, bucket_mb=None,
                 wire_fraction=1.0, first_bucket_mb=FIRST_BUCKET_MB, algorithm="ring"):
    """Projected step: {step_s, comm_s, exposed_s, efficiency}, all-reducing with `algorithm`.

    `bucket_mb=None`: one flat all-reduce after backward (nothing overlaps). With a bucket size,
    buckets overlap the rest of backward as in `exposed_after_backward`. `wire_fraction` scales
    the bytes on the wire (0.5 for fp16/bf16 compression); `first_bucket_mb` as in `bucket_sizes`.
    Efficiency is weak scaling, as this project runs (per-rank batch fixed):
    compute / (compute + exposed communication).
    """
    if bucket_mb is None:
        sizes = [sum(param_bytes)]
    else:
        sizes = bucket_sizes(param_bytes, bucket_mb, first_bucket_mb)
    wire = [nbytes * wire_fraction for nbytes in sizes]
    times = [allreduce_time(nbytes, world_size, alpha, beta, algorithm) for nbytes in wire]
    exposed = sum(times) if bucket_mb is None else exposed_after_backward(backward_s, wire, times)
    step = compute_s + exposed
    return {"step_s": step, "comm_s": sum(times), "exposed_s": exposed,
            "efficiency": compute_s / step}


def best_bucket(compute_s, backward_s, param_bytes, world_size, alpha, beta,
                candidates=BUCKET_CANDIDATES_MB, wire_fraction=1.0, first_bucket_mb=FIRST_BUCKET_MB,
                algorithm="ring"):
    """(bucket_mb, projection) with the shortest projected step among `candidates` (the smaller
    on ties)."""
    projections = [(bucket_mb, project_step(compute_s, backward_s, param_bytes, world_size, alpha,
                                            beta, bucket_mb, wire_fraction, first_bucket_mb,
                                            algorithm))
                   for bucket_mb in sorted(candidates)]
    return min(projections, key=projected_step)


def projected_step(candidate):
    """Sort key of a (bucket_mb, projection) pair: its projected step."""
    _bucket_mb, projection = candidate
    return projection["step_s"]


def crossover_world_size(compute_s, total_bytes, alpha, beta, largest=2**20, algorithm="ring"):
    """The smallest world size whose flat all-reduce takes at least as long as the compute of a
    step (communication dominates from there on), or None if none up to `largest` does."""
    world_sizes = np.arange(2, largest + 1, dtype=float)
    message_steps, sent_fraction = ALGORITHMS[algorithm](world_sizes)
    comm = message_steps * alpha + sent_fraction * total_bytes * beta
    (over,) = np.nonzero(comm >= compute_s)
    return int(world_sizes[over[0]]) if len(over) else None


def link_beta(gbit_per_s):
    """Seconds per byte of a link of `gbit_per_s` Gbit/s."""
    return 8 / (gbit_per_s * 1e9)
