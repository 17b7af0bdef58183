"""§5.6: published systems set against the α-β model by compute per gradient byte. Horovod's
models (published.py) and ours, each with the published scaling efficiency and the model's flat
efficiency at Horovod's GPU count and link, with a TCP-class and an RDMA-class α (one flat ring
all-reduce after backward, no overlap: a lower bound)."""
import functools

from analysis import cost_model, published
from analysis.design_numbers import table

PUBLISHED_COLUMNS = ["model", "compute per step", "compute per gradient byte",
                     "published efficiency", "modelled: α of TCP", "modelled: α of RDMA"]
ALPHAS = ("assume.alpha_s", "assume.rdma_alpha_s")  # registered by design_scaling.py


def flat_step_efficiency(total_bytes, world, compute, alpha, beta):
    """compute / (compute + one flat ring all-reduce of the gradient): no overlap."""
    return compute / (compute + cost_model.allreduce_time(total_bytes, world, alpha, beta))


def published_step(images_per_s, batch, gpus=1):
    """published.step_seconds, its inputs in the order they are registered."""
    return published.step_seconds(images_per_s, batch, gpus)


def published_efficiency(world, step, parameters, alpha, beta):
    """flat_step_efficiency of a published model's fp32 gradient."""
    return flat_step_efficiency(4 * parameters, world, step, alpha, beta)


def per_gradient_byte(total_bytes, seconds):
    """Seconds per byte of gradient."""
    return seconds / total_bytes


def published_table(numbers, layouts):
    """Compute per gradient byte of Horovod's models and ours, with the published efficiency and
    the modelled one at Horovod's GPU count and link, with a TCP-class α and an RDMA-class α (flat
    all-reduce, no overlap: a lower bound)."""
    world = published.FIGURES["horovod_gpus_high"][0]
    link = published.FIGURES["horovod_link_gbit"][0]
    numbers.stated("published.horovod_beta", cost_model.link_beta(link), "ns/byte", "assumption",
                   "8 bits per byte / Horovod's link")
    no_overlap = "compute / (compute + one flat ring all-reduce), no overlap"
    rows = []
    for label, keys in published.MODELS.items():
        name = f"published.{keys.parameters.removesuffix('_parameters')}"
        measured = [f"published.{keys.images_per_s}", "published.horovod_batch"]
        if keys.gpus:
            measured.append(f"published.{keys.gpus}")
        numbers.derived(f"{name}.step_s", published_step, measured, "s",
                        "batch x GPUs / images per second")
        numbers.derived(f"{name}.per_byte", per_gradient_byte_of, [f"{name}.step_s",
                        f"published.{keys.parameters}"], "ns/byte", "step / gradient bytes")
        cells = []
        for alpha in ALPHAS:
            slug = alpha.removeprefix("assume.")
            numbers.derived(f"{name}.modelled.{slug}", functools.partial(published_efficiency,
                                                                         world),
                            [f"{name}.step_s", f"published.{keys.parameters}", alpha,
                             "published.horovod_beta"], "percent", no_overlap)
            cells.append(numbers.text(f"{name}.modelled.{slug}"))
        rows.append([label, numbers.text(f"{name}.step_s"), numbers.text(f"{name}.per_byte"),
                     numbers.text(f"published.{keys.efficiency}"), *cells])
    for model, sizes in layouts.items():
        name = f"published.ours.{model}"
        compute = f"sweep.{model}.single.w1.compute.median"
        numbers.derived(f"{name}.per_byte", functools.partial(per_gradient_byte, sum(sizes)),
                        [compute], "ns/byte", "compute / gradient bytes")
        cells = []
        for alpha in ALPHAS:
            slug = alpha.removeprefix("assume.")
            numbers.derived(f"{name}.modelled.{slug}",
                            functools.partial(flat_step_efficiency, sum(sizes), world),
                            [compute, alpha, "published.horovod_beta"], "percent", no_overlap)
            cells.append(numbers.text(f"{name}.modelled.{slug}"))
        rows.append([f"our {model.upper()} (one process here)", numbers.text(compute),
                     numbers.text(f"{name}.per_byte"), "—", *cells])
    return table(PUBLISHED_COLUMNS, rows)


def per_gradient_byte_of(step, parameters):
    """A published model's step per byte of its fp32 gradient."""
    return step / (4 * parameters)
