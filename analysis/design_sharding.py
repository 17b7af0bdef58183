"""§7, sharding: results/sharding.json (memory per rank and step time of DDP and the three ZeRO
levels) against the ZeRO paper's formulas (zero_formulas.py), prefetch or not, the verdicts
against DDP, and the formulas carried to a model too large for one rank. Numbers:
'sharding.<model>.w<n>.<configuration>.*' (measured), 'zero.<model>.w<n>.<level>.*' (formulas),
'project.zero.*'. A table is a list of columns: a new measured field is a FIELDS entry and a
column.
"""
import os

from analysis import zero_formulas
from analysis.design_numbers import (
    NOT_MEASURED,
    Numbers,
    cells,
    headers,
    indices_by,
    load,
    read_results,
    table,
)

SCHEMA = "sharding-bench/2"
MODELS = ("mlp", "cnn")
FORMULA_WORLDS = (1, 2, 3, 4)
SIDE_BY_SIDE_WORLDS = (2, 4)  # the tables of time; memory and bytes: FORMULA_WORLDS
# ours over the default transport (shared memory, on one host), torch's, ours over the others
NAMES = {"ddp": "DDP", "zero1": "ZeRO-1", "zero2": "ZeRO-2", "zero3": "ZeRO-3",
         "zero3-no-prefetch": "ZeRO-3 over gloo, no prefetch",
         "torch-zero1": "torch's ZeroRedundancyOptimizer",
         "torch-fully-shard": "torch's fully_shard",
         **{f"{level}-{transport}": f"ZeRO-{level[-1]} over {shown}"
            for transport, shown in (("ring", "the ring"), ("library", "gloo"))
            for level in ("zero1", "zero2", "zero3")}}
SIDE = ("ddp", "zero1", "zero2", "zero3", "zero3-no-prefetch", "torch-zero1", "torch-fully-shard")
TRANSPORTS = (("", "shared memory"), ("-ring", "the ring"), ("-library", "gloo"))  # name suffixes
HALVES_BYTES = 16 * 2**20  # where bandwidth, not latency, sets a collective's time (§5.1)
HALVES = (("reduce-scatter", "gloo"), ("reduce-scatter", "ring"), ("reduce-scatter", "shm"),
          ("all-gather", "gloo"), ("all-gather", "ring"), ("all-gather", "shm"))
# ours against torch's own, each step over the other's in the same repeat
AGAINST_TORCH = (("zero1", "torch-zero1"), ("zero3", "torch-fully-shard"))
STATES_TEXT = {"ddp": "4Ψ + 4Ψ + 8Ψ", "zero1": "4Ψ + 4Ψ + 8Ψ/n", "zero2": "4Ψ + 12Ψ/n",
               "zero3": "16Ψ/n"}
# number name -> (the measurement's field, unit)
FIELDS = {"step": ("median_step_s", "ms"), "busy": ("median_comm_busy_s", "ms"),
          "hidden": ("median_comm_hidden_s", "ms"), "exposed": ("median_comm_exposed_s", "ms"),
          "states": ("held_bytes.model_states", "bytes"),
          "peak": ("held_bytes.model_states_peak", "bytes"),  # at their most, in the step
          "peak_rss": ("peak_rss_bytes", "bytes"),
          "sent": ("bytes_measured_per_step", "bytes"),  # what left the rank, measured
          "step_ratio": ("step_ratio_to_ddp", "ratio"),
          "states_ratio": ("model_states_ratio_to_ddp", "ratio")}
# the projection's links: a short name -> (what a reader sees, with the number it names, and the
# number of its β)
LINKS = {"loopback": ("this machine's loopback (§5.1)", None, "fit.projection.beta_s_per_byte"),
         "1g": ("the emulated {} link (§5.6)", "emulated.rate",
                "emulated.fit.gloo.w2.beta_s_per_byte"),
         "100g": ("a {} link (assumed)", "assume.link.100g", "assume.beta.100g")}
COMMAND = "python -m benchmarks.sharding_bench"
TABLES = ("table.sharding.side.mlp", "table.sharding.side.cnn", "table.sharding.memory.mlp",
          "table.sharding.memory.cnn", "table.sharding.bytes", "table.sharding.prefetch",
          "table.sharding.verdicts", "table.sharding.main", "table.sharding.transports",
          "table.sharding.halves")
RUN_SETTINGS = (("steps", "config.steps", "count"), ("warmup", "config.warmup", "count"),
                ("repeats", "config.repeats", "count"), ("batch", "config.batch_size", "count"),
                ("bucket_mb", "config.bucket_mb", "MiB"),
                ("load_average", "environment.load_average_1min_at_start", "number"))
TEXT, SPREAD = Numbers.text, Numbers.spread_text
MEASURED = "sharding.{model}.w{world}"
# the tables' columns after their leading cells: (header, number name, how it is shown)
SIDE_BY_SIDE = (("model states", "{name}.states.median", TEXT),
                ("× DDP", "{name}.states_ratio.median", TEXT),
                ("at their peak", "{name}.peak.median", TEXT),
                ("peak RSS", "{name}.peak_rss.median", TEXT),
                ("sent per step", "{name}.sent.median", TEXT),
                ("step", "{name}.step", SPREAD), ("× DDP", "{name}.step_ratio", SPREAD),
                ("communication busy", "{name}.busy.median", TEXT))  # hidden: §7.6's table
MEMORY = (("formula", "zero.{model}.w{world}.{level}.states", TEXT),
          ("measured", "{name}.states.median", TEXT),
          ("÷ formula", "{name}.states_vs_formula", TEXT),
          ("padding", "{name}.padding", TEXT), ("other", "{name}.other", TEXT))
BYTES = (("2P(n−1)/n", "zero.{model}.w{world}.ddp.sent", TEXT),
         ("DDP", MEASURED + ".ddp.sent.median", TEXT),
         *((f"{NAMES[level]} over {shown}", MEASURED + f".{level}-{transport}.sent.median", TEXT)
           for level in ("zero1", "zero2") for transport, shown in (("ring", "the ring"),
                                                                   ("library", "gloo"))),
         ("3P(n−1)/n", "zero.{model}.w{world}.zero3.sent", TEXT),
         *((f"ZeRO-3 over {shown}", MEASURED + f".zero3-{transport}.sent.median", TEXT)
           for transport, shown in (("ring", "the ring"), ("library", "gloo"))),
         ("ZeRO-3 over the ring ÷ DDP", MEASURED + ".sent_ratio", TEXT))
PREFETCH = (("step, prefetch", MEASURED + ".zero3-library.step", SPREAD),  # both over gloo
            ("step, none", MEASURED + ".zero3-no-prefetch.step", SPREAD),
            ("ratio", MEASURED + ".prefetch_ratio", SPREAD),
            ("verdict", MEASURED + ".prefetch", TEXT),
            *((f"{field}, {shown}", MEASURED + f".{configuration}.{field}.median", TEXT)
              for field in ("hidden", "exposed")
              for configuration, shown in (("zero3-library", "prefetch"),
                                           ("zero3-no-prefetch", "none"))))


def key(model, world, configuration):
    return f"sharding.{model}.w{world}.{configuration}"


def sharding_section(numbers, results_dir):
    """The tables of §7 and every number its prose quotes."""
    path = os.path.join(results_dir, "sharding.json")
    document, problem = read_results(path, SCHEMA, COMMAND)
    rows = document.get("measurements", [])
    where = indices_by(rows, "model", "world_size", "configuration")  # one index per repeat
    for model in MODELS:
        for world in FORMULA_WORLDS:
            register_formulas(numbers, model, world)
            for configuration in NAMES:
                register_measured(numbers, path, rows, where.get((model, world, configuration),
                                                                 []), model, world, configuration)
            register_comparisons(numbers, path, rows, where, model, world)
    numbers.derived("sharding.other_largest", lambda *others: max(others),
                    [f"{key(model, world, level)}.other" for model in MODELS
                     for world in FORMULA_WORLDS for level in zero_formulas.LEVELS], "bytes",
                    "the largest 'other' of the memory tables")
    numbers.stated("zero.traffic_ratio", zero_formulas.traffic_factor("zero3")
                   / zero_formulas.traffic_factor("ddp"), "ratio", "code",
                   "analysis/zero_formulas.py: ZeRO-3's 3P(n-1)/n over DDP's 2P(n-1)/n")
    register_layouts(numbers, path, where)
    context = {"text.sharding.configuration": describe_run(numbers, path, document)}
    context.update(projection(numbers))
    if problem:
        return {**context, **dict.fromkeys(TABLES, problem)}
    for model in MODELS:  # memory per rank and time per step of every configuration
        context[f"table.sharding.side.{model}"] = table(
            ["ranks", "configuration", *headers(SIDE_BY_SIDE)],
            [[world, shown, *cells(numbers, SIDE_BY_SIDE, name=key(model, world, configuration))]
             for world in SIDE_BY_SIDE_WORLDS for configuration, shown in (
                 (configuration, NAMES[configuration]) for configuration in SIDE)])
    context["table.sharding.transports"] = table(  # their bytes: table.sharding.bytes
        ["model", "ranks", "level", *(f"step ÷ DDP, over {shown}" for _, shown in TRANSPORTS)],
        [[model.upper(), world, NAMES[level],
          *(numbers.spread_text(f"{key(model, world, level + suffix)}.step_ratio")
            for suffix, _ in TRANSPORTS)]
         for model in MODELS for world in SIDE_BY_SIDE_WORLDS[-1:]
         for level in ("zero1", "zero2", "zero3")])
    for model in MODELS:  # model states against the formula, the difference accounted for
        context[f"table.sharding.memory.{model}"] = table(
            ["level", "ranks", *headers(MEMORY)],
            [[NAMES[level], world, *cells(numbers, MEMORY, name=key(model, world, level),
                                          model=model, world=world, level=level)]
             for level in zero_formulas.LEVELS for world in FORMULA_WORLDS])
    context["table.sharding.bytes"] = table(  # one rank sends nothing: no ratio to DDP's
        ["model", "ranks", *headers(BYTES)],
        [[model.upper(), world, *cells(numbers, BYTES[:-1], model=model, world=world),
          cells(numbers, BYTES[-1:], model=model, world=world)[0] if world > 1 else "—"]
         for model in MODELS for world in FORMULA_WORLDS])
    context["table.sharding.prefetch"] = table(
        ["model", "ranks", *headers(PREFETCH)],
        [[model.upper(), world, *cells(numbers, PREFETCH, model=model, world=world)]
         for model in MODELS for world in SIDE_BY_SIDE_WORLDS])
    context["table.sharding.verdicts"] = table(
        ["model", "ranks", *(f"{NAMES[level]} ÷ DDP" for level in ("zero1", "zero2", "zero3")),
         *(f"{NAMES[ours]} ÷ {NAMES[theirs]}" for ours, theirs in AGAINST_TORCH)],
        [[model.upper(), world, *(claim(numbers, key(model, world, level), "vs_ddp")
                                  for level in ("zero1", "zero2", "zero3")),
          *(claim(numbers, key(model, world, ours), "vs_torch") for ours, _ in AGAINST_TORCH)]
         for model in MODELS for world in SIDE_BY_SIDE_WORLDS])
    context["table.sharding.main"] = main_job_table(numbers, results_dir)
    context["table.sharding.halves"] = halves_table(numbers, results_dir)
    return context


def halves_table(numbers, results_dir):
    """ZeRO's two collectives over each transport at HALVES_BYTES: the time, and a copy of the
    buffer in memory's time over it (benchmarks/allreduce_bench.py, in the same run)."""
    path = os.path.join(results_dir, "allreduce-bench.json")
    rows = load(path).get("halves", []) if os.path.exists(path) else []
    where = {(row["world_size"], row["collective"], row["implementation"]): index
             for index, row in enumerate(rows) if row["bytes"] == HALVES_BYTES}
    lines = []
    for collective, implementation in HALVES:
        line = [collective, {"shm": "shared memory", "ring": "the ring"}.get(implementation,
                                                                             implementation)]
        for world in SIDE_BY_SIDE_WORLDS:
            index = where.get((world, collective, implementation))
            name = f"halves.w{world}.{collective}.{implementation}"
            source = path if index is not None else None
            numbers.measured(f"{name}.time", source, f"halves[{index}].median_s", "ms")
            numbers.measured(f"{name}.of_copy", source, f"halves[{index}].fraction_of_copy",
                             "percent")
            line += [numbers.text(f"{name}.time"), numbers.text(f"{name}.of_copy")]
        lines.append(line)
    return table(["collective", "over", *(f"{label}, {world} ranks" for world in
                                           SIDE_BY_SIDE_WORLDS for label in ("time", "of a copy"))],
                 lines)


def claim(numbers, name, against):
    """'1.05× (1.01–1.09): slower': a step over DDP's (`against` 'vs_ddp') or torch's
    ('vs_torch'), within repeats, and its verdict."""
    verdict = numbers.text(f"{name}.{against}")
    if verdict == NOT_MEASURED:
        return NOT_MEASURED
    ratios = f"{name}.step_ratio" if against == "vs_ddp" else f"{name}.vs_torch_ratio"
    return f"{numbers.spread_text(ratios)}: {verdict}"


def main_job_table(numbers, results_dir):
    """The README's main job under each level beside bucketed sync: test accuracy and run time."""
    runs = {"bucketed sync (DDP's design)": os.path.join("main", "mlp-manual-bucketed-w4.json"),
            **{NAMES[configuration]: os.path.join("main-sharded", f"mlp-sharded-{level}-w4.json")
               for configuration, level in (("zero1", "optimizer"), ("zero2", "gradients"),
                                            ("zero3", "parameters"))}}
    rows = []
    for index, (label, path) in enumerate(runs.items()):
        path = os.path.join(results_dir, path)
        path, name = path if os.path.exists(path) else None, f"sharding.main.{index}"
        numbers.measured(f"{name}.accuracy", path, "test.accuracy", "percent")
        numbers.measured(f"{name}.time", path, "total_time_s", "s")
        rows.append([label, numbers.text(f"{name}.accuracy"), numbers.text(f"{name}.time")])
    return table(["gradients averaged by", "test accuracy", "run time"], rows)


def describe_run(numbers, path, document):
    """Registers the run's settings and load average; returns the command it was made with."""
    for name, field, unit in RUN_SETTINGS:
        numbers.measured(f"sharding.{name}", path if document.get("config") else None, field, unit)
    return f"`{document['command']}`" if document.get("command") else NOT_MEASURED


def register_layouts(numbers, path, where):
    """'sharding.<model>.ddp.collectives' and '.<zero2|zero3>.shards': two ranks, first repeat."""
    for model in MODELS:
        for configuration, field in (("ddp", "collectives"), ("zero2", "shards"),
                                     ("zero3", "shards")):
            indices = where.get((model, 2, configuration), [])
            inputs = [f"{path}#measurements[{indices[0]}].{field}"] if indices else []
            numbers.derived(f"sharding.{model}.{configuration}.{field}", len, inputs, "count",
                            f"the length of the list (one step's {field}: at two ranks)")


def register_formulas(numbers, model, world):
    """'zero.<model>.w<n>.<level>.states' and '.sent': the paper's bytes per rank."""
    for level in zero_formulas.LEVELS:
        name = f"zero.{model}.w{world}.{level}"
        numbers.derived(f"{name}.states",
                        lambda parameters, level=level: zero_formulas.model_states(
                            level, parameters, world)["model_states"],
                        [f"model.{model}.parameters"], "bytes",
                        f"zero_formulas.model_states: {STATES_TEXT[level]} bytes, Ψ the "
                        f"parameters, n = {world}")
        factor = zero_formulas.traffic_factor(level)
        numbers.derived(f"{name}.sent",
                        lambda nbytes, level=level: zero_formulas.traffic(level, nbytes, world),
                        [f"model.{model}.bytes"], "bytes",
                        f"zero_formulas.traffic: {factor}P(n-1)/n, P the parameter bytes, "
                        f"n = {world}")


def register_measured(numbers, path, rows, indices, model, world, configuration):
    """Every FIELDS spread over the repeats `indices` of a configuration (ratios to DDP's with the
    verdict's interval), and its memory and bytes against the formulas: '.padded' (elements its
    shards hold), '.padding' (what padding adds to the formula), '.other' (what the measurement
    holds beyond both), '.sent_excess' (measured bytes - the formula's)."""
    name = key(model, world, configuration)
    for short, (field, unit) in FIELDS.items():
        inputs = [f"{path}#measurements[{index}].{field}" for index in indices]
        if field == "step_ratio_to_ddp":
            numbers.paired_values(f"{name}.{short}", inputs, unit, 1.0,
                                  "the step / DDP's in the same repeat", already_ratios=True)
        else:
            numbers.spread_of(f"{name}.{short}", inputs, unit, field)
    level = zero_formulas.LEVEL_OF[configuration]
    formula = f"zero.{model}.w{world}.{level}"
    shards = rows[indices[0]]["shards"] if indices else []
    inputs = [f"{path}#measurements[{indices[0]}].shards[{index}].padded_numel"
              for index in range(len(shards))]
    if indices and not shards:  # DDP: nothing is padded
        inputs = [f"{path}#measurements[{indices[0]}].parameters"]
    numbers.derived(f"{name}.padded", lambda *counts: sum(counts), inputs, "count",
                    "the padded elements of the flat shards, summed (DDP: the parameters)")
    numbers.derived(f"{name}.states_padded",
                    lambda parameters: zero_formulas.model_states(level, parameters,
                                                                  world)["model_states"],
                    [f"{name}.padded"], "bytes",
                    f"zero_formulas.model_states of {level} at the padded count")
    difference = "the first minus the second"
    numbers.derived(f"{name}.padding", lambda padded, exact: padded - exact,
                    [f"{name}.states_padded", f"{formula}.states"], "bytes", difference)
    numbers.derived(f"{name}.other", lambda measured, padded: measured - padded,
                    [f"{name}.states.median", f"{name}.states_padded"], "bytes", difference)
    numbers.derived(f"{name}.states_vs_formula", lambda measured, exact: measured / exact,
                    [f"{name}.states.median", f"{formula}.states"], "ratio", "the ratio")
    numbers.derived(f"{name}.sent_excess", lambda measured, exact: measured - exact,
                    [f"{name}.sent.median", f"{formula}.sent"], "bytes", difference)


def register_comparisons(numbers, path, rows, where, model, world):
    """Each configuration's step against DDP's ('.vs_ddp'), ours against torch's
    ('.vs_torch', '.vs_torch_ratio'), ZeRO-3's with prefetch against without ('.prefetch',
    '.prefetch_ratio'), and ZeRO-3's bytes over the ring over DDP's ('.sent_ratio')."""
    prefix = f"sharding.{model}.w{world}"
    for configuration in list(NAMES)[1:]:
        numbers.verdict(f"{key(model, world, configuration)}.vs_ddp",
                        f"{key(model, world, configuration)}.step_ratio")
    pairs = [(f"{prefix}.prefetch", "zero3-library", "zero3-no-prefetch")] + [
        (f"{key(model, world, ours)}.vs_torch", ours, theirs) for ours, theirs in AGAINST_TORCH]
    for name, ours, theirs in pairs:
        mine, other = ({rows[index]["repeat"]: index
                        for index in where.get((model, world, configuration), [])}
                       for configuration in (ours, theirs))
        inputs = [f"{path}#measurements[{indices[repeat]}].median_step_s"
                  for repeat in sorted(set(mine) & set(other)) for indices in (mine, other)]
        numbers.paired_values(f"{name}_ratio", inputs, "ratio", 1.0,
                              f"{NAMES[ours]}'s step / {NAMES[theirs]}'s, in the same repeat")
        numbers.verdict(name, f"{name}_ratio")
    numbers.derived(f"{prefix}.sent_ratio", lambda mine, theirs: mine / theirs,
                    [f"{key(model, world, 'zero3-ring')}.sent.median",
                     f"{key(model, world, 'ddp')}.sent.median"] if world > 1 else [],
                    "ratio", "ZeRO-3's bytes per step over the ring over DDP's")


def projection(numbers):
    """The formulas for the paper's example model: memory per rank, the fewest ranks at which each
    level fits, the bytes sent there and how long the links take."""
    source = "analysis/zero_formulas.py"
    numbers.stated("project.zero.parameters", int(zero_formulas.PROJECTED_PARAMETERS), "count",
                   "assumption", f"{source}: the ZeRO paper's Figure 1 example")
    numbers.stated("project.zero.memory", zero_formulas.PROJECTED_MEMORY_PER_RANK, "GB",
                   "assumption", f"{source}: a 32 GB V100, the paper's GPU")
    numbers.stated("project.zero.world", zero_formulas.PROJECTED_WORLD_SIZE, "count",
                   "assumption", f"{source}: the paper's Figure 1 example")
    for link, (_shown, _name, beta) in LINKS.items():
        numbers.derived(f"project.zero.link.{link}", lambda seconds: 1 / seconds / 1e9, [beta],
                        "GB/s", "1 / β")
    rows = []
    for level in zero_formulas.LEVELS:
        name = f"project.zero.{level}"
        numbers.derived(f"{name}.states",
                        lambda parameters, world, level=level: zero_formulas.model_states(
                            level, parameters, world)["model_states"],
                        ["project.zero.parameters", "project.zero.world"], "GB",
                        f"zero_formulas.model_states: {STATES_TEXT[level]}")
        fewest = numbers.derived(
            f"{name}.fewest_ranks",
            lambda parameters, memory, level=level: zero_formulas.smallest_world(
                level, parameters, memory) or 0,
            ["project.zero.parameters", "project.zero.memory"], "ranks",
            "zero_formulas.smallest_world (0: no world size)")
        sent = ["—"] * (1 + len(LINKS))
        if fewest:
            numbers.derived(f"{name}.sent",
                            lambda parameters, world, level=level: zero_formulas.traffic(
                                level, 4 * parameters, world),
                            ["project.zero.parameters", f"{name}.fewest_ranks"], "GB",
                            f"zero_formulas.traffic: {zero_formulas.traffic_factor(level)}"
                            "P(n-1)/n, P = 4Ψ")
            for link, (_shown, _name, beta) in LINKS.items():
                numbers.derived(f"{name}.time.{link}", lambda sent, seconds: sent * seconds,
                                [f"{name}.sent", beta], "s",
                                "bytes sent x β: the bandwidth term alone")
            sent = [numbers.text(f"{name}.sent")] + [numbers.text(f"{name}.time.{link}")
                                                     for link in LINKS]
        rows.append([NAMES[level], numbers.text(f"{name}.states"),
                     numbers.text(f"{name}.fewest_ranks"), *sent])
    header = ["level", "model states per rank at the paper's n", "fewest ranks that fit",
              "sent per rank and step there"] + [
                  "time to send it over " + shown.format(numbers.text(name) if name else "")
                  for shown, name, _ in LINKS.values()]
    return {"table.sharding.projection": table(header, rows)}
