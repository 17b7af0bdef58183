"""The ZeRO paper's memory and traffic per rank (Rajbhandari et al. 2020, §3 and §7) for float32
training with Adam, and what they project for a model that does not fit one rank.

With Ψ parameters a DDP rank holds 16Ψ bytes of model states: parameters 4Ψ, gradients 4Ψ,
optimizer state 8Ψ (Adam's two moments). Each ZeRO stage cuts one more of them into n shards:

    ddp     4Ψ + 4Ψ + 8Ψ              (nothing sharded)
    zero1   4Ψ + 4Ψ + 8Ψ/n            (the optimizer state)
    zero2   4Ψ + (4Ψ + 8Ψ)/n          (and the gradients)
    zero3   (4Ψ + 4Ψ + 8Ψ)/n          (and the parameters)

Bytes a rank sends per step, P = 4Ψ, every collective a ring (an all-reduce of B bytes sends
2B(n-1)/n): DDP, ZeRO-1 and ZeRO-2 2P(n-1)/n; ZeRO-3, which all-gathers every parameter twice,
3P(n-1)/n: 1.5x the bytes for 1/n of the memory. Pure functions of numbers (no torch).
"""
import math

CONFIGURATIONS = ("ddp", "zero1", "zero2", "zero3", "zero3-no-prefetch")  # the benchmark's first
LEVELS = ("ddp", "zero1", "zero2", "zero3")
# the formulas' level of each of the benchmark's configurations: prefetching changes when bytes
# move, not how many; a transport how fast they move; torch's shard as ours do
LEVEL_OF = {**{level: level for level in LEVELS}, "zero3-no-prefetch": "zero3",
            "torch-zero1": "zero1", "torch-fully-shard": "zero3",
            **{f"{level}-{over}": level for level in LEVELS for over in ("ring", "library", "shm")}}
CATEGORIES = ("parameters", "gradients", "optimizer_state")  # as runtime/memory.py's
BYTES_PER_PARAMETER = {"parameters": 4, "gradients": 4, "optimizer_state": 8}  # float32 Adam
SHARDED = {"ddp": (), "zero1": ("optimizer_state",),
           "zero2": ("gradients", "optimizer_state"), "zero3": CATEGORIES}
# the collectives of one step, in multiples of the parameter bytes: (kind, how many)
COLLECTIVES = {"ddp": (("all-reduce", 1),), "zero3": (("reduce-scatter", 1), ("all-gather", 2)),
               **dict.fromkeys(("zero1", "zero2"), (("reduce-scatter", 1), ("all-gather", 1)))}
RING_FACTOR = {"all-reduce": 2, "reduce-scatter": 1, "all-gather": 1}  # x B(n-1)/n

# --- The projection's assumptions (each quoted by the design document as one) ---
PROJECTED_PARAMETERS = 7.5e9  # the paper's example model (its Figure 1: 7.5B parameters)
PROJECTED_MEMORY_PER_RANK = 32e9  # bytes of model states a rank may hold: a 32 GB V100, the
# paper's GPU, with activations and buffers left out (they need room too: the n found is a floor)
PROJECTED_WORLD_SIZE = 64  # the paper's Figure 1 example's data-parallel degree


def collective_kind(name):
    """The kind of a recorded collective ('all-gather bucket 0'): all-reduce unless it says."""
    return next((kind for kind in ("reduce-scatter", "all-gather") if name.startswith(kind)),
                "all-reduce")


def bytes_sent(kind, nbytes, world):
    """Bytes one rank sends in a ring `kind` of `nbytes` over `world` ranks."""
    return RING_FACTOR[kind] * nbytes * (world - 1) / world


def model_states(level, parameters, world):
    """{category: bytes} a rank holds at `level` (LEVEL_OF's), and 'model_states', their sum."""
    held = {category: BYTES_PER_PARAMETER[category] * parameters
            / (world if category in SHARDED[level] else 1) for category in CATEGORIES}
    held["model_states"] = sum(held.values())
    return held


def traffic_factor(level):
    """k of traffic = k P(n-1)/n: 2 for DDP, ZeRO-1 and ZeRO-2, 3 for ZeRO-3."""
    return sum(count * RING_FACTOR[kind] for kind, count in COLLECTIVES[level])


def traffic(level, parameter_bytes, world):
    """Bytes one rank sends per step at `level`: 2P(n-1)/n, or 3P(n-1)/n for ZeRO-3."""
    return traffic_factor(level) * (parameter_bytes * (world - 1) / world)


def smallest_world(level, parameters, memory_per_rank, largest=2**20):
    """Fewest ranks (None past `largest`) at which `level`'s model states fit `memory_per_rank`."""
    sharded = sum(BYTES_PER_PARAMETER[category] * parameters for category in SHARDED[level])
    # the room beside the unsharded states, which no number of ranks shrinks
    room = memory_per_rank - model_states(level, parameters, math.inf)["model_states"]
    if room < 0 or (room == 0 and sharded):
        return None
    world = math.ceil(sharded / room) if sharded else 1  # sharded / n fits in the room left
    return world if world <= largest else None
