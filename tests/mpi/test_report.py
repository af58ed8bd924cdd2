"""Reports from real runs (2-rank allreduce and sharing), the confusion picture, and the benchmark tables rewrite."""
import json
import shutil

import pytest
from matplotlib.image import imread

from mpitrain.cli import main
from mpitrain.parallel.costmodel import Network, allgather_exchange, allreduce_bytes, recursive_exchange
from mpitrain.parallel.sync.exchange import choose_exchange
from mpitrain.rundir.report import FASHION_MNIST_CLASSES, REPORT_DPI, REPORT_SIZE, class_names
from mpitrain.testing.datasets import make_dataset, write_config
from mpitrain.testing.launch import MPITRAIN, command, mpiexec
from mpitrain.testing.scaling_model import cost
from mpitrain.testing.tables import HEADLINE_BEGIN, HEADLINE_END, markers  # noqa: E402
from mpitrain.testing.tables import main as rewrite_tables

REPORT_PIXELS = (REPORT_SIZE[1] * REPORT_DPI, REPORT_SIZE[0] * REPORT_DPI)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two finished 2-rank runs on one small dataset: `allreduce` (report on) and `sharing` (report off)."""
    root = tmp_path_factory.mktemp("runs")
    make_dataset(root / "data")
    for name, sync, report in (("dense", {"mode": "allreduce"}, True), ("sparse", {"mode": "sharing"}, False)):
        config = write_config(root / f"{name}.yaml", root / "data", sync=sync, report=report,
                              run_dir=str(root / name), train={"epochs": 2, "log_every": 5})
        result = mpiexec(2, MPITRAIN, "train", config)
        assert result.returncode == 0, result.stderr
    return root


def test_report_overlays_runs(runs):
    assert imread(runs / "dense" / "report.png").shape[:2] == REPORT_PIXELS  # written by training
    assert not (runs / "sparse" / "report.png").exists()  # report: false
    result = command(MPITRAIN, "report", runs / "dense", runs / "sparse", "--out", runs / "both", timeout=60)
    assert result.returncode == 0, result.stderr
    assert imread(runs / "both" / "report.png").shape[:2] == REPORT_PIXELS
    page = (runs / "both" / "report.html").read_text()
    assert "dense (allreduce)" in page and "sparse (sharing)" in page and "data:image/png;base64," in page


def test_eval_writes_the_confusion_picture(runs):
    result = mpiexec(2, MPITRAIN, "eval", runs / "dense", "--split", "test", timeout=60)
    assert result.returncode == 0, result.stderr
    assert imread(runs / "dense" / "confusion-test.png").ndim == 3
    assert class_names("synthetic", 3) == ["0", "1", "2"]
    assert class_names("idx:/usr/share/datasets/fashion-mnist", 10) == list(FASHION_MNIST_CLASSES)


@pytest.mark.parametrize("damage, message", [
    (lambda path: path.unlink(), "metrics.jsonl: cannot read"),
    (lambda path: path.write_text("".join(line[:20] + "\n" if number == 1 else line for number, line in enumerate(
        path.read_text().splitlines(keepends=True)))), "line 2 is not valid JSON (truncated or corrupt?)"),
    (lambda path: path.write_text("".join(line for line in path.read_text().splitlines(keepends=True)
                                          if '"window"' in line)), "metrics.jsonl: no epoch record"),
], ids=["missing", "corrupt", "no-epoch"])
def test_damaged_metrics_give_one_clear_error(runs, tmp_path, capsys, damage, message):
    run_dir = tmp_path / "run"
    shutil.copytree(runs / "dense", run_dir)
    damage(run_dir / "metrics.jsonl")
    assert main(["report", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and str(run_dir / "metrics.jsonl") in err and message in err


def test_a_last_line_cut_short_by_a_killed_job_is_left_out_with_a_warning(runs, tmp_path, caplog):
    """A job killed while writing a record leaves its last line without its end: the report and TensorBoard's events
    are drawn from the records before it (as the next `train` drops it), saying so."""
    run_dir = tmp_path / "run"
    shutil.copytree(runs / "dense", run_dir)
    (run_dir / "report.png").unlink()
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write('{"kind": "window", "epoch": 2, "st')
    for extra in ([], ["--tensorboard"]):
        caplog.clear()
        assert main(["report", str(run_dir), *extra]) == 0
        assert "metrics.jsonl: its last line is cut short (a job that ended while writing it): left out" in caplog.text
    assert imread(run_dir / "report.png").shape[:2] == REPORT_PIXELS


def test_bench_tables_rewrite_only_measured_sections_and_the_headline(tmp_path):
    """docs/benchmarks.md: a benchmark's section is rewritten from its results, another's is kept as it was;
    README.md: only the headline between its markers changes, to rows copied from the page."""
    (begin, end), (other_begin, other_end) = markers("throughput"), markers("dbn")
    page, readme = tmp_path / "benchmarks.md", tmp_path / "README.md"
    page.write_text(f"# Benchmarks\n{begin}\nold table\n{end}\n{other_begin}\nthe DBN's last figures\n{other_end}\ntail\n")
    before, after = "# Title\n\nintro\n", "\n## After\n\ntail text\n"
    readme.write_text(f"{before}{HEADLINE_BEGIN}\nold headline\n{HEADLINE_END}{after}")
    results = tmp_path / "results"
    results.mkdir()
    machine = {"date": "2026-11-22 22:50 UTC", "arch": "x86_64", "cores": 2, "versions": {"python": "3.11.2"}}
    (results / "throughput.json").write_text(json.dumps({"rows": [], "machine": machine}))
    (results / "throughput.md").write_text("| model | ranks | sync | samples/s |\n| --- | ---: | --- | ---: |\n"
                                           "| MLP | 2 | allreduce (overlapped) | 123 |\n"
                                           "| MLP | 2 | allreduce (blocking) | 111 |\n"
                                           "| MLP | 1 | allreduce (overlapped) | 99 |\n")
    for _ in range(2):  # idempotent
        rewrite_tables(["--results", str(results), "--page", str(page), "--readme", str(readme)])
        text = page.read_text()
        assert "old table" not in text and "| MLP | 2 | allreduce (overlapped) | 123 |" in text
        assert "x86_64, 2 cores" in text
        assert f"{other_begin}\nthe DBN's last figures\n{other_end}" in text and text.endswith("tail\n")
        headline = readme.read_text()
        assert headline.startswith(before + HEADLINE_BEGIN) and headline.endswith(HEADLINE_END + after)
        assert "old headline" not in headline and "| MLP | 2 | allreduce (overlapped) | 123 |" in headline
        assert "| MLP | 1 | allreduce (overlapped) | 99 |" not in headline  # the headline keeps the 2-rank rows
        assert "(blocking)" not in headline  # and of allreduce the default, overlapped
    (results / "throughput.json").unlink()
    with pytest.raises(SystemExit, match="no results"):
        rewrite_tables(["--results", str(results), "--page", str(page), "--readme", str(readme)])


def test_the_scaling_benchmark_models_with_the_cost_model_of_record():
    """benchmarks/scaling.py's rows through mpitrain.parallel.costmodel: Allreduces as MPICH runs them, and sharing's
    step by the exchange auto picks at N ranks, its epoch ends' Allreduces beside."""
    network = Network.of(latency_us=1.0, gbps=100.0)
    dense = {"mode": "allreduce", "ranks": 2, "bytes_sent_per_step": 4000.0, "step_bytes_sent_per_step": 4000.0,
             "n_params": 1000, "compute_s_per_step": 1e-3}
    m = cost(dense, 64, network)
    assert m["exchange"] == "allreduce" and m["allreduces_per_step"] == 1 and m["messages_per_step"] == 12
    assert m["comm_s_per_step"] == network.allreduce(4000, 64) and m["wire_bytes_per_step"] == 2 * 63 / 64 * 4000
    sparse = {**dense, "mode": "sharing", "bytes_sent_per_step": 508.0, "step_bytes_sent_per_step": 108.0}
    for ranks, exchange in ((4, "allgather"), (1024, "recursive")):
        m = cost(sparse, ranks, network)  # messages of 100 bytes, 0.1 epoch-end Allreduce per step
        assert m["exchange"] == exchange == choose_exchange("auto", network, [25] * ranks, 1000, 4)
        modelled = (allgather_exchange if exchange == "allgather" else
                    lambda on, sizes: recursive_exchange(on, sizes, 1000))(network, [100] * ranks)
        assert m["comm_s_per_step"] == pytest.approx(modelled[0] + 0.1 * network.allreduce(4000, ranks))
        assert m["wire_bytes_per_step"] == pytest.approx(modelled[1] + 0.1 * allreduce_bytes(4000, ranks))
    assert cost(sparse, 1024, network)["messages_per_step"] == pytest.approx(10 + 20 + 0.1 * 20)  # sizes, rounds
