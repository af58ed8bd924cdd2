"""metrics.jsonl on resume: the records written after the checkpoint a run resumes from are dropped."""
import json
from types import SimpleNamespace

from mpitrain.metrics import MetricsLog


def test_resume_drops_records_past_the_checkpoint_and_keeps_other_kinds(tmp_path):
    log = MetricsLog(str(tmp_path), SimpleNamespace(is_root=True), steps_per_epoch=10, epochs=5)
    for epoch in range(3):
        for step in (5, 10):
            log.write({"kind": "window", "epoch": epoch, "step": step, "global_step": epoch * 10 + step})
        log.write({"kind": "epoch", "epoch": epoch})
    log.write({"kind": "pretrain", "layer": 0})
    log.resume_at(2, 0)  # the checkpoint after epoch 2 was never written: epoch 2 runs again
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["global_step"] for r in records if r["kind"] == "window"] == [5, 10, 15, 20]
    assert [r["epoch"] for r in records if r["kind"] == "epoch"] == [0, 1]
    assert [r["kind"] for r in records].count("pretrain") == 1
    log.resume_at(1, 5)  # mid-epoch checkpoint: step 5 of epoch 1 is kept, later ones go
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["global_step"] for r in records if r["kind"] == "window"] == [5, 10, 15]
    assert [r["epoch"] for r in records if r["kind"] == "epoch"] == [0]
