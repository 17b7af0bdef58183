"""What the α-β model projects for a cluster (§5.3-§5.5): efficiency in a few scenarios, flat
against the best bucket size, and where communication starts to dominate. Every projection starts
from this machine's single-process compute and backward, each gradient's readiness within backward,
and a link, fitted or assumed.
"""
import functools

from analysis import cost_model, results_folder, scaling_inputs
from analysis.design_numbers import table
from analysis.traces import gradient_readiness

# projection scenarios: two fitted links, then the cluster links assumed
LINKS = {"fitted": "this machine's fit", "1g": "1 Gbit/s, emulated",
         **{f"{gbit}g": f"{gbit:g} Gbit/s" for gbit in cost_model.CLUSTER_LINKS_GBIT}}
FITTED_LINKS = {"fitted": "fit.projection", "1g": "emulated.fit.gloo.w2"}
ALGORITHM_SLUGS = {"ring": "ring", "halving-doubling": "hd"}  # algorithm -> its part of names
PROJECTED_FIELDS = {"step_s": "ms", "exposed_s": "ms", "efficiency": "percent", "bucket": "name"}
# (model, ranks, link) of §5.4's table
SCENARIOS = (("mlp", 64, "25g"), ("mlp", 256, "100g"), ("mlp", 256, "fitted"),
             ("cnn", 64, "25g"), ("cnn", 256, "100g"), ("cnn", 256, "fitted"))



def crossover(total_bytes, algorithm, compute, alpha, beta):
    """cost_model.crossover_world_size, or 0 where no world size up to 2^20 reaches it."""
    return cost_model.crossover_world_size(compute, total_bytes, alpha, beta,
                                           algorithm=algorithm) or 0


def project(sizes, compute, backward, alpha, beta, *shares, world, buckets=True,
            algorithm="ring"):
    """{step_s, exposed_s, efficiency, bucket}: the best of flat and every bucket size if
    `buckets`, else one flat all-reduce."""
    arguments = (compute, backward, sizes, list(shares), world, alpha, beta)
    if not buckets:
        return dict(cost_model.project_step(*arguments, None, algorithm=algorithm),
                    bucket="flat")
    bucket_mb, projection = cost_model.best_bucket(*arguments, algorithm=algorithm)
    return dict(projection, bucket="flat" if bucket_mb is None else f"{bucket_mb:g} MiB")


def register_assumptions(numbers):
    """The projections' stated assumptions (cost_model.py)."""
    for name, value, unit, source in (
            ("alpha_s", cost_model.CLUSTER_ALPHA_S, "us", "cost_model.ALPHA_S"),
            ("reference_world", cost_model.REFERENCE_WORLD_SIZE, "count", "cost_model.py"),
            ("largest_world", cost_model.LARGE_WORLD_SIZE, "count", "cost_model.py"),
            ("draws", cost_model.BOOTSTRAP_DRAWS, "count", "cost_model.py"),
            ("interval_level", cost_model.INTERVAL_LEVEL, "round-percent",
             "cost_model.INTERVAL_LEVEL"),
            ("buckets", list(cost_model.BUCKET_CANDIDATES_MB), "MiB-list",
             "cost_model.BUCKET_CANDIDATES_MB"),
            ("reference_link", cost_model.REFERENCE_LINK_GBIT, "Gbit/s",
             "cost_model.REFERENCE_LINK_GBIT")):
        numbers.stated(f"assume.{name}", value, unit, "assumption", source)
    for gbit in cost_model.CLUSTER_LINKS_GBIT:
        numbers.stated(f"assume.link.{gbit}g", gbit, "Gbit/s", "assumption",
                       "cost_model.CLUSTER_LINKS_GBIT")
        numbers.stated(f"assume.beta.{gbit}g", cost_model.link_beta(gbit), "ns/byte",
                       "assumption", "8 bits per byte / link speed")
    steps, _ = cost_model.ring_coefficients(cost_model.LARGE_WORLD_SIZE)
    numbers.stated("latency.ring_steps", int(steps), "count", "model",
                   "cost_model.ring_coefficients: 2(n-1) message steps at LARGE_WORLD_SIZE")


def register_readiness(numbers, results_dir, model):
    """'readiness.<model>.<parameter>': each gradient's readiness (a share of backward)."""
    path = scaling_inputs.backward_trace(results_dir, model)
    names = []
    for name, _ in scaling_inputs.parameters(model):
        names.append(f"readiness.{model}.{name}")
        if names[-1] in numbers.entries or names[-1] in numbers.absent:
            continue  # registered by the section before
        numbers.derived(names[-1], lambda events, name=name: gradient_readiness(events).get(name),
                        [f"{path}#traceEvents"] if path else [], "percent",
                        "traces.gradient_readiness: median share of backward elapsed when the "
                        "gradient was accumulated")
    return names


def drift_text(numbers, results_dir, model):
    """The traced backward against the sweep's single process's: one work in two sessions."""
    path = scaling_inputs.backward_trace(results_dir, model)
    name = f"drift.{model}.traced_backward"
    numbers.derived_fields(name, lambda events: results_folder.spread([
        event["dur"] / 1e6 for event in events if event.get("ph") == "X"
        and event.get("pid") == 0 and event["name"] == "backward"]) or {},
        [f"{path}#traceEvents"] if path else [],
        {"median": "ms", "min": "ms", "max": "ms", "n": "count"},
        "results_folder.spread of the traced steps' backward spans")
    return (f"{numbers.spread_text(name)} over the traced steps against "
            f"{numbers.spread_text(f'sweep.{model}.single.w1.backward')} over the sweep's repeats")


def projection_section(numbers, results_dir, layouts):
    """§5.3-§5.5's numbers and tables."""
    register_assumptions(numbers)
    cost = {link: [f"{fit}.alpha_s", f"{fit}.beta_s_per_byte"]
            for link, fit in FITTED_LINKS.items()}
    for gbit in cost_model.CLUSTER_LINKS_GBIT:
        cost[f"{gbit}g"] = ["assume.alpha_s", f"assume.beta.{gbit}g"]
    tables, scenario_rows, crossover_rows = {}, [], []
    for model, sizes in layouts.items():
        single = f"sweep.{model}.single.w1"
        compute = f"{single}.compute.median"
        shares = register_readiness(numbers, results_dir, model)
        tables[f"text.drift.{model}"] = drift_text(numbers, results_dir, model)
        projector = functools.partial(project, sizes)
        base = [compute, f"{single}.backward.median"]
        for world_model, world, link in SCENARIOS:
            if world_model == model:
                name = f"project.{model}.{link}.n{world}"
                register_projections(numbers, name, projector, world, base + cost[link] + shares)
                scenario_rows.append([model.upper(), f"{world}, {LINKS[link]}",
                                      numbers.text(f"{name}.flat.efficiency"),
                                      with_bucket(numbers, name),
                                      with_bucket(numbers, f"{name}.hd")])
        for algorithm, slug in ALGORITHM_SLUGS.items():
            for link in LINKS:
                numbers.derived(f"crossover.{model}.{link}.{slug}",
                                functools.partial(crossover, sum(sizes), algorithm),
                                [compute] + cost[link], "ranks",
                                f"cost_model.crossover_world_size ({algorithm}, flat)")
            crossover_rows.append([f"{model.upper()}, {algorithm}"] + [
                numbers.text(f"crossover.{model}.{link}.{slug}") for link in LINKS])
        latency_shares(numbers, model, sizes)
    tables["table.scenarios"] = table(["model", "ranks, link", "one flat all-reduce",
                                       "best bucket (ring)", "best bucket (halving-doubling)"],
                                      scenario_rows)
    tables["table.crossover"] = table(["model, all-reduce"] + list(LINKS.values()),
                                      crossover_rows)
    return tables


def register_projections(numbers, scenario, projector, world, inputs):
    """'<scenario>[.hd].<field>' (flat: '.flat.'): the best bucket size and one flat all-reduce,
    with each algorithm."""
    for algorithm, slug in ALGORITHM_SLUGS.items():
        name = scenario + ("" if slug == "ring" else f".{slug}")
        numbers.derived_fields(name, functools.partial(projector, world=world,
                                                       algorithm=algorithm),
                               inputs, PROJECTED_FIELDS,
                               f"cost_model.best_bucket (flat and every assume.buckets), "
                               f"{world} ranks, {algorithm}")
        numbers.derived_fields(f"{name}.flat", functools.partial(projector, world=world,
                                                                 buckets=False,
                                                                 algorithm=algorithm),
                               inputs, PROJECTED_FIELDS,
                               f"cost_model.project_step, one flat all-reduce, {world} ranks, "
                               f"{algorithm}")


def with_bucket(numbers, name):
    """'35.6% (flat)': a projection's efficiency and the bucket size that gives it."""
    return f"{numbers.text(name + '.efficiency')} ({numbers.text(name + '.bucket')})"


def latency_shares(numbers, model, sizes):
    """The latency term's share of a flat all-reduce at LARGE_WORLD_SIZE on the fastest link."""
    world = cost_model.LARGE_WORLD_SIZE
    link = f"{max(cost_model.CLUSTER_LINKS_GBIT)}g"
    inputs = ["assume.alpha_s", f"assume.beta.{link}"]
    for algorithm, slug in ALGORITHM_SLUGS.items():
        numbers.derived(f"latency.{model}.{slug}.share",
                        functools.partial(cost_model.latency_share, sum(sizes), world,
                                          algorithm=algorithm),
                        inputs, "percent", "latency term / the all-reduce's time")
