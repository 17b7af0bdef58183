"""The α-β model fitted to the all-reduce benchmark (§5.1), with bootstrap intervals of α and β,
and its prediction of each strategy's busy communication against the training runs (§5.2)."""
import functools

from analysis import cost_model, scaling_inputs
from analysis.design_numbers import NOT_MEASURED, BuildError, load, table, unchanged
from analysis.design_performance import COMMUNICATING, key, slug
from runtime.options import DEFAULT_BUCKET_MB

IMPLEMENTATIONS = ("gloo", "ring")
# (number's field, Fit attribute, unit) of each fit registered
FIT_FIELDS = (("alpha_s", "alpha", "us"), ("beta_s_per_byte", "beta", "ns/byte"),
              ("median_relative_error", "median_relative_error", "percent"),
              ("max_relative_error", "max_relative_error", "percent"))
FITS_COLUMNS = ["implementation", "ranks", "α (95% interval)", "β (95% interval)",
                "median error", "largest error"]


def register_fit(numbers, name, points, bench, implementation, world=None):
    """Every field of cost_model's fit to `points` (world sizes, sizes, times) under `name`, and
    the central 95 % of cost_model.bootstrap_fits' α and β (`name.alpha_s.low`, `.high`, ...)."""
    where = (f"the verified {implementation} rows at {world} ranks" if world
             else f"the verified {implementation} rows of every world size")
    scope = {"world_size": world} if world else {}
    fit = cost_model.fit_alpha_beta(*points)
    for field, attribute, unit in FIT_FIELDS:
        numbers.add(f"{name}.{field}", getattr(fit, attribute), unit, kind="fit", file=bench,
                    implementation=implementation, **scope,
                    formula=f"cost_model.fit_alpha_beta(world_size, bytes, median_s) of {where}")
    alphas, betas = zip(*cost_model.bootstrap_fits(*points))
    formula = (f"cost_model.interval of cost_model.bootstrap_fits({cost_model.BOOTSTRAP_DRAWS} "
               f"resamples) of {where}")
    for field, values, unit in (("alpha_s", alphas, "us"), ("beta_s_per_byte", betas, "ns/byte")):
        for end, value in zip(("low", "high"), cost_model.interval(values)):
            numbers.add(f"{name}.{field}.{end}", value, unit, kind="derived", formula=formula,
                        inputs=[f"{bench}#measurements"])


def with_interval(numbers, name):
    """'233 µs (202–455 µs)': a fitted number with its bootstrap interval, the unit once."""
    if f"{name}.low" not in numbers.entries:
        return numbers.text(name)
    low, high = numbers.text(name + ".low"), numbers.text(name + ".high")
    number, _, unit = low.partition(" ")
    if unit and high.endswith(" " + unit):
        low = number
    return f"{numbers.text(name)} ({low}–{high})"


def allreduce_section(numbers, bench):
    """Fits of gloo and of the ring, over all world sizes and per world size; returns the world
    sizes fitted and the tables."""
    rows = [(index, measurement)
            for index, measurement in enumerate(load(bench).get("measurements", []))
            if measurement.get("verified", True)]
    numbers.measured("bench.iterations", bench, "config.iterations", "count")
    numbers.measured("bench.load_average", bench, "environment.load_average_1min_at_start",
                     "number")
    worlds = sorted({measurement["world_size"] for _, measurement in rows})
    ends = (("smallest", worlds[0]), ("largest", worlds[-1])) if worlds else ()
    for label, world in ends:
        numbers.stated(f"bench.{label}_world", world, "count", "code",
                       f"the {label} world size of {bench}")
    fit_rows = {implementation: register_fits(numbers, bench, rows, implementation, worlds)
                for implementation in IMPLEMENTATIONS}
    fitted = [world for world in worlds if f"fit.gloo.w{world}.alpha_s" in numbers.entries]
    # Projections treat this machine as if every rank had a core: the smallest world size is
    # closest to that.
    projection_source = f"fit.gloo.w{fitted[0]}" if fitted else "fit.gloo"
    for field in ("alpha_s", "beta_s_per_byte"):
        for suffix in ("", ".low", ".high"):
            source = f"{projection_source}.{field}{suffix}"
            numbers.derived(f"fit.projection.{field}{suffix}", unchanged, [source],
                            numbers.entries[source]["unit"],
                            "the smallest world size's fit: the fewest ranks per core")
    for label, world in ends if fitted else ():
        numbers.derived(f"fit.gloo.{label}.alpha_s", unchanged, [f"fit.gloo.w{world}.alpha_s"],
                        "us", "alias")
    # gloo's slowest 5 % against its median at the smallest message and world size, where one
    # descheduled rank shows most
    gloo = [(index, row) for index, row in rows if row["implementation"] == "gloo"]
    if gloo:
        index, _ = min(gloo, key=lambda pair: (pair[1]["world_size"], pair[1]["bytes"]))
        numbers.measured("bench.tail.bytes", bench, f"measurements[{index}].bytes", "bytes")
        numbers.measured("bench.tail.world", bench, f"measurements[{index}].world_size", "count")
        numbers.derived("bench.tail.p95_over_median", lambda p95, median: p95 / median,
                        [f"{bench}#measurements[{index}].p95_s",
                         f"{bench}#measurements[{index}].median_s"], "ratio",
                        "the 95th percentile of the timed calls / their median")
    return fitted, {"table.fits": table(FITS_COLUMNS, fit_rows["gloo"]),
                    "table.fits.ring": table(FITS_COLUMNS, fit_rows["ring"])}


def register_fits(numbers, bench, rows, implementation, worlds):
    """One implementation's fit over every world size and one per world size; their table rows."""
    points = [(measurement["world_size"], measurement["bytes"], measurement["median_s"])
              for _, measurement in rows if measurement["implementation"] == implementation]
    if len(points) < 2:
        raise BuildError(f"{bench} has fewer than two verified {implementation} measurements: "
                         "no fit possible")
    register_fit(numbers, f"fit.{implementation}", tuple(zip(*points)), bench, implementation)
    for world in worlds:
        mine = [point for point in points if point[0] == world]
        if len(mine) >= 2:
            register_fit(numbers, f"fit.{implementation}.w{world}", tuple(zip(*mine)), bench,
                         implementation, world)
    return [[implementation, ranks, with_interval(numbers, f"{name}.alpha_s"),
             with_interval(numbers, f"{name}.beta_s_per_byte"),
             numbers.text(f"{name}.median_relative_error"),
             numbers.text(f"{name}.max_relative_error")]
            for name, ranks in [(f"fit.{implementation}.w{world}", world) for world in worlds]
            + [(f"fit.{implementation}", "all")]]


def prediction_section(numbers, layouts, worlds, fitted, results_dir):
    """Per model: the fitted model's busy communication per step against the sweep's measured
    busy time, as a ratio with its spread over the repeats; DDP's all-reduces are those it was
    seen to send. `fitted`: the world sizes with a fit of their own."""
    ddp_sent = scaling_inputs.ddp_layouts(results_dir)
    rows, ratios, texts = [], [], {}
    for model, sizes in layouts.items():
        sent = ddp_sent.get(model, {}).get(DEFAULT_BUCKET_MB)
        for world in worlds:
            for series in COMMUNICATING:
                strategy = slug(series)
                if strategy == "ddp" and sent is None:
                    continue
                name, measured = f"predict.{model}.{strategy}.w{world}", key(model, series, world)
                messages = cost_model.messages_per_step(strategy, sizes, DEFAULT_BUCKET_MB,
                                                        ddp_layout=sent)
                fit = f"fit.{'ring' if strategy == 'ring' else 'gloo'}"
                fit += f".w{world}" if world in fitted else ""
                numbers.derived(f"{name}.comm_s",
                                functools.partial(cost_model.step_comm_time, messages, world),
                                [f"{fit}.alpha_s", f"{fit}.beta_s_per_byte"], "ms",
                                f"cost_model.step_comm_time of {strategy}'s all-reduces "
                                f"with the fit {fit}")
                if spread_over(numbers, f"{name}.ratio", f"{measured}.comm_busy",
                               f"{name}.comm_s", "measured busy / predicted"):
                    ratios.append((numbers.value(f"{name}.ratio.median"), name,
                                   f"the {model.upper()}'s {strategy} at {world} ranks"))
                rows.append([model.upper(), series, world, numbers.text(f"{name}.comm_s"),
                             numbers.spread_text(f"{measured}.comm_busy"),
                             numbers.spread_text(f"{name}.ratio")])
    for label, pick in (("low", min), ("high", max)):
        texts[f"text.predict.{label}"] = NOT_MEASURED
        if ratios:
            _, name, where = pick(ratios)
            shown = numbers.spread_text(f"{name}.ratio")
            texts[f"text.predict.{label}"] = (shown[:-1] + f"; {where})" if shown.endswith(")")
                                              else f"{shown} ({where})")
    return {"table.predict": table(["model", "sync", "ranks", "predicted busy", "measured busy",
                                    "measured ÷ predicted"], rows), **texts}


def spread_over(numbers, name, spread_key, denominator, formula):
    """`name.median`, `.min`, `.max`, `.n`: the spread `spread_key` over the number
    `denominator`; whether it could be registered."""
    inputs = [f"{spread_key}.{stat}" for stat in ("median", "min", "max", "n")] + [denominator]
    units = {"median": "ratio", "min": "ratio", "max": "ratio", "n": "count"}
    return numbers.derived_fields(
        name, lambda median, low, high, count, divisor: {
            "median": median / divisor, "min": low / divisor, "max": high / divisor, "n": count},
        inputs, units, f"{formula}, each of the spread over repeats")["median"] is not None
