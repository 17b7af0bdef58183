"""§5's projections are built as the document says: the best bucket size is searched with one flat
all-reduce among the candidates, each gradient is ready when the traced backward says, α and β
carry bootstrap intervals, Horovod's models are set against an RDMA α as well as a TCP one, the
emulated network's runs are read in the results schema before this one, and the projection figure
draws every link with the runs measured on it.

The build, the models and the cost model run in child processes (tests/harness.py run_alone), as in
tests/test_design_doc.py, whose synthetic results (tests/design_doc_results.py) this module shares.
"""

import pytest

from tests.design_doc_results import ALPHAS, backward_share, build_synthetic, numbers_of
from tests.harness import run_alone

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


def test_horovods_models_are_modelled_with_a_tcp_and_an_rdma_alpha(synthetic):
    numbers = numbers_of(synthetic.documents)
    # Inception V3: one P100's step of 64 images at 142 images/s, 4 bytes per parameter, one flat
    # ring all-reduce over 512 GPUs on 25 Gbit/s links, worked here by hand
    step = 64 / 142
    nbytes = 4 * 23_851_784
    world = 512
    for alpha, name in ((25e-6, "alpha_s"), (5e-6, "rdma_alpha_s")):
        comm = 2 * (world - 1) * alpha + 2 * (world - 1) / world * nbytes * 8 / 25e9
        modelled = numbers[f"published.inception_v3.modelled.{name}"]
        assert modelled["value"] == pytest.approx(step / (step + comm)), name
    assert numbers["published.inception_v3.modelled.rdma_alpha_s"]["text"] == "87.2%"
    # ResNet-101 is in the table, with its published efficiency
    table = synthetic.shown["table.published"]
    row = next(line for line in table.splitlines() if line.startswith("| ResNet-101 |"))
    assert numbers["published.horovod_resnet101_efficiency"]["text"] in row


def projection_figure(folder):
    """The gids of what projection.png draws from `folder`. Run in a child: the projections rest
    on the cost model and the models."""
    from analysis.plot_projection import plot_projection, projection_inputs

    figure = plot_projection(projection_inputs(folder))
    return [[artist.get_gid() for artist in axis.get_children() if artist.get_gid()]
            for axis in figure.axes]


def test_the_projection_figure_draws_every_link_and_the_runs_measured_on_the_emulated_one(
        synthetic):
    panels = projection_figure_once(synthetic.folder)
    assert len(panels) == 2  # the MLP and the CNN
    for gids in panels:
        for link in ("loopback", "1g", "10g", "25g", "100g"):
            assert f"{link} ring" in gids and f"{link} halving-doubling" in gids, link
        # the fitted links carry their bootstrap band, the assumed ones none
        assert "loopback band" in gids and "1g band" in gids and "10g band" not in gids
        # the emulated runs at 2 nodes x 1 and x 2, measured and modelled at their own compute
        for world in (2, 4):
            for series in ("manual flat", "manual bucketed", "ddp"):
                assert f"measured 1g {series} {world}" in gids
                assert f"modelled 1g {series} {world}" in gids
        # this machine's sweep only at two ranks, where each rank has a core
        assert "measured loopback manual flat 2" in gids
        assert not any(gid.startswith("measured loopback") and gid.endswith(" 4")
                       for gid in gids)


FIGURES = {}


def projection_figure_once(folder):
    """projection_figure(folder), drawn once per folder."""
    if folder not in FIGURES:
        FIGURES[folder] = run_alone(projection_figure, folder)
    return FIGURES[folder]
