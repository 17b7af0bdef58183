"""An alpha-beta cost model of the gradient all-reduce, fitted to the all-reduce benchmark: this
machine's communication per step, predicted, and a cluster's, projected. No torch, no files.

One all-reduce of N bytes over n ranks costs T = a(n) * alpha + b(n) * N * beta: a(n) message steps
one after another, alpha each; b(n) * N bytes sent by each rank, beta each (gloo's is a ring too).
A step's all-reduces overlap backward as far as their buckets are ready; DDP's are taken as sent.

ring_coefficients, bucket_sizes and crossover_world_size are the assignment's derivations (rubric
item design.numbers), specified by their docstrings."""
import itertools
from dataclasses import dataclass

import numpy as np

# --- Assumptions of the projections (each is quoted, and listed in numbers.json as one) ---
CLUSTER_LINKS_GBIT = (10, 25, 100)  # Ethernet-class links between nodes, Gbit/s
CLUSTER_ALPHA_S = 25e-6  # per message step over TCP between nodes (kernel stack + switch)
BUCKET_CANDIDATES_MB = (0.25, 0.5, 1, 2, 4, 8, 25)  # as --bucket-mb (MiB); 25 is DDP's default
REFERENCE_WORLD_SIZE = 64  # with REFERENCE_LINK_GBIT, the cluster where §5.4 names best buckets
REFERENCE_LINK_GBIT = 25
LARGE_WORLD_SIZE = 256  # where the latency term's share of one all-reduce is quoted
FIRST_BUCKET_MB = 1  # manual_allreduce's, restated to keep torch out; test_cost_model checks it
BOOTSTRAP_DRAWS = 1000  # resamples behind every interval of alpha and beta
INTERVAL_LEVEL = 0.95


def ring_coefficients(world_size):
    """(a, b) of T = a*alpha + b*N*beta for the ring all-reduce of an N-byte buffer over n ranks.

    The ring (manual_collectives.ring_all_reduce) cuts the buffer into n chunks of N/n bytes (take
    them equal here) and runs a reduce-scatter, then an all-gather. Each phase is a sequence of
    exchanges: in one exchange every rank sends one chunk to its right neighbour and receives one
    from its left, all ranks at once, and an exchange cannot start before the one before it is
    done. a: the number of exchanges of the whole all-reduce, one after another (each pays
    alpha). b: the bytes one rank sends over the whole all-reduce, as a fraction of N (a plain
    number, not bytes). One rank (n = 1) sends nothing: (0, 0).

    `world_size` is n: a number, or a numpy array of them (fit_alpha_beta passes one). Return a
    and b as floats, or as float arrays of world_size's shape: numpy arithmetic on
    `np.asarray(world_size, dtype=float)` gives either.
    """
    # BEGIN SOLUTION Task 14: the ring's message steps and bytes
    ranks = np.asarray(world_size, dtype=float)
    return 2 * (ranks - 1), 2 * (ranks - 1) / ranks
    # END SOLUTION


def halving_doubling_coefficients(world_size):
    """(a, b) for halving-doubling: 2 ceil(log2 n) steps, the ring's b (the same bytes per rank)."""
    ranks = np.asarray(world_size, dtype=float)
    return 2 * np.ceil(np.log2(np.maximum(ranks, 1))), ring_coefficients(ranks)[1]


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
    median_relative_error: float   # median over points of |predicted - measured| / measured
    max_relative_error: float

    @property
    def bandwidth_gbps(self):
        """1 / beta in GB/s (1e9 bytes per second): the fitted bus bandwidth."""
        return 1 / self.beta / 1e9 if self.beta > 0 else np.inf


def fit_alpha_beta(world_sizes, sizes, times):
    """Least-squares alpha and beta (each kept >= 0) of the ring model from measured times."""
    if len(times) < 2:
        raise ValueError("fitting alpha and beta needs at least two measurements")
    design, times = fit_system(world_sizes, sizes, times)
    alpha, beta = coefficients = nonnegative_least_squares(design, times)
    relative_errors = np.abs(design @ coefficients - times) / times
    return Fit(float(alpha), float(beta), float(np.median(relative_errors)),
               float(relative_errors.max()))


def fit_system(world_sizes, sizes, times):
    """The ring model's least squares of the points, as float arrays: (design, times)."""
    world_sizes, sizes, times = (np.asarray(values, dtype=float)
                                 for values in (world_sizes, sizes, times))
    message_steps, sent_fraction = ring_coefficients(world_sizes)
    return np.column_stack([message_steps, sent_fraction * sizes]), times


def nonnegative_least_squares(design, times):
    """(alpha, beta) of design @ x = times, each point weighted by 1 / its time so that 4 KiB counts
    as much as 64 MiB (else alpha is noise); if one is < 0, the better fit with one at 0."""
    def solve(columns):
        coefficients = np.zeros(2)
        coefficients[columns] = np.linalg.lstsq(weighted[:, columns], target, rcond=None)[0]
        return coefficients

    weighted, target = design / times[:, None], np.ones_like(times)
    coefficients = solve([0, 1])
    if not (coefficients < 0).any():
        return coefficients
    candidates = [fit for fit in (solve([0]), solve([1])) if (fit >= 0).all()]
    return min(candidates, key=lambda fit: np.sum((weighted @ fit - target) ** 2))


def bootstrap_fits(world_sizes, sizes, times, draws=BOOTSTRAP_DRAWS, seed=0):
    """[(alpha, beta)] fitted to `draws` resamples of the points (fixed seed): how far fits move."""
    design, times = fit_system(world_sizes, sizes, times)  # rows drawn, not rebuilt
    keys = list(zip(world_sizes, sizes))
    rng = np.random.default_rng(seed)
    fits = []
    while len(fits) < draws:
        drawn = rng.integers(0, len(times), len(times))
        if len({keys[index] for index in drawn}) >= 2:  # else too few distinct points: draw again
            alpha, beta = nonnegative_least_squares(design[drawn], times[drawn])
            fits.append((float(alpha), float(beta)))
    return fits


def interval(values, level=INTERVAL_LEVEL):
    """(low, high): the central `level` of `values` (percentiles), e.g. of bootstrap_fits'."""
    tail = 100 * (1 - level) / 2
    low, high = np.percentile(np.asarray(values, dtype=float), [tail, 100 - tail])
    return float(low), float(high)


# --- Messages per step: what each strategy all-reduces ------------------------------------------
def bucket_sizes(param_bytes, bucket_mb, first_bucket_mb=FIRST_BUCKET_MB):
    """Bytes of each bucket of manual_allreduce.BucketedSync, in launch order (a list of ints).

    `param_bytes`: the bytes of each parameter's gradient, in registration (`parameters()`)
    order; never empty. The buckets are laid out as manual_allreduce.bucket_layout lays out the
    parameters. Walk the gradients in reverse (the last parameter first: the order backward
    produces them). The current bucket takes the next gradient, unless it already holds some and
    the gradient would take it past its cap (more bytes than the cap; exactly the cap still
    fits): then the current bucket is closed and a new one starts with that gradient. So a
    gradient larger than the cap gets a bucket of its own, and no gradient is ever split.

    The caps, in MiB (1 MiB = 2**20 bytes): the first bucket's is min(first_bucket_mb,
    bucket_mb) (DDP's small first bucket, so the first all-reduce starts early); every later
    bucket's is bucket_mb. `first_bucket_mb` None (or 0) means no separate first cap: the first
    bucket's is bucket_mb too. The buckets' bytes add up to sum(param_bytes).
    """
    # BEGIN SOLUTION Task 14: the bytes of each bucket
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
    # END SOLUTION


def messages_per_step(strategy, param_bytes, bucket_mb=25.0, first_bucket_mb=FIRST_BUCKET_MB,
                      ddp_layout=None):
    """Bytes of each all-reduce one step of `strategy` issues ('ddp': `ddp_layout`, as DDP sent)."""
    if strategy == "per-param":
        return list(param_bytes)
    if strategy in ("flat", "flat-ring", "flat-shm"):
        return [sum(param_bytes)]
    if strategy == "bucketed":
        return bucket_sizes(param_bytes, bucket_mb, first_bucket_mb)
    if strategy == "ddp":
        if ddp_layout is None:
            raise ValueError("DDP's buckets are not computed from a rule: pass the layout it sent")
        return list(ddp_layout)
    raise ValueError(f"unknown strategy {strategy!r}")


def step_comm_time(messages, world_size, alpha, beta):
    """Predicted seconds of one step's all-reduces issued one after another (busy time)."""
    return sum(allreduce_time(nbytes, world_size, alpha, beta) for nbytes in messages)


# --- Overlap with backward, and projections ---------------------------------------------------
def backward_order(param_bytes, ready_shares):
    """[(bytes, ready share)] of each gradient, given in registration order, in backward's order."""
    latest_first = list(zip(param_bytes, ready_shares))[::-1]
    return sorted(latest_first, key=lambda gradient: gradient[1])  # ties: the last parameter first


def bucket_ready_shares(layout, gradients):
    """Each bucket's ready share of backward, for buckets in launch order (`layout`, their bytes)
    filled from `gradients` in backward's order: a bucket is ready when its last gradient is."""
    shares, pending = [], iter(gradients)
    produced, latest = 0, 0.0
    for needed in itertools.accumulate(layout):
        while produced < needed:
            size, share = next(pending, (None, None))
            if size is None:
                raise ValueError(f"the buckets hold {sum(layout)} bytes, the gradients {produced}")
            produced += size
            latest = max(latest, share)
        shares.append(latest)
    return shares


def exposed_after_backward(backward_s, ready_s, comm_times):
    """Seconds past backward's end until the last all-reduce ends, each run in turn once ready."""
    finish = 0.0
    for ready, seconds in zip(ready_s, comm_times):
        finish = max(finish, ready) + seconds
    return max(0.0, finish - backward_s)


def project_layout(compute_s, backward_s, layout, gradients, world_size, alpha, beta,
                   overlap=True, algorithm="ring"):
    """A layout's projected {step_s, comm_s, exposed_s, efficiency}: overlapping backward or not."""
    times = [allreduce_time(nbytes, world_size, alpha, beta, algorithm) for nbytes in layout]
    exposed = sum(times)
    if overlap:
        ready = [share * backward_s for share in bucket_ready_shares(layout, gradients)]
        exposed = exposed_after_backward(backward_s, ready, times)
    return {"step_s": compute_s + exposed, "comm_s": sum(times), "exposed_s": exposed,
            "efficiency": compute_s / (compute_s + exposed)}  # weak scaling


def project_step(compute_s, backward_s, param_bytes, ready_shares, world_size, alpha, beta,
                 bucket_mb=None, first_bucket_mb=FIRST_BUCKET_MB, algorithm="ring"):
    """project_layout of BucketedSync's buckets at `bucket_mb`, or (None) one flat all-reduce."""
    flat = bucket_mb is None
    layout = [sum(param_bytes)] if flat else bucket_sizes(param_bytes, bucket_mb, first_bucket_mb)
    return project_layout(compute_s, backward_s, layout, backward_order(param_bytes, ready_shares),
                          world_size, alpha, beta, not flat, algorithm)


def best_bucket(compute_s, backward_s, param_bytes, ready_shares, world_size, alpha, beta,
                candidates=BUCKET_CANDIDATES_MB, first_bucket_mb=FIRST_BUCKET_MB, algorithm="ring"):
    """(bucket_mb, projection) of the shortest step: one flat all-reduce (None) or a cap."""
    caps = [None, *sorted(candidates)]  # min keeps the first of ties: flat, then the smaller cap
    projections = [project_step(compute_s, backward_s, param_bytes, ready_shares, world_size, alpha,
                                beta, bucket_mb, first_bucket_mb, algorithm) for bucket_mb in caps]
    return min(zip(caps, projections), key=lambda candidate: candidate[1]["step_s"])


def crossover_world_size(compute_s, total_bytes, alpha, beta, largest=2**20, algorithm="ring"):
    """The smallest world size whose one flat all-reduce takes at least the compute of a step.

    The world size n is the smallest of 2, 3, ..., `largest` at which
    allreduce_time(total_bytes, n, alpha, beta, algorithm) >= compute_s (seconds; alpha in
    seconds per message step, beta in seconds per byte): from there on communication dominates
    the step if nothing overlaps. n = 1 is never the answer (nothing is communicated). Return it
    as an int, or None if no world size up to `largest` (included) reaches compute_s.

    The time never decreases as n grows, for either algorithm, so bisection works; so does
    evaluating every n at once (the coefficient functions take numpy arrays). A Python loop over
    the default million world sizes takes seconds, and the build calls this a dozen times.
    """
    # BEGIN SOLUTION Task 14: where communication dominates
    world_sizes = np.arange(2, largest + 1, dtype=float)
    message_steps, sent_fraction = ALGORITHMS[algorithm](world_sizes)
    comm = message_steps * alpha + sent_fraction * total_bytes * beta
    (over,) = np.nonzero(comm >= compute_s)
    return int(world_sizes[over[0]]) if len(over) else None
    # END SOLUTION


def link_beta(gbit_per_s):
    """Seconds per byte of a link of `gbit_per_s` Gbit/s."""
    return 8 / (gbit_per_s * 1e9)
