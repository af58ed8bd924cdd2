"""report.png draws only the panels that fit its runs (no empty sharing panels for an allreduce run, no bytes for
one rank), and where a step's time went per metrics window: compute, MPI not hidden, input wait."""
import numpy as np
import pytest

from mpitrain.rundir.report import PANELS, Run, _report_figure, report_panels, step_time_breakdown


def windows(sharing=False, bytes_sent=1000.0, n=4, steps=10, lr=lambda i: 0.1):
    return [{"kind": "window", "epoch": 0, "step": steps * (i + 1), "global_step": steps * (i + 1), "lr": lr(i),
             "samples": 64 * steps, "samples_per_s": 64 * steps / (0.01 * steps * (i + 1)),  # 10, 20, 30, 40 ms/step
             "bytes_sent_per_step": bytes_sent, "mpi_ms_per_step": 2.0 * (i + 1), "input_wait_ms_per_step": 1.0,
             "comm_ms_per_step": 3.0 * (i + 1), **({"tau": 1e-3, "sparsity": 1e-2} if sharing else {})}
            for i in range(n)]


def run(name, mode="allreduce", accuracy=0.5, **window_options):
    epochs = [{"kind": "epoch", "epoch": 0, "train_loss": 1.0, "test_loss": 1.1, "test_accuracy": accuracy}]
    return Run(name, mode, windows(sharing=mode == "sharing", **window_options), epochs, None, [])


@pytest.mark.parametrize("runs, panels", [
    ([run("a")], ["loss", "accuracy", "throughput", "step time", "bytes"]),
    ([run("one rank", bytes_sent=0.0)], ["loss", "accuracy", "throughput", "step time"]),
    ([run("regression", accuracy=None, bytes_sent=0.0)], ["loss", "throughput", "step time"]),
    ([run("a"), run("s", mode="sharing")], ["loss", "accuracy", "throughput", "step time", "bytes", "tau",
                                            "sparsity"]),
    ([run("a"), run("s", mode="sharing", lr=lambda i: 0.1 / (i + 1))],
     ["loss", "accuracy", "throughput", "step time", "bytes", "tau", "sparsity", "learning rate"]),
], ids=["allreduce", "one-rank", "regression", "with-sharing", "with-a-schedule"])
def test_only_the_panels_that_fit_the_runs_are_drawn(runs, panels):
    assert report_panels(runs) == panels
    figure = _report_figure(runs)
    assert [ax.get_title() for ax in figure.axes] == [PANELS[name][0] for name in panels]
    assert not [text for ax in figure.axes for text in ax.texts if "no sharing run" in text.get_text()]
    assert all(ax.lines or ax.collections for ax in figure.axes)  # no empty panel


def test_the_step_time_breakdown_adds_up_to_each_window_s_step_time():
    parts = step_time_breakdown(windows())
    np.testing.assert_allclose(parts["step"], [10.0, 20.0, 30.0, 40.0])
    np.testing.assert_allclose(parts["compute"] + parts["mpi"] + parts["input"], parts["step"])
    np.testing.assert_allclose(parts["compute"], [7.0, 15.0, 23.0, 31.0])
    np.testing.assert_allclose(parts["comm"], [3.0, 6.0, 9.0, 12.0])
    np.testing.assert_array_equal(parts["global_step"], [10, 20, 30, 40])
    figure = _report_figure([run("a")])
    panel = figure.axes[report_panels([run("a")]).index("step time")]
    stacked = [collection.get_paths()[0].vertices[:, 1].max() for collection in panel.collections]
    assert len(stacked) == 3 and max(stacked) == pytest.approx(40.0)  # compute, MPI, input wait reach the step time
