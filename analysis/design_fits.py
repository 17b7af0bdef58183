"""The α-β model fitted to the all-reduce benchmark (§5.1), with bootstrap intervals of α and β,
and its prediction of each strategy's busy communication against the training runs (§5.2)."""
import functools

from analysis import cost_model, scaling_inputs
from analysis.design_numbers import NOT_MEASURED, SPREAD_UNITS, BuildError, load, table, unchanged
from analysis.design_performance import COMMUNICATING, key, slug
from runtime.options import DEFAULT_BUCKET_MB


def register_fit(numbers, name, rows, bench, implementation, world=None):
    """`name.*`: the α-β fit of `implementation`'s rows at `world` (None: all); the rows fitted."""
    rows = [row for row in rows if row["implementation"] == implementation
            and world in (None, row["world_size"])]
    if len(rows) < 2:  # not measured
        numbers.add(f"{name}.alpha_s", None, "us")
        numbers.add(f"{name}.beta_s_per_byte", None, "ns/byte")
        return []
    where = f"the verified {implementation} rows " + (f"at {world} ranks" if world
                                                      else "of every world size")
    points = [[row[field] for row in rows] for field in ("world_size", "bytes", "median_s")]
    fit = cost_model.fit_alpha_beta(*points)
    for field, value, unit in (("alpha_s", fit.alpha, "us"),
                               ("beta_s_per_byte", fit.beta, "ns/byte"),
                               ("median_relative_error", fit.median_relative_error, "percent"),
                               ("max_relative_error", fit.max_relative_error, "percent")):
        numbers.add(f"{name}.{field}", value, unit, kind="fit", file=bench,
                    implementation=implementation, **({"world_size": world} if world else {}),
                    formula=f"cost_model.fit_alpha_beta(world_size, bytes, median_s) of {where}")
    alphas, betas = zip(*cost_model.bootstrap_fits(*points))
    formula = (f"cost_model.interval of cost_model.bootstrap_fits({cost_model.BOOTSTRAP_DRAWS} "
               f"resamples) of {where}")
    for field, values, unit in (("alpha_s", alphas, "us"), ("beta_s_per_byte", betas, "ns/byte")):
        for end, value in zip(("low", "high"), cost_model.interval(values)):
            numbers.add(f"{name}.{field}.{end}", value, unit, kind="derived", formula=formula,
                        inputs=[f"{bench}#measurements"])
    return rows


def with_interval(numbers, name):
    """'233 µs (202–455)': a fitted number with its bootstrap interval."""
    if f"{name}.low" not in numbers.entries:
        return numbers.text(name)
    return numbers.range_text(name, f"{name}.low", f"{name}.high")


def allreduce_section(numbers, bench):
    """Fits of gloo and the ring, over all world sizes and per world size; sizes fitted, tables."""
    measurements = load(bench).get("measurements", [])
    rows = [row for row in measurements if row.get("verified", True)]
    numbers.measured("bench.iterations", bench, "config.iterations", "count")
    numbers.measured("bench.load_average", bench, "environment.load_average_1min_at_start",
                     "number")
    worlds = sorted({row["world_size"] for row in rows})
    for world in worlds:  # the worst shm / gloo bus-bandwidth ratio at 1 MiB and above
        numbers.measured(f"shm.allreduce.w{world}.worst_ratio", bench,
                         f"shm_target.per_world_size.{world}.worst_ratio", "ratio")
    ends = (("smallest", worlds[0]), ("largest", worlds[-1])) if worlds else ()
    for label, world in ends:
        numbers.stated(f"bench.{label}_world", world, "count", "code",
                       f"the {label} world size of {bench}")
    tables = {"table.fits": fits_table(numbers, bench, rows, "gloo", worlds),
              "table.fits.ring": fits_table(numbers, bench, rows, "ring", worlds)}
    fitted = [world for world in worlds if f"fit.gloo.w{world}.alpha_s" in numbers.entries]
    # projections treat this machine as if every rank had a core: the smallest world is closest
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
    # gloo's p95 / median at its smallest message and world size: one descheduled rank shows most
    gloo = [(row["world_size"], row["bytes"], index) for index, row in enumerate(measurements)
            if row.get("verified", True) and row["implementation"] == "gloo"]
    if gloo:
        row = f"measurements[{min(gloo)[2]}]"
        numbers.measured("bench.tail.bytes", bench, f"{row}.bytes", "bytes")
        numbers.measured("bench.tail.world", bench, f"{row}.world_size", "count")
        numbers.derived("bench.tail.p95_over_median", lambda p95, median: p95 / median,
                        [f"{bench}#{row}.p95_s", f"{bench}#{row}.median_s"], "ratio",
                        "the 95th percentile of the timed calls / their median")
    return fitted, tables


def fits_table(numbers, bench, rows, implementation, worlds):
    """One implementation's fit over every world size and one per world size; their table."""
    if not register_fit(numbers, f"fit.{implementation}", rows, bench, implementation):
        raise BuildError(f"{bench} has fewer than two verified {implementation} measurements: "
                         "no fit possible")
    names = [(f"fit.{implementation}.w{world}", world) for world in worlds]
    for name, world in names:
        register_fit(numbers, name, rows, bench, implementation, world)
    return table(["implementation", "ranks", "α (95% interval)", "β (95% interval)",
                  "median error", "largest error"],
                 [[implementation, ranks, with_interval(numbers, f"{name}.alpha_s"),
                   with_interval(numbers, f"{name}.beta_s_per_byte"),
                   numbers.text(f"{name}.median_relative_error"),
                   numbers.text(f"{name}.max_relative_error")]
                  for name, ranks in names + [(f"fit.{implementation}", "all")]])


def predicted_busy(numbers, name, messages, world, fit, formula):
    """`name`: cost_model.step_comm_time of `messages` at `world` ranks; its inputs, `fit`'s."""
    coefficients = [f"{fit}.alpha_s", f"{fit}.beta_s_per_byte"]
    numbers.derived(name, functools.partial(cost_model.step_comm_time, messages, world),
                    coefficients, "ms", formula)
    return coefficients


def spread_over(numbers, name, spread_key, denominator, formula):
    """`name.median`, `.min`, `.max`, `.n`: the spread `spread_key` over `denominator`, if known."""
    return numbers.derived_fields(name, lambda median, low, high, count, divisor: {
        "median": median / divisor, "min": low / divisor, "max": high / divisor, "n": count},
        [f"{spread_key}.{stat}" for stat in (*SPREAD_UNITS, "n")] + [denominator],
        {**dict.fromkeys(SPREAD_UNITS, "ratio"), "n": "count"},
        f"{formula}, each of the spread over repeats")["median"] is not None


def prediction_section(numbers, layouts, worlds, fitted, results_dir):
    """The fitted model's busy communication per step against the sweep's, DDP's as it was sent."""
    ddp_sent = scaling_inputs.ddp_layouts(results_dir)
    rows, ratios = [], []
    for model, sizes in layouts.items():
        sent = ddp_sent.get(model, {}).get(DEFAULT_BUCKET_MB)
        for world in worlds:
            for series in COMMUNICATING:
                strategy = slug(series)
                if strategy == "ddp" and sent is None:
                    continue
                name, measured = f"predict.{model}.{strategy}.w{world}", key(model, series, world)
                fit = f"fit.{'ring' if strategy == 'flat-ring' else 'gloo'}"
                fit += f".w{world}" if world in fitted else ""
                predicted_busy(numbers, f"{name}.comm_s", cost_model.messages_per_step(
                    strategy, sizes, DEFAULT_BUCKET_MB, ddp_layout=sent), world, fit,
                    f"cost_model.step_comm_time of {strategy}'s all-reduces with the fit {fit}")
                if spread_over(numbers, f"{name}.ratio", f"{measured}.comm_busy",
                               f"{name}.comm_s", "measured busy / predicted"):
                    ratios.append((numbers.value(f"{name}.ratio.median"), name,
                                   f"the {model.upper()}'s {strategy} at {world} ranks"))
                rows.append([model.upper(), series, world, numbers.text(f"{name}.comm_s"),
                             numbers.spread_text(f"{measured}.comm_busy"),
                             numbers.spread_text(f"{name}.ratio")])
    texts = dict.fromkeys(("text.predict.low", "text.predict.high"), NOT_MEASURED)
    for label, pick in (("low", min), ("high", max)) if ratios else ():
        _, name, where = pick(ratios)
        texts[f"text.predict.{label}"] = numbers.spread_text(f"{name}.ratio")[:-1] + f"; {where})"
    return {"table.predict": table(["model", "sync", "ranks", "predicted busy", "measured busy",
                                    "measured ÷ predicted"], rows), **texts}
