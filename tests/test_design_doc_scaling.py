"""§5's projections are built as the document says: the best bucket size is searched with one flat
all-reduce among the candidates, each gradient is ready when the traced backward says, α and β
carry bootstrap intervals, and the emulated network's runs are read in the results schema before
this one.

The build, the models and the cost model run in child processes (grading/launch.py run_alone), as in
tests/test_design_doc.py, whose synthetic results (tests/design_doc_results.py) this module shares.
"""

import pytest

from grading.launch import run_alone
from tests.design_doc_results import ALPHAS, backward_share, build_synthetic, numbers_of

pytestmark = pytest.mark.rubric("design.numbers")


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    """The SyntheticBuild of the synthetic results, made in a child."""
    return build_synthetic(tmp_path_factory)


def model_names():
    """{model: its trainable parameters' names in registration order}. Run in a child: the
    models are task code."""
    from runtime.models import build_model

    return {model: [name for name, parameter in build_model(model).named_parameters()
                    if parameter.requires_grad] for model in ("mlp", "cnn")}


def test_each_gradient_is_ready_when_the_traced_backward_accumulated_it(synthetic):
    numbers = numbers_of(synthetic.documents)
    for model, names in run_alone(model_names).items():
        # backward produces the last parameter's gradient first
        for index, name in enumerate(reversed(names)):
            share = numbers[f"readiness.{model}.{name}"]["value"]
            assert share == pytest.approx(backward_share(index, len(names))), name


def test_the_best_bucket_is_never_worse_than_one_flat_all_reduce(synthetic):
    numbers = numbers_of(synthetic.documents)
    # numbers.json keeps the numbers a reader sees: the projections the scenario table shows
    best = [name.removesuffix(".efficiency") for name in numbers
            if name.startswith("project.") and name.endswith(".efficiency")
            and ".flat." not in name
            and name.replace(".efficiency", ".flat.efficiency") in numbers]
    assert best, "no projection registered"
    for name in best:
        # flat is one of the candidates, so the best step is at most flat's
        flat = numbers[f"{name}.flat.efficiency"]["value"]
        assert numbers[f"{name}.efficiency"]["value"] >= flat - 1e-12, name
        if numbers[f"{name}.bucket"]["value"] == "flat":
            assert numbers[f"{name}.efficiency"]["value"] == pytest.approx(flat), name
    # the table shows flat beside the best
    assert numbers["project.mlp.25g.n64.flat.efficiency"]["text"] in synthetic.shown[
        "table.scenarios"]


def test_alpha_and_beta_carry_bootstrap_intervals_that_close_on_exact_data(synthetic):
    numbers = numbers_of(synthetic.documents)
    # the synthetic benchmark is the α-β model exactly, per world size: every resample fits the
    # same α, so the interval is the point
    for world, alpha in ALPHAS.items():
        for end in ("low", "high"):
            value = numbers[f"fit.gloo.w{world}.alpha_s.{end}"]["value"]
            assert value == pytest.approx(alpha, rel=1e-6), (world, end)
    # one fit over every world size cannot follow α's growth: its interval is not a point
    low = numbers["fit.gloo.alpha_s.low"]["value"]
    high = numbers["fit.gloo.alpha_s.high"]["value"]
    assert low < high
    # the projections quote the interval of the fit they use
    assert numbers["fit.projection.alpha_s.high"]["value"] == pytest.approx(ALPHAS[2], rel=1e-6)
