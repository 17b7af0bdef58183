"""§7, sharding: results/sharding.json (memory per rank and step time of DDP and the three ZeRO
levels) against the ZeRO paper's formulas (zero_formulas.py), prefetch or not, the verdicts
against DDP, and the formulas carried to a model too large for one rank. Numbers:
'sharding.<model>.w<n>.<configuration>.*' (measured), 'zero.<model>.w<n>.<level>.*' (formulas),
'project.zero.*'. A table is a list of columns: a new measured field is a FIELDS entry and a column.
"""
import operator
import os
from functools import partial

from analysis import design_numbers, zero_formulas
from analysis.design_numbers import NOT_MEASURED, Numbers, cells, headers, indices_by, table

MODELS = ("mlp", "cnn")
FORMULA_WORLDS = (1, 2, 3, 4)
SIDE_BY_SIDE_WORLDS = (2, 4)  # the tables of time; memory and bytes: FORMULA_WORLDS
ZERO_LEVELS = zero_formulas.LEVELS[1:]
TRANSPORTS = (("", "shared memory"), ("-ring", "the ring"), ("-library", "gloo"))  # name suffixes
# ours over the default transport (shared memory, on one host), torch's, ours over the others
NAMES = {"ddp": "DDP", **{level: f"ZeRO-{level[-1]}" for level in ZERO_LEVELS},
         "ddp-shm": "DDP over shared memory", "ddp-ring": "DDP over the ring",
         "zero3-no-prefetch": "ZeRO-3 over gloo, no prefetch", "torch-fully-shard": "fully_shard",
         "torch-zero1": "torch's ZeroRedundancyOptimizer",
         **{f"{level}{suffix}": f"ZeRO-{level[-1]} over {shown}"
            for suffix, shown in TRANSPORTS[1:] for level in ZERO_LEVELS}}
SIDE = ("ddp", *ZERO_LEVELS, "zero3-no-prefetch", "torch-zero1", "torch-fully-shard")
HALVES_BYTES = 16 * 2**20  # where bandwidth, not latency, sets a collective's time (§5.1)
# ours against torch's own, both over gloo, each step over the other's in the same repeat
AGAINST_TORCH = (("zero1-library", "torch-zero1"), ("zero3-library", "torch-fully-shard"))
# a verdict's name -> its ratio's: over gloo's DDP, the same transport's DDP, torch's own
RATIO_OF = {"vs_ddp": "step_ratio", "vs_same": "same_ratio", "vs_torch": "vs_torch_ratio"}
VERDICTS = (("ddp-shm", "vs_ddp", "DDP over shared memory ÷ DDP over gloo"),
            ("ddp-ring", "vs_ddp", "DDP over the ring ÷ DDP over gloo"),
            *((f"{level}{suffix}", "vs_same", f"ZeRO-{level[-1]} ÷ DDP, both over {shown}")
              for suffix, shown in TRANSPORTS for level in ZERO_LEVELS),
            *((ours, "vs_torch", f"ZeRO-{ours[4]} ÷ {NAMES[theirs]}, both over gloo")
              for ours, theirs in AGAINST_TORCH))
STATES_TEXT = {"ddp": "4Ψ + 4Ψ + 8Ψ", "zero1": "4Ψ + 4Ψ + 8Ψ/n", "zero2": "4Ψ + 12Ψ/n",
               "zero3": "16Ψ/n"}
# number name -> (the measurement's field, unit); 'sent': what left the rank, measured
FIELDS = {"step": ("median_step_s", "ms"),
          **{short: (f"median_comm_{short}_s", "ms") for short in ("busy", "hidden", "exposed")},
          "states": ("held_bytes.model_states", "bytes"),
          "peak": ("held_bytes.model_states_peak", "bytes"),  # at their most, in the step
          "peak_rss": ("peak_rss_bytes", "bytes"), "sent": ("bytes_measured_per_step", "bytes"),
          "step_ratio": ("step_ratio_to_ddp", "ratio"),  # over gloo's DDP, and over the DDP
          "same_ratio": ("step_ratio_to_same_transport_ddp", "ratio"),  # of the same transport
          "states_ratio": ("model_states_ratio_to_ddp", "ratio")}
# the projection's links: a short name -> (what a reader sees, the number it names, its β's)
LINKS = {"loopback": ("this machine's loopback (§5.1)", None, "fit.projection.beta_s_per_byte"),
         "1g": ("the emulated {} link (§5.6)", "emulated.rate",
                "emulated.fit.gloo.w2.beta_s_per_byte"),
         "100g": ("a {} link (assumed)", "assume.link.100g", "assume.beta.100g")}
TABLES = [f"table.sharding.{name}" for name in ("side.mlp side.cnn memory.mlp memory.cnn bytes "
                                                "prefetch verdicts main halves").split()]
RUN_SETTINGS = (*((name, f"config.{name}", "count") for name in ("steps", "warmup", "repeats")),
                ("batch", "config.batch_size", "count"), ("bucket_mb", "config.bucket_mb", "MiB"),
                ("load_average", "environment.load_average_1min_at_start", "number"))
SPREAD = Numbers.spread_text
MEASURED = "sharding.{model}.w{world}"
# the tables' columns after their leading cells: (header, number name[, how it is shown])
SIDE_BY_SIDE = (("model states", "{name}.states.median"), ("× DDP", "{name}.states_ratio.median"),
                ("at their peak", "{name}.peak.median"), ("peak RSS", "{name}.peak_rss.median"),
                ("sent per step", "{name}.sent.median"),
                ("step", "{name}.step", SPREAD),  # its ratios, like against like: the verdicts
                ("communication busy", "{name}.busy.median"))  # hidden: §7.6's table
MEMORY = (("formula", "zero.{model}.w{world}.{level}.states"),
          ("measured", "{name}.states.median"), ("÷ formula", "{name}.states_vs_formula"),
          ("padding", "{name}.padding"), ("other", "{name}.other"))
BYTES = (("2P(n−1)/n", "zero.{model}.w{world}.ddp.sent"),
         *((NAMES[name], MEASURED + f".{name}.sent.median")
           for name in ("ddp", "zero1-ring", "zero1-library", "zero2-ring", "zero2-library")),
         ("3P(n−1)/n", "zero.{model}.w{world}.zero3.sent"),
         *((NAMES[name], MEASURED + f".{name}.sent.median")
           for name in ("zero3-ring", "zero3-library")),
         ("ZeRO-3 over the ring ÷ DDP", MEASURED + ".sent_ratio"))
PREFETCH = (("step, prefetch", MEASURED + ".zero3-library.step", SPREAD),  # both over gloo
            ("step, none", MEASURED + ".zero3-no-prefetch.step", SPREAD),
            ("ratio", MEASURED + ".prefetch_ratio", SPREAD), ("verdict", MEASURED + ".prefetch"),
            *((f"{field}, {shown}", MEASURED + f".{configuration}.{field}.median")
              for field in ("hidden", "exposed") for configuration, shown in
              (("zero3-library", "prefetch"), ("zero3-no-prefetch", "none"))))


def key(model, world, configuration):
    return f"sharding.{model}.w{world}.{configuration}"


def held(level, parameters, world):
    return zero_formulas.model_states(level, parameters, world)["model_states"]  # all categories


def sharding_section(numbers, results_dir):
    """The tables of §7 and every number its prose quotes."""
    path = os.path.join(results_dir, "sharding.json")
    document, problem = design_numbers.read_results(path, "sharding-bench/2",
                                                    "python -m benchmarks.sharding_bench")
    rows = document.get("measurements", [])
    where = indices_by(rows, "model", "world_size", "configuration")  # one index per repeat
    for model, world in [(model, world) for model in MODELS for world in FORMULA_WORLDS]:
        register_world(numbers, path, rows, where, model, world)
    for largest, suffix, levels in (("other_largest", ".other", zero_formulas.LEVELS),  # bytes
                                    ("ring_padding_largest", "-ring.sent_excess", ZERO_LEVELS),
                                    ("ring_beyond_largest", "-ring.sent_beyond", ZERO_LEVELS)):
        numbers.derived(f"sharding.{largest}", lambda *values: max(map(abs, values)), [
            key(model, world, level) + suffix for model in MODELS for world in FORMULA_WORLDS
            for level in levels], "bytes", f"the largest |{suffix}| of any model, n and level")
    numbers.stated("zero.traffic_ratio", zero_formulas.traffic_factor("zero3")
                   / zero_formulas.traffic_factor("ddp"), "ratio", "code",
                   "analysis/zero_formulas.py: ZeRO-3's 3P(n-1)/n over DDP's 2P(n-1)/n")
    for model in MODELS:  # one step's buckets of DDP, shards of ZeRO-2 and -3: two ranks, repeat 1
        for level, field in (("ddp", "collectives"), ("zero2", "shards"), ("zero3", "shards")):
            indices = where.get((model, 2, level), [])
            numbers.derived(f"sharding.{model}.{level}.{field}", len,
                            [f"{path}#measurements[{indices[0]}].{field}"] if indices else [],
                            "count", f"the length of the list (one step's {field}: at two ranks)")
    for name, field, unit in RUN_SETTINGS:
        numbers.measured(f"sharding.{name}", path if document.get("config") else None, field, unit)
    command = f"`{document['command']}`" if document.get("command") else NOT_MEASURED
    other, beyond = map(numbers.text, ("sharding.other_largest", "sharding.ring_beyond_largest"))
    context = {"text.sharding.configuration": command, **projection(numbers),
               "text.sharding.other": "nothing" if other == "0 B" else f"at most {other}",
               "text.sharding.to_the_byte": "to the byte, less the shards' padding"
               if beyond == "0 B" else f"plus the padding and {beyond} more"}
    if problem:
        return {**context, **dict.fromkeys(TABLES, problem)}
    for model in MODELS:  # memory per rank and time per step; model states against the formula
        context[f"table.sharding.side.{model}"] = table(
            ["ranks", "configuration", *headers(SIDE_BY_SIDE)],
            [[world, NAMES[configuration],
              *cells(numbers, SIDE_BY_SIDE, name=key(model, world, configuration))]
             for world in SIDE_BY_SIDE_WORLDS for configuration in SIDE])
        context[f"table.sharding.memory.{model}"] = table(["level", "ranks", *headers(MEMORY)], [
            [NAMES[level], world, *cells(numbers, MEMORY, name=key(model, world, level),
                                         model=model, world=world, level=level)]
            for level in zero_formulas.LEVELS for world in FORMULA_WORLDS])
    context["table.sharding.bytes"] = table(["model", "ranks", *headers(BYTES)], [
        [model.upper(), world, *cells(numbers, BYTES[:-1], model=model, world=world),
         cells(numbers, BYTES[-1:], model=model, world=world)[0] if world > 1 else "—"]
        for model in MODELS for world in FORMULA_WORLDS])  # one rank sends nothing: no ratio
    context["table.sharding.prefetch"] = table(["model", "ranks", *headers(PREFETCH)], [
        [model.upper(), world, *cells(numbers, PREFETCH, model=model, world=world)]
        for model in MODELS for world in SIDE_BY_SIDE_WORLDS])
    context["table.sharding.verdicts"] = table(  # like against like: one transport a ratio
        ["step", *(f"{model.upper()}, {world} ranks" for model in MODELS
                   for world in SIDE_BY_SIDE_WORLDS)],
        [[shown, *(numbers.claim(f"{key(model, world, name)}.{RATIO_OF[against]}",
                                 f"{key(model, world, name)}.{against}") for model in MODELS
                   for world in SIDE_BY_SIDE_WORLDS)] for name, against, shown in VERDICTS])
    context["table.sharding.main"] = main_job_table(numbers, results_dir)
    context["table.sharding.halves"] = halves_table(numbers, results_dir)
    return context


def halves_table(numbers, results_dir):
    """Each transport's two ZeRO collectives at HALVES_BYTES: time, and a memory copy's over it."""
    path = os.path.join(results_dir, "allreduce-bench.json")  # a memory copy timed in the same run
    rows = design_numbers.load(path).get("halves", []) if os.path.exists(path) else []
    where = indices_by(rows, "world_size", "collective", "implementation", "bytes")
    lines = []
    for collective in ("reduce-scatter", "all-gather"):
        for over, shown in (("gloo", "gloo"), ("ring", "the ring"), ("shm", "shared memory")):
            lines.append([collective, shown])
            for world in SIDE_BY_SIDE_WORLDS:
                index = where.get((world, collective, over, HALVES_BYTES), [None])[0]
                name = f"halves.w{world}.{collective}.{over}"
                source = path if index is not None else None
                numbers.measured(f"{name}.time", source, f"halves[{index}].median_s", "ms")
                numbers.measured(f"{name}.of_copy", source, f"halves[{index}].fraction_of_copy",
                                 "percent")
                lines[-1] += [numbers.text(f"{name}.time"), numbers.text(f"{name}.of_copy")]
    return table(["collective", "over", *(f"{label}, {world} ranks" for world in SIDE_BY_SIDE_WORLDS
                                           for label in ("time", "of a copy"))], lines)


def main_job_table(numbers, results_dir):
    """The README's main job under each level beside bucketed sync: test accuracy and run time."""
    runs = {"bucketed sync (DDP's design)": os.path.join("main", "mlp-manual-bucketed-w4.json"),
            **{NAMES[level]: os.path.join("main-sharded", f"mlp-sharded-{sharded}-w4.json")
               for level, sharded in zip(ZERO_LEVELS, ("optimizer", "gradients", "parameters"))}}
    rows = []
    for index, (label, path) in enumerate(runs.items()):
        path, name = os.path.join(results_dir, path), f"sharding.main.{index}"
        path = path if os.path.exists(path) else None
        numbers.measured(f"{name}.accuracy", path, "test.accuracy", "percent")
        numbers.measured(f"{name}.time", path, "total_time_s", "s")
        rows.append([label, numbers.text(f"{name}.accuracy"), numbers.text(f"{name}.time")])
    return table(["gradients averaged by", "test accuracy", "run time"], rows)


def register_world(numbers, path, rows, where, model, world):
    """At `world` ranks: the paper's bytes, each configuration's measurements, and comparisons."""
    for level in zero_formulas.LEVELS:
        name = f"zero.{model}.w{world}.{level}"
        numbers.derived(f"{name}.states", partial(held, level, world=world),
                        [f"model.{model}.parameters"], "bytes", "zero_formulas.model_states: "
                        f"{STATES_TEXT[level]} bytes, Ψ the parameters, n = {world}")
        numbers.derived(f"{name}.sent", partial(zero_formulas.traffic, level, world=world),
                        [f"model.{model}.bytes"], "bytes",
                        f"zero_formulas.traffic: {zero_formulas.traffic_factor(level)}P(n-1)/n, "
                        f"P the parameter bytes, n = {world}")
    for configuration in NAMES:
        register_measured(numbers, path, rows, where, model, world, configuration)
    prefix = f"sharding.{model}.w{world}"
    for name in [key(model, world, configuration) for configuration in list(NAMES)[1:]]:
        for against in ("vs_ddp", "vs_same"):  # vs_same: where same_ratio is (register_measured)
            numbers.verdict(f"{name}.{against}", f"{name}.{RATIO_OF[against]}")
    for name, ours, theirs in [(f"{prefix}.prefetch", "zero3-library", "zero3-no-prefetch"),
                               *((f"{key(model, world, ours)}.vs_torch", ours, theirs)
                                 for ours, theirs in AGAINST_TORCH)]:
        inputs = design_numbers.paired_by_repeat(path, rows, "median_step_s",
                                                 where.get((model, world, ours), []),
                                                 where.get((model, world, theirs), []))
        numbers.paired_values(f"{name}_ratio", inputs, "ratio", 1.0,
                              f"{NAMES[ours]}'s step / {NAMES[theirs]}'s, in the same repeat",
                              verdict=name)
    sent = [f"{prefix}.zero3-ring.sent.median", f"{prefix}.ddp.sent.median"] if world > 1 else []
    numbers.derived(f"{prefix}.sent_ratio", operator.truediv, sent, "ratio",
                    "ZeRO-3's bytes per step over the ring over DDP's")


def register_measured(numbers, path, rows, where, model, world, configuration):
    """Every FIELDS spread over a configuration's repeats, and its memory and bytes against the
    formulas ('.padding': what the shards' padding adds to them; '.other': what is held beyond)."""
    name, indices = key(model, world, configuration), where.get((model, world, configuration), [])
    for short, (field, unit) in FIELDS.items():
        if short == "same_ratio" and (world not in SIDE_BY_SIDE_WORLDS or "zero" not in name):
            continue  # quoted by the verdicts alone
        inputs = [f"{path}#measurements[{index}].{field}" for index in indices]
        if short in RATIO_OF.values():  # one a repeat: their spread and the verdict's interval
            numbers.paired_values(f"{name}.{short}", inputs, unit, 1.0,
                                  f"the step / {'DDP' if short == 'step_ratio' else 'its DDP'}"
                                  "'s in the same repeat", already_ratios=True)
        else:
            numbers.spread_of(f"{name}.{short}", inputs, unit, field)
    level = zero_formulas.LEVEL_OF[configuration]
    formula = f"zero.{model}.w{world}.{level}"
    first = f"{path}#measurements[{indices[0]}]" if indices else None
    shards = rows[indices[0]]["shards"] if indices else []
    inputs = [f"{first}.shards[{index}].padded_numel" for index in range(len(shards))] or (
        [f"{first}.parameters"] if indices else [])  # DDP: nothing is padded
    numbers.derived(f"{name}.padded", lambda *counts: sum(counts), inputs, "count",
                    "the padded elements of the flat shards, summed (DDP: the parameters)")
    numbers.derived(f"{name}.states_padded", partial(held, level, world=world), [f"{name}.padded"],
                    "bytes", f"zero_formulas.model_states of {level} at the padded count")
    for number, inputs in ((f"{name}.padding", [f"{name}.states_padded", f"{formula}.states"]),
                           (f"{name}.other", [f"{name}.states.median", f"{name}.states_padded"]),
                           (f"{name}.sent_excess", [f"{name}.sent.median", f"{formula}.sent"])):
        numbers.derived(number, operator.sub, inputs, "bytes", "the first minus the second")
    numbers.derived(f"{name}.sent_beyond", lambda sent, count: sent - zero_formulas.traffic(
        level, 4 * count, world), [f"{name}.sent.median", f"{name}.padded"], "bytes",
        "the bytes sent less zero_formulas.traffic of the padded count's float32 bytes")
    numbers.derived(f"{name}.states_vs_formula", operator.truediv,
                    [f"{name}.states.median", f"{formula}.states"], "ratio", "the ratio")


def projection(numbers):
    """The paper's example model: memory per rank, the fewest ranks that fit, bytes sent, time."""
    numbers.stated("project.zero.parameters", int(zero_formulas.PROJECTED_PARAMETERS), "count",
                   "assumption", "analysis/zero_formulas.py: the ZeRO paper's Figure 1 example")
    numbers.stated("project.zero.memory", zero_formulas.PROJECTED_MEMORY_PER_RANK, "GB",
                   "assumption", "analysis/zero_formulas.py: a 32 GB V100, the paper's GPU")
    numbers.stated("project.zero.world", zero_formulas.PROJECTED_WORLD_SIZE, "count",
                   "assumption", "analysis/zero_formulas.py: the paper's Figure 1 example")
    for link, (*_, beta) in LINKS.items():
        numbers.derived(f"project.zero.link.{link}", lambda seconds: 1 / seconds / 1e9, [beta],
                        "GB/s", "1 / β")
    header = ["level", "model states per rank at the paper's n", "fewest ranks that fit",
              "sent per rank and step there", *("time to send it over " + shown.format(
                  numbers.text(number) if number else "") for shown, number, _ in LINKS.values())]
    rows = []
    for level in zero_formulas.LEVELS:
        name = f"project.zero.{level}"
        numbers.derived(f"{name}.states", partial(held, level),
                        ["project.zero.parameters", "project.zero.world"], "GB",
                        f"zero_formulas.model_states: {STATES_TEXT[level]}")
        parts = ["states", "fewest_ranks"]
        if numbers.derived(f"{name}.fewest_ranks", lambda parameters, memory, level=level:
                           zero_formulas.smallest_world(level, parameters, memory) or 0,
                           ["project.zero.parameters", "project.zero.memory"], "ranks",
                           "zero_formulas.smallest_world (0: no world size)"):
            numbers.derived(f"{name}.sent", lambda parameters, world, level=level:
                            zero_formulas.traffic(level, 4 * parameters, world),
                            ["project.zero.parameters", f"{name}.fewest_ranks"], "GB",
                            f"zero_formulas.traffic: {zero_formulas.traffic_factor(level)}"
                            "P(n-1)/n, P = 4Ψ")
            for link, (*_, beta) in LINKS.items():
                numbers.derived(f"{name}.time.{link}", operator.mul, [f"{name}.sent", beta], "s",
                                "bytes sent x β: the bandwidth term alone")
            parts += ["sent", *(f"time.{link}" for link in LINKS)]
        row = [NAMES[level], *(numbers.text(f"{name}.{part}") for part in parts)]
        rows.append(row + ["—"] * (len(header) - len(row)))  # nothing sent where no world size fits
    return {"table.sharding.projection": table(header, rows)}
