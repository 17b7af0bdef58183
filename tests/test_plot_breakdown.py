"""plot_breakdown.py: the bars of time-breakdown-<model>.png add up to the step, with the overlap,
the hidden part and the spread over repeats where they apply."""
import pytest

from analysis.plot_breakdown import LAYERS, plot_time_breakdown
from tests.plot_documents import containers, grouped, strategy_runs, training_run

pytestmark = pytest.mark.rubric("design.numbers")

COMPUTE_LABEL, EXPOSED_LABEL, DATA_LABEL = (label for _, label, _ in LAYERS)


def test_breakdown_layers_add_up_to_the_median_step_and_a_single_process_has_no_exposed_layer():
    axis = plot_time_breakdown(grouped(strategy_runs()), "mlp").axes[0]
    labels = [label.get_text() for label in axis.get_yticklabels()]
    # one bar per configuration, the single process on top, each saying how many repeats it has
    assert labels[:2] == ["single, 1 process, 3 runs", "ddp-no-sync, 2 processes, 3 runs"]
    bars = containers(axis)
    compute = bars[COMPUTE_LABEL]
    exposed = bars[EXPOSED_LABEL]
    data = bars[DATA_LABEL]
    # median compute of the repeats (7, 9, 6 ms) is 7 ms; data 1 ms everywhere
    assert [bar.get_width() for bar in compute] == pytest.approx([7.0] * 6)
    assert [bar.get_width() for bar in data] == pytest.approx([1.0] * 6)
    # exposed only for the four runs that communicate: not on the single process or ddp-no-sync
    assert [round(bar.get_y() + bar.get_height() / 2) for bar in exposed] == [2, 3, 4, 5]
    assert [bar.get_width() for bar in exposed] == pytest.approx([3.0] * 4)
    # the stack ends at the median step of the repeats: 8 ms without communication, 11 ms with
    ends = [bar.get_x() + bar.get_width() for bar in data]
    assert ends == pytest.approx([8.0, 8.0, 11.0, 11.0, 11.0, 11.0])


def test_overlap_notes_are_hidden_over_busy_and_absent_without_communication():
    eight = training_run(world=8, hidden=0.001, exposed=0.004, busy=0.006)
    axis = plot_time_breakdown(grouped(strategy_runs() + [eight]), "mlp").axes[0]
    notes = [text.get_text() for text in axis.texts]
    # hidden 2 ms of busy 5 ms for the 2- and 4-process runs; 1 of 6 ms for the 8-process one
    assert notes == ["overlap 40%"] * 4 + ["overlap 17%"]
    # the hatched hidden part beside each bar is the hidden time itself
    hatched = containers(axis)["comm hidden (busy while computing)"]
    assert [bar.get_width() for bar in hatched] == pytest.approx([2.0] * 4 + [1.0])


def test_breakdown_error_bars_span_the_fastest_to_the_slowest_repeat():
    axis = plot_time_breakdown(grouped(strategy_runs()), "mlp").axes[0]
    error_bar = containers(axis)["step: fastest to slowest repeat"]
    _, _, (bar_lines,) = error_bar.lines
    segments = bar_lines.get_segments()
    # steps of the repeats: 11, 13 and 10 ms with communication; 8, 10 and 7 ms without
    assert [start[0] for start, _ in segments] == pytest.approx([7] * 2 + [10] * 4)
    assert [end[0] for _, end in segments] == pytest.approx([10] * 2 + [13] * 4)



def test_the_footnote_describes_how_timing_records_exposed_communication_now():
    figure = plot_time_breakdown(grouped(strategy_runs()), "mlp")
    (note,) = [text.get_text() for text in figure.texts if "timing.py" in text.get_text()]
    # timing.py ends compute at the last gradient for every mode: no estimate of DDP's exposed time
    assert "estimate" not in note and "last gradient" in note
    assert "exposed = busy - hidden" in note
