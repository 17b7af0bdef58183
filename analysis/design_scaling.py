"""The α-β model in the design document: its fits to the all-reduce benchmark (§4.4, residuals in the
appendix) and what it projects for a cluster (§5), ring against halving-doubling, and against
published systems by compute per gradient byte.
"""
from analysis import cost_model
from analysis.design_numbers import BuildError, load, show_bytes, table

LINKS = {"fitted": None, **{f"{gbit}g": gbit for gbit in cost_model.CLUSTER_LINKS_GBIT}}  # projection scenarios
LINK_NAMES = ["this machine's fit"] + [f"{gbit:g} Gbit/s" for gbit in cost_model.CLUSTER_LINKS_GBIT]
SHORT = {"ring": "ring", "halving-doubling": "hd"}
FIT_FIELDS = (("alpha_s", "alpha", "us"), ("beta_s_per_byte", "beta", "ns/byte"), ("bandwidth", "bandwidth_gbps", "GB/s"),
              ("r2", "r2", "number"), ("median_relative_error", "median_relative_error", "percent"),
              ("max_relative_error", "max_relative_error", "percent"), ("points", "points", "count"))


class Fits:
    """The registered fits: 'fit.<implementation>' (all world sizes) and 'fit.<implementation>.w<n>'."""

    def __init__(self, worlds):
        self.worlds = worlds

    def for_world(self, implementation, world):
        """The name of the fit to predict a run at `world` ranks: its own world's fit if measured."""
        return f"fit.{implementation}.w{world}" if world in self.worlds else f"fit.{implementation}"


def register_fit(n, name, fit, bench, implementation, world=None):
    where = f"the verified {implementation} rows" + (f" at {world} ranks" if world else " of every world size")
    for field, attribute, unit in FIT_FIELDS:
        value = getattr(fit, attribute)
        n.add(f"{name}.{field}", value if field != "bandwidth" or fit.beta > 0 else None, unit, kind="fit",
              file=bench, implementation=implementation, **({"world_size": world} if world else {}),
              formula=f"cost_model.fit_alpha_beta(world_size, bytes, median_s) of {where}")


def allreduce_section(n, bench):
    """Fits of gloo and of the ring, over all world sizes and per world size; the residuals per point."""
    rows = [(i, m) for i, m in enumerate(load(bench).get("measurements", [])) if m.get("verified", True)]
    n.measured("bench.iterations", bench, "config.iterations", "count")
    n.measured("bench.load_average", bench, "environment.load_average_1min_at_start", "number")
    worlds = sorted({m["world_size"] for _, m in rows})
    for label, world in zip(("smallest", "largest"), (worlds[:1] + worlds[-1:]) if worlds else ()):
        n.stated(f"bench.{label}_world", world, "count", "code", f"the {label} world size of {bench}")
    fit_rows = []
    for implementation in ("gloo", "ring"):
        points = [(m["world_size"], m["bytes"], m["median_s"]) for _, m in rows if m["implementation"] == implementation]
        if len(points) < 2:
            raise BuildError(f"{bench} has fewer than two verified {implementation} measurements: no fit possible")
        register_fit(n, f"fit.{implementation}", cost_model.fit_alpha_beta(*zip(*points)), bench, implementation)
        for world, fit in cost_model.fit_per_world(*zip(*points)).items():
            register_fit(n, f"fit.{implementation}.w{world}", fit, bench, implementation, world)
        for name, ranks in [(f"fit.{implementation}.w{w}", w) for w in worlds] + [(f"fit.{implementation}", "all")]:
            fit_rows.append([implementation, ranks] + [n.text(f"{name}.{field}") for field, _, _ in FIT_FIELDS
                                                      if field != "r2"])
    fits = Fits([w for w in worlds if f"fit.gloo.w{w}.alpha_s" in n.entries])
    # Projections treat this machine as if every rank had a core: the smallest world size is closest to that.
    smallest = f"fit.gloo.w{fits.worlds[0]}" if fits.worlds else "fit.gloo"
    for field in ("alpha_s", "beta_s_per_byte"):
        n.derived(f"fit.projection.{field}", lambda v: v, [f"{smallest}.{field}"], n.entries[f"{smallest}.{field}"]["unit"],
                  "the smallest world size's fit: the fewest ranks per core")
    if fits.worlds:
        n.derived("fit.gloo.alpha_growth", lambda a, b: b / a, [f"fit.gloo.w{worlds[0]}.alpha_s",
                                                                 f"fit.gloo.w{worlds[-1]}.alpha_s"], "ratio",
                  "alpha at the largest world size / at the smallest")
        for label, world in (("smallest", worlds[0]), ("largest", worlds[-1])):
            n.derived(f"fit.gloo.{label}.alpha_s", lambda v: v, [f"fit.gloo.w{world}.alpha_s"], "us", "alias")
    residuals = [residual_table(n, bench, rows, world) for world in worlds]
    return fits, {"table.fits": table(["implementation", "ranks", "α", "β", "1/β", "median relative error",
                                       "largest relative error", "points"], fit_rows),
                  "table.allreduce": "\n\n".join(residuals)}


def residual_table(n, bench, rows, world):
    """Measured medians of one world size against the per-world and the all-sizes fit, with relative errors."""
    lines = []
    for size in sorted({m["bytes"] for _, m in rows if m["world_size"] == world}):
        cells = [show_bytes(size)]
        for implementation in ("gloo", "ring"):
            index = next((i for i, m in rows if (m["world_size"], m["bytes"], m["implementation"])
                          == (world, size, implementation)), None)
            name = f"allreduce.w{world}.{implementation}.{size}"
            n.measured(f"{name}.median_s", bench if index is not None else None, f"measurements[{index}].median_s", "s")
            cells.append(n.text(f"{name}.median_s"))
            for fit, label in ((f"fit.{implementation}.w{world}", "own"), (f"fit.{implementation}", "all")):
                n.derived(f"{name}.{label}_s", lambda a, b, s=size: cost_model.allreduce_time(s, world, a, b),
                          [f"{fit}.alpha_s", f"{fit}.beta_s_per_byte"], "s", f"2(n-1)·alpha + 2(n-1)/n·N·beta with {fit}")
                n.derived(f"{name}.{label}_error", cost_model.relative_error, [f"{name}.{label}_s", f"{name}.median_s"],
                          "percent", "(model - measured) / measured")
                cells.append(f"{n.text(f'{name}.{label}_s')} ({n.text(f'{name}.{label}_error')})")
            if implementation == "gloo":
                n.measured(f"{name}.busbw_gbps", bench if index is not None else None,
                           f"measurements[{index}].busbw_gbps", "GB/s")
                cells.append(n.text(f"{name}.busbw_gbps"))
        lines.append(cells)
    return f"**{world} ranks**\n\n" + table(
        ["size", "gloo median", "model, this n (error)", "model, all n (error)", "gloo busbw", "ring median",
         "model, this n (error)", "model, all n (error)"], lines)


def register_assumptions(n):
    """The projections' stated assumptions and the published figures, all from cost_model.py."""
    n.stated("assume.alpha_s", cost_model.CLUSTER_ALPHA_S, "us", "assumption", "cost_model.CLUSTER_ALPHA_S")
    for name, value in (("reference_world", cost_model.REFERENCE_WORLD_SIZE), ("batch_factor", cost_model.LARGER_BATCH_FACTOR),
                        ("smallest_world", min(cost_model.PROJECTED_WORLD_SIZES)),
                        ("largest_world", max(cost_model.PROJECTED_WORLD_SIZES))):
        n.stated(f"assume.{name}", value, "count", "assumption", "cost_model.py")
    n.stated("assume.buckets", list(cost_model.BUCKET_CANDIDATES_MB), "MiB-list", "assumption", "cost_model.BUCKET_CANDIDATES_MB")
    n.stated("assume.reference_link", cost_model.REFERENCE_LINK_GBIT, "Gbit/s", "assumption", "cost_model.REFERENCE_LINK_GBIT")
    for link, gbit in LINKS.items():
        if gbit:
            n.stated(f"assume.link.{link}", gbit, "Gbit/s", "assumption", "cost_model.CLUSTER_LINKS_GBIT")
            n.stated(f"assume.beta.{link}", cost_model.link_beta(gbit), "ns/byte", "assumption", "8 bits per byte / link speed")
    for name, (value, source) in cost_model.PUBLISHED.items():
        unit = ("round-percent" if isinstance(value, float) else "round-ratio" if "factor" in name
                else "Gbit/s" if "gbit" in name else "count")
        n.stated(f"published.{name}", value, unit, "publication", source)
    for label, algorithm in SHORT.items():
        n.derived(f"technique.latency_per_allreduce.{algorithm}",
                  lambda a, alg=label: float(cost_model.ALGORITHMS[alg](cost_model.REFERENCE_WORLD_SIZE)[0]) * a,
                  ["assume.alpha_s"], "ms", f"{label}: message steps x alpha at the reference world size")


TECHNIQUES = {  # (what the step does, buckets?, wire fraction, batch factor, algorithm)
    "flat": ("one all-reduce after backward (flat)", False, 1.0, 1, "ring"),
    "bucketed": ("buckets overlapping backward (best size)", True, 1.0, 1, "ring"),
    "compressed": ("… and gradients sent as fp16/bf16", True, 0.5, 1, "ring"),
    "larger_batch": ("… and a larger per-rank batch", True, 0.5, cost_model.LARGER_BATCH_FACTOR, "ring"),
    "halving_doubling": ("… and halving-doubling instead of the ring", True, 0.5, cost_model.LARGER_BATCH_FACTOR,
                         "halving-doubling")}


def projection_section(n, layouts, first):
    """Projected step, efficiency and best bucket per world size, link and algorithm; crossovers; techniques."""
    register_assumptions(n)
    cost = {link: ["fit.projection.alpha_s", "fit.projection.beta_s_per_byte"] if link == "fitted"
            else ["assume.alpha_s", f"assume.beta.{link}"] for link in LINKS}
    tables, crossover = {}, []
    for model, sizes in layouts.items():
        single = f"sweep.{model}.single.w1"
        base = [f"{single}.compute.median", f"{single}.backward.median"]
        n.derived(f"project.{model}.per_sample_s", lambda c, b: c / b, [base[0], "config.batch_size"], "s",
                  "compute / per-rank batch")
        n.derived(f"project.{model}.backward_share", lambda c, b: b / c, base, "percent", "backward / compute")

        def projected(compute, backward, alpha, beta, world, buckets=True, wire=1.0, factor=1, algorithm="ring"):
            if not buckets:
                return cost_model.project_step(compute * factor, backward * factor, sizes, world, alpha, beta, None, wire,
                                       first, algorithm)
            mb, projection = cost_model.best_bucket(compute * factor, backward * factor, sizes, world, alpha, beta,
                                            wire_fraction=wire, first_bucket_mb=first, algorithm=algorithm)
            return dict(projection, bucket_mb=mb)
        rows = []
        for world in cost_model.PROJECTED_WORLD_SIZES:
            cells = [world]
            for link in LINKS:
                lines = []
                for algorithm, short in SHORT.items():
                    name = f"project.{model}.{link}.n{world}" + ("" if short == "ring" else f".{short}")
                    n.derived_fields(name, lambda *v, w=world, alg=algorithm: projected(*v, w, algorithm=alg),
                                     base + cost[link], {"step_s": "ms", "efficiency": "percent", "bucket_mb": "MiB"},
                                     f"cost_model.best_bucket over assume.buckets, {world} ranks, {algorithm}")
                    lines.append(f"{short}: " + " · ".join(n.text(f"{name}.{field}")
                                                           for field in ("step_s", "efficiency", "bucket_mb")))
                cells.append("<br>".join(lines))
            rows.append(cells)
        tables[f"table.project.{model}"] = table(["ranks"] + LINK_NAMES, rows)
        for algorithm, short in SHORT.items():
            for link in LINKS:
                n.derived(f"crossover.{model}.{link}.{short}",
                          lambda c, a, b, alg=algorithm: cost_model.crossover_world_size(c, sum(sizes), a, b, algorithm=alg) or 0,
                          base[:1] + cost[link], "ranks", f"cost_model.crossover_world_size ({algorithm}, flat)")
            crossover.append([model.upper(), algorithm] + [n.text(f"crossover.{model}.{link}.{short}") for link in LINKS])
        latency_shares(n, model, sizes)
        tables[f"table.techniques.{model}"] = techniques_table(n, model, base, cost, projected)
    tables["table.crossover"] = table(["model", "all-reduce"] + LINK_NAMES, crossover)
    tables["table.published"] = published_table(n, layouts, first)
    return tables


def latency_shares(n, model, sizes):
    """The flat all-reduce of the whole gradient at the largest projection, fastest link: the latency term's share."""
    world, link = max(cost_model.PROJECTED_WORLD_SIZES), f"{max(cost_model.CLUSTER_LINKS_GBIT)}g"
    for algorithm, short in SHORT.items():
        name, inputs = f"latency.{model}.{short}", ["assume.alpha_s", f"assume.beta.{link}"]
        n.derived(f"{name}.total_s", lambda a, b, alg=algorithm: cost_model.allreduce_time(sum(sizes), world, a, b, alg),
                  inputs, "ms", f"one {algorithm} all-reduce of the gradient, {world} ranks, {link}")
        n.derived(f"{name}.latency_s", lambda a, alg=algorithm: float(cost_model.ALGORITHMS[alg](world)[0]) * a,
                  inputs[:1], "ms", f"{algorithm}: message steps x alpha at {world} ranks")
        n.derived(f"{name}.share", lambda a, b, alg=algorithm: cost_model.latency_share(sum(sizes), world, a, b, alg),
                  inputs, "percent", "latency term / the all-reduce's time")


def techniques_table(n, model, base, cost, projected):
    rows, link = [], f"{cost_model.REFERENCE_LINK_GBIT}g"
    units = {"step_s": "ms", "exposed_s": "ms", "efficiency": "percent"}
    for label, (text, buckets, wire, factor, algorithm) in TECHNIQUES.items():
        name = f"technique.{model}.{label}"
        n.derived_fields(name, lambda *v, b=buckets, w=wire, f=factor, a=algorithm:
                         projected(*v, cost_model.REFERENCE_WORLD_SIZE, b, w, f, a),
                         base + cost[link], dict(units, **({"bucket_mb": "MiB"} if buckets else {})),
                         f"cost_model projection of '{label}' at the reference world size and link")
        rows.append([text, n.text(f"{name}.bucket_mb") if buckets else "—"] + [n.text(f"{name}.{f}") for f in units])
    return table(["what the step does", "best bucket", "step", "exposed comm", "efficiency"], rows)


def published_table(n, layouts, first):
    """Compute per gradient byte of Horovod's models and ours, with the published and the modelled efficiency at
    Horovod's GPU count and link (α assumed; flat all-reduce, no overlap: a lower bound)."""
    world, link = cost_model.PUBLISHED["horovod_gpus_high"][0], cost_model.PUBLISHED["horovod_link_gbit"][0]
    n.stated("published.horovod_beta", cost_model.link_beta(link), "ns/byte", "assumption", "8 bits per byte / Horovod's link")
    rows = []
    for label, (prefix, efficiency) in cost_model.PUBLISHED_MODELS.items():
        inputs = [f"published.{prefix}_parameters", f"published.p100_{prefix}_images_per_s", "published.horovod_batch"]
        name = f"published.{prefix}"
        n.derived(f"{name}.step_s", lambda p, i, b: b / i, inputs, "s", "batch / images per second")
        n.derived(f"{name}.bytes", lambda p, i, b: 4 * p, inputs, "bytes", "4 bytes per fp32 parameter")
        n.derived(f"{name}.per_byte", cost_model.published_compute_per_byte, inputs, "ns/byte", "step / gradient bytes")
        n.derived(f"{name}.modelled", lambda s, p, a, beta: s / (s + cost_model.allreduce_time(4 * p, world, a, beta)),
                  [f"{name}.step_s", inputs[0], "assume.alpha_s", "published.horovod_beta"], "percent",
                  "compute / (compute + one flat ring all-reduce), no overlap")
        rows.append([label, n.text(f"{name}.step_s"), n.text(f"{name}.bytes"), n.text(f"{name}.per_byte"),
                     n.text(f"published.{efficiency}"), n.text(f"{name}.modelled")])
    for model, sizes in layouts.items():
        name, compute = f"published.ours.{model}", f"sweep.{model}.single.w1.compute.median"
        n.derived(f"{name}.per_byte", lambda c, s=sum(sizes): c / s, [compute], "ns/byte", "compute / gradient bytes")
        n.derived(f"{name}.modelled", lambda c, a, b, s=sum(sizes): c / (c + cost_model.allreduce_time(s, world, a, b)),
                  [compute, "assume.alpha_s", "published.horovod_beta"], "percent",
                  "compute / (compute + one flat ring all-reduce), no overlap")
        rows.append([f"our {model.upper()} (this machine, one process)", n.text(compute), n.text(f"model.{model}.bytes"),
                     n.text(f"{name}.per_byte"), "—", n.text(f"{name}.modelled")])
    return table(["model", "compute per step", "gradient bytes", "compute per gradient byte", "published efficiency",
                  "modelled efficiency (flat, no overlap)"], rows)
