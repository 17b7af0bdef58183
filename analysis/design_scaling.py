"""What the α-β model projects for a cluster (§5): step time, efficiency and best bucket per world
size and link, ring against halving-doubling, where communication starts to dominate, what each
technique buys, and published systems compared by compute per gradient byte.
"""
import functools
from typing import NamedTuple

from analysis import cost_model, published
from analysis.design_numbers import ratio, table

# projection scenarios: this machine's fit, then the cluster links assumed
LINKS = {"fitted": None, **{f"{gbit}g": gbit for gbit in cost_model.CLUSTER_LINKS_GBIT}}
LINK_NAMES = ["this machine's fit"]
LINK_NAMES += [f"{gbit:g} Gbit/s" for gbit in cost_model.CLUSTER_LINKS_GBIT]
ALGORITHM_SLUGS = {"ring": "ring", "halving-doubling": "hd"}  # algorithm -> its part of names
PROJECTED_FIELDS = {"step_s": "ms", "efficiency": "percent", "bucket_mb": "MiB"}
TECHNIQUE_FIELDS = {"step_s": "ms", "exposed_s": "ms", "efficiency": "percent"}
PUBLISHED_COLUMNS = ["model", "compute per step", "gradient bytes", "compute per gradient byte",
                     "published efficiency", "modelled efficiency (flat, no overlap)"]


class Technique(NamedTuple):
    """One row of §5.4: what the step does, and the projection's settings for it."""
    text: str
    buckets: bool  # buckets overlapping backward at the best size, or one flat all-reduce
    wire: float  # the fraction of the gradient's bytes on the wire
    factor: int  # the per-rank batch, times this
    algorithm: str


TECHNIQUES = {
    "flat": Technique("one all-reduce after backward (flat)", False, 1.0, 1, "ring"),
    "bucketed": Technique("buckets overlapping backward (best size)", True, 1.0, 1, "ring"),
    "compressed": Technique("… and gradients sent as fp16/bf16", True, 0.5, 1, "ring"),
    "larger_batch": Technique("… and a larger per-rank batch", True, 0.5,
                              cost_model.LARGER_BATCH_FACTOR, "ring"),
    "halving_doubling": Technique("… and halving-doubling instead of the ring", True, 0.5,
                                  cost_model.LARGER_BATCH_FACTOR, "halving-doubling")}


def published_value(name):
    """A published figure of published.FIGURES, without its source."""
    value, _source = published.FIGURES[name]
    return value


def published_unit(name, value):
    """How a published figure is shown: a fraction, a factor, a link speed or a count."""
    if isinstance(value, float):
        return "round-percent"
    if "factor" in name:
        return "round-ratio"
    if "gbit" in name:
        return "Gbit/s"
    return "count"


def latency_term(algorithm, world, alpha):
    """Seconds of an all-reduce's message steps alone: steps x alpha."""
    message_steps, _ = cost_model.ALGORITHMS[algorithm](world)
    return float(message_steps) * alpha


def share(whole, part):
    """part / whole."""
    return part / whole


def per_gradient_byte(total_bytes, seconds):
    """Seconds per byte of gradient."""
    return seconds / total_bytes


def crossover(total_bytes, algorithm, compute, alpha, beta):
    """cost_model.crossover_world_size, or 0 where no world size up to 2^20 reaches it."""
    return cost_model.crossover_world_size(compute, total_bytes, alpha, beta,
                                           algorithm=algorithm) or 0


def flat_step_efficiency(total_bytes, world, compute, alpha, beta):
    """compute / (compute + one flat ring all-reduce of the gradient): no overlap."""
    return compute / (compute + cost_model.allreduce_time(total_bytes, world, alpha, beta))


def published_efficiency(world, step, parameters, alpha, beta):
    """flat_step_efficiency of a published model's fp32 gradient."""
    return flat_step_efficiency(4 * parameters, world, step, alpha, beta)


def step_seconds(parameters, images_per_s, batch):
    """One GPU's step: batch / images per second."""
    return batch / images_per_s


def gradient_bytes(parameters, images_per_s, batch):
    """4 bytes per fp32 parameter."""
    return 4 * parameters


class Projector:
    """Projected steps of one model's gradient layout (cost_model.project_step, best_bucket)."""

    def __init__(self, sizes, first_bucket_mb):
        self.sizes = sizes
        self.first_bucket_mb = first_bucket_mb

    def step(self, compute, backward, alpha, beta, world, buckets=True, wire=1.0, factor=1,
             algorithm="ring"):
        """{step_s, comm_s, exposed_s, efficiency}, with bucket_mb (the best size) if buckets."""
        if not buckets:
            return cost_model.project_step(compute * factor, backward * factor, self.sizes, world,
                                           alpha, beta, None, wire, self.first_bucket_mb,
                                           algorithm)
        bucket_mb, projection = cost_model.best_bucket(
            compute * factor, backward * factor, self.sizes, world, alpha, beta,
            wire_fraction=wire, first_bucket_mb=self.first_bucket_mb, algorithm=algorithm)
        return dict(projection, bucket_mb=bucket_mb)


def register_assumptions(numbers):
    """The projections' stated assumptions (cost_model.py) and the published figures
    (published.py)."""
    numbers.stated("assume.alpha_s", cost_model.CLUSTER_ALPHA_S, "us", "assumption",
                   "cost_model.CLUSTER_ALPHA_S")
    counts = (("reference_world", cost_model.REFERENCE_WORLD_SIZE),
              ("batch_factor", cost_model.LARGER_BATCH_FACTOR),
              ("smallest_world", min(cost_model.PROJECTED_WORLD_SIZES)),
              ("largest_world", max(cost_model.PROJECTED_WORLD_SIZES)))
    for name, value in counts:
        numbers.stated(f"assume.{name}", value, "count", "assumption", "cost_model.py")
    numbers.stated("assume.buckets", list(cost_model.BUCKET_CANDIDATES_MB), "MiB-list",
                   "assumption", "cost_model.BUCKET_CANDIDATES_MB")
    numbers.stated("assume.reference_link", cost_model.REFERENCE_LINK_GBIT, "Gbit/s",
                   "assumption", "cost_model.REFERENCE_LINK_GBIT")
    for link, gbit in LINKS.items():
        if gbit:
            numbers.stated(f"assume.link.{link}", gbit, "Gbit/s", "assumption",
                           "cost_model.CLUSTER_LINKS_GBIT")
            numbers.stated(f"assume.beta.{link}", cost_model.link_beta(gbit), "ns/byte",
                           "assumption", "8 bits per byte / link speed")
    for name, (value, source) in published.FIGURES.items():
        numbers.stated(f"published.{name}", value, published_unit(name, value), "publication",
                       source)
    for algorithm, slug in ALGORITHM_SLUGS.items():
        numbers.derived(f"technique.latency_per_allreduce.{slug}",
                        functools.partial(latency_term, algorithm,
                                          cost_model.REFERENCE_WORLD_SIZE),
                        ["assume.alpha_s"], "ms",
                        f"{algorithm}: message steps x alpha at the reference world size")


def projection_rows(numbers, model, projector, base, cost):
    """§5.2's rows: per world size, per link, each algorithm's step, efficiency and best bucket."""
    rows = []
    for world in cost_model.PROJECTED_WORLD_SIZES:
        cells = [world]
        for link in LINKS:
            lines = []
            for algorithm, slug in ALGORITHM_SLUGS.items():
                name = f"project.{model}.{link}.n{world}"
                if slug != "ring":
                    name += f".{slug}"
                numbers.derived_fields(name, functools.partial(projector.step, world=world,
                                                               algorithm=algorithm),
                                       base + cost[link], PROJECTED_FIELDS,
                                       f"cost_model.best_bucket over assume.buckets, "
                                       f"{world} ranks, {algorithm}")
                shown = " · ".join(numbers.text(f"{name}.{field}") for field in PROJECTED_FIELDS)
                lines.append(f"{slug}: {shown}")
            cells.append("<br>".join(lines))
        rows.append(cells)
    return rows


def projection_section(numbers, layouts, first_bucket_mb):
    """Projected step, efficiency and best bucket per world size, link and algorithm;
    crossovers; techniques."""
    register_assumptions(numbers)
    cost = {}  # link -> the names of its alpha and beta
    for link in LINKS:
        if link == "fitted":
            cost[link] = ["fit.projection.alpha_s", "fit.projection.beta_s_per_byte"]
        else:
            cost[link] = ["assume.alpha_s", f"assume.beta.{link}"]
    tables = {}
    crossover_rows = []
    for model, sizes in layouts.items():
        single = f"sweep.{model}.single.w1"
        compute = f"{single}.compute.median"
        base = [compute, f"{single}.backward.median"]
        numbers.derived(f"project.{model}.per_sample_s", ratio, [compute, "config.batch_size"],
                        "s", "compute / per-rank batch")
        numbers.derived(f"project.{model}.backward_share", share, base, "percent",
                        "backward / compute")
        projector = Projector(sizes, first_bucket_mb)
        tables[f"table.project.{model}"] = table(["ranks"] + LINK_NAMES,
                                                 projection_rows(numbers, model, projector, base,
                                                                 cost))
        for algorithm, slug in ALGORITHM_SLUGS.items():
            for link in LINKS:
                numbers.derived(f"crossover.{model}.{link}.{slug}",
                                functools.partial(crossover, sum(sizes), algorithm),
                                [compute] + cost[link], "ranks",
                                f"cost_model.crossover_world_size ({algorithm}, flat)")
            crossover_rows.append([model.upper(), algorithm] + [
                numbers.text(f"crossover.{model}.{link}.{slug}") for link in LINKS])
        latency_shares(numbers, model, sizes)
        tables[f"table.techniques.{model}"] = techniques_table(numbers, model, base, cost,
                                                               projector)
    tables["table.crossover"] = table(["model", "all-reduce"] + LINK_NAMES, crossover_rows)
    tables["table.published"] = published_table(numbers, layouts)
    return tables


def latency_shares(numbers, model, sizes):
    """The flat all-reduce of the whole gradient at the largest projection, fastest link: the
    latency term's share."""
    world = max(cost_model.PROJECTED_WORLD_SIZES)
    link = f"{max(cost_model.CLUSTER_LINKS_GBIT)}g"
    inputs = ["assume.alpha_s", f"assume.beta.{link}"]
    for algorithm, slug in ALGORITHM_SLUGS.items():
        name = f"latency.{model}.{slug}"
        numbers.derived(f"{name}.total_s",
                        functools.partial(cost_model.allreduce_time, sum(sizes), world,
                                          algorithm=algorithm),
                        inputs, "ms",
                        f"one {algorithm} all-reduce of the gradient, {world} ranks, {link}")
        numbers.derived(f"{name}.latency_s", functools.partial(latency_term, algorithm, world),
                        ["assume.alpha_s"], "ms",
                        f"{algorithm}: message steps x alpha at {world} ranks")
        numbers.derived(f"{name}.share",
                        functools.partial(cost_model.latency_share, sum(sizes), world,
                                          algorithm=algorithm),
                        inputs, "percent", "latency term / the all-reduce's time")


def techniques_table(numbers, model, base, cost, projector):
    """§5.4: each technique's projected step at the reference world size and link."""
    rows = []
    link = f"{cost_model.REFERENCE_LINK_GBIT}g"
    for label, technique in TECHNIQUES.items():
        name = f"technique.{model}.{label}"
        units = dict(TECHNIQUE_FIELDS)
        if technique.buckets:
            units["bucket_mb"] = "MiB"
        project = functools.partial(projector.step, world=cost_model.REFERENCE_WORLD_SIZE,
                                    buckets=technique.buckets, wire=technique.wire,
                                    factor=technique.factor, algorithm=technique.algorithm)
        numbers.derived_fields(name, project, base + cost[link], units,
                               f"cost_model projection of '{label}' "
                               "at the reference world size and link")
        best_bucket = numbers.text(f"{name}.bucket_mb") if technique.buckets else "—"
        rows.append([technique.text, best_bucket]
                    + [numbers.text(f"{name}.{field}") for field in TECHNIQUE_FIELDS])
    return table(["what the step does", "best bucket", "step", "exposed comm", "efficiency"],
                 rows)


def published_table(numbers, layouts):
    """Compute per gradient byte of Horovod's models and ours, with the published and the
    modelled efficiency at Horovod's GPU count and link (α assumed; flat all-reduce, no overlap:
    a lower bound)."""
    world = published_value("horovod_gpus_high")
    link = published_value("horovod_link_gbit")
    numbers.stated("published.horovod_beta", cost_model.link_beta(link), "ns/byte", "assumption",
                   "8 bits per byte / Horovod's link")
    no_overlap = "compute / (compute + one flat ring all-reduce), no overlap"
    rows = []
    for label, (prefix, efficiency) in published.MODELS.items():
        parameters = f"published.{prefix}_parameters"
        inputs = [parameters, f"published.p100_{prefix}_images_per_s", "published.horovod_batch"]
        name = f"published.{prefix}"
        numbers.derived(f"{name}.step_s", step_seconds, inputs, "s", "batch / images per second")
        numbers.derived(f"{name}.bytes", gradient_bytes, inputs, "bytes",
                        "4 bytes per fp32 parameter")
        numbers.derived(f"{name}.per_byte", published.compute_per_byte, inputs,
                        "ns/byte", "step / gradient bytes")
        numbers.derived(f"{name}.modelled", functools.partial(published_efficiency, world),
                        [f"{name}.step_s", parameters, "assume.alpha_s",
                         "published.horovod_beta"], "percent", no_overlap)
        rows.append([label, numbers.text(f"{name}.step_s"), numbers.text(f"{name}.bytes"),
                     numbers.text(f"{name}.per_byte"), numbers.text(f"published.{efficiency}"),
                     numbers.text(f"{name}.modelled")])
    for model, sizes in layouts.items():
        name = f"published.ours.{model}"
        compute = f"sweep.{model}.single.w1.compute.median"
        numbers.derived(f"{name}.per_byte", functools.partial(per_gradient_byte, sum(sizes)),
                        [compute], "ns/byte", "compute / gradient bytes")
        numbers.derived(f"{name}.modelled",
                        functools.partial(flat_step_efficiency, sum(sizes), world),
                        [compute, "assume.alpha_s", "published.horovod_beta"], "percent",
                        no_overlap)
        rows.append([f"our {model.upper()} (this machine, one process)", numbers.text(compute),
                     numbers.text(f"model.{model}.bytes"), numbers.text(f"{name}.per_byte"), "—",
                     numbers.text(f"{name}.modelled")])
    return table(PUBLISHED_COLUMNS, rows)
