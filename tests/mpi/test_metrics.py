"""The metrics of a real 2-rank run: the time steps waited for their batches, and their host CPU time."""
import json

from mpitrain.testing.datasets import make_dataset, write_config
from mpitrain.testing.launch import MPITRAIN, mpiexec


def test_without_prefetch_every_step_waits_for_its_batch_and_the_metrics_say_so_beside_the_host_cpu_time(tmp_path):
    """data.prefetch: false makes each batch between the steps, in the training thread: that time is the input wait,
    in every window record and the summary, and is a part of the step time."""
    make_dataset(tmp_path / "data", n_train=480)
    for prefetch in (False, True):
        run_dir = tmp_path / f"run-{prefetch}"
        config = write_config(tmp_path / f"{prefetch}.yaml", tmp_path / "data", run_dir=str(run_dir),
                              data={"prefetch": prefetch})
        result = mpiexec(2, MPITRAIN, "train", config)
        assert result.returncode == 0, result.stderr
        s = json.loads((run_dir / "summary.json").read_text())
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        windows = [r for r in records if r["kind"] == "window"]
        assert windows and all(0 <= w["input_wait_ms_per_step"] for w in windows)
        assert 0 <= s["input_wait_ms_per_step"] < 1e3 * s["wall_s"] / s["steps_per_epoch"]
        # the training thread's CPU time in the steps: some, and no more than the steps' wall-clock time
        assert all(0 < w["host_cpu_ms_per_step"] for w in windows)
        assert 0 < s["host_cpu_ms_per_step"] < 1e3 * s["wall_s"] / s["steps_per_epoch"]
        if not prefetch:
            assert s["input_wait_ms_per_step"] > 0 and all(w["input_wait_ms_per_step"] > 0 for w in windows)

