"""Reports from real runs (2-rank allreduce and sharing), the confusion picture, and the benchmark tables rewrite."""
import json
import shutil

import pytest
from matplotlib.image import imread

from mpitrain.testing.launch import MPITRAIN, command, mpiexec
from mpitrain.testing.datasets import make_dataset, write_config
from mpitrain.cli import main
from mpitrain.rundir.report import FASHION_MNIST_CLASSES, REPORT_DPI, REPORT_SIZE, class_names

from mpitrain.testing.tables import HEADLINE_BEGIN, HEADLINE_END, main as rewrite_tables, markers  # noqa: E402
from mpitrain.testing.scaling_model import cost

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
    (lambda path: path.write_text(path.read_text()[:-20]), "is not valid JSON (truncated or corrupt?)"),
    (lambda path: path.write_text("".join(line for line in path.read_text().splitlines(keepends=True)
                                          if '"window"' in line)), "metrics.jsonl: no epoch record"),
], ids=["missing", "truncated", "no-epoch"])
def test_damaged_metrics_give_one_clear_error(runs, tmp_path, capsys, damage, message):
    run_dir = tmp_path / "run"
    shutil.copytree(runs / "dense", run_dir)
    damage(run_dir / "metrics.jsonl")
    assert main(["report", str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and str(run_dir / "metrics.jsonl") in err and message in err


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


def test_cost_model_uses_ring_bounds():
    dense = {"mode": "allreduce", "ranks": 2, "bytes_sent_per_step": 4000.0, "step_bytes_sent_per_step": 4000.0,
             "n_params": 1000, "compute_s_per_step": 1e-3}
    m = cost(dense, 64, bandwidth_gbps=100, latency_us=0)
    assert m["collectives_per_step"] == 1 and m["messages_per_step"] == 126
    assert m["wire_bytes_per_step"] == pytest.approx(2 * 63 / 64 * 4000)
    assert m["comm_s_per_step"] == pytest.approx(2 * 63 / 64 * 4000 * 8 / 100e9)
    sparse = {**dense, "mode": "sharing", "bytes_sent_per_step": 500.0, "step_bytes_sent_per_step": 100.0}
    m = cost(sparse, 1024, bandwidth_gbps=100, latency_us=1)
    assert m["wire_bytes_per_step"] == pytest.approx(1023 * 100 + 2 * 1023 / 1024 * 400)
    assert m["messages_per_step"] == pytest.approx((2 * 0.1 + 2) * 1023)
