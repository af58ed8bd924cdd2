"""TensorBoard event files beside metrics.jsonl (`pip install 'mpitrain[tensorboard]'`).

    tensorboard --logdir runs/              # every run directory is a run; a study: --logdir STUDY/trials
    mpitrain report RUN_DIR --tensorboard   # a finished run's events, written again from its metrics.jsonl

metrics.jsonl stays the source of truth: the events hold the same numbers, record by record (`scalars`).
With the `tensorboard` package installed, rank 0 writes them as training goes (`EventWriter`, from
`MetricsLog`); a run resumed from a checkpoint marks the first step it trains again as TensorBoard's purge step,
so the events of steps the previous job trained past its checkpoint are hidden, as metrics.jsonl drops their
records. A study's trial also records its parameters and objective as TensorBoard hyperparameters (the HPARAMS
tab).

The events are written with the `tensorboard` package's own event-file writer and protocol buffers, not
tensorboardX: importing tensorboardX imports PyTorch whenever it is installed (seconds and hundreds of MB on
every rank 0 of every run), and tensorboard's writer needs neither PyTorch nor TensorFlow.
"""
from __future__ import annotations

import glob
import importlib
import importlib.util
import os
import time

from mpitrain.rundir.directory import EVENTS_GLOB

WINDOW_SCALARS = {"loss": "train/loss", "accuracy": "train/accuracy", "samples_per_s": "speed/samples_per_s",
                  "mpi_ms_per_step": "time/mpi_ms_per_step", "comm_ms_per_step": "time/comm_ms_per_step",
                  "input_wait_ms_per_step": "time/input_wait_ms_per_step",
                  "bytes_sent_per_step": "traffic/bytes_sent_per_step", "lr": "train/lr",
                  "sparsity": "sharing/sparsity", "tau": "sharing/threshold"}
EPOCH_SCALARS = {"train_loss": "epoch/train_loss", "test_accuracy": "epoch/test_accuracy",
                 "test_loss": "epoch/test_loss"}


def available() -> bool:
    """Whether the `tensorboard` package is installed (the `tensorboard` extra), without importing it."""
    return importlib.util.find_spec("tensorboard") is not None


def scalars(record: dict, steps_per_epoch: int) -> list[tuple[str, float, int]]:
    """(tag, value, step) of a metrics.jsonl record: a window's at its global step, an epoch's at the global
    step of its end (so epoch and window curves share the x axis); numbers only (regression has no accuracy)."""
    if record.get("kind") == "window":
        tags, step = WINDOW_SCALARS, record["global_step"]
    elif record.get("kind") == "epoch":
        tags, step = EPOCH_SCALARS, (record["epoch"] + 1) * steps_per_epoch
    else:
        return []
    return [(tag, float(record[key]), step) for key, tag in tags.items()
            if isinstance(record.get(key), (int, float)) and not isinstance(record.get(key), bool)]


class EventWriter:
    """Rank 0's event file in a run directory; `purge_step` > 0 hides earlier jobs' events from that step on."""

    def __init__(self, run_dir: str, steps_per_epoch: int, purge_step: int = 0):
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
        self.steps_per_epoch = steps_per_epoch
        self.writer = EventFileWriter(run_dir)
        if purge_step:
            self._add(step=purge_step, session_log=_proto("event_pb2").SessionLog(status=1))  # START

    def _add(self, **fields) -> None:
        self.writer.add_event(_proto("event_pb2").Event(wall_time=time.time(), **fields))

    def write(self, record: dict) -> None:
        summary_pb2 = _proto("summary_pb2")
        for tag, value, step in scalars(record, self.steps_per_epoch):
            self._add(step=step, summary=summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag,
                                                                                             simple_value=value)]))
        self.writer.flush()

    def hparams(self, params: dict, metrics: dict) -> None:
        """A study trial's parameters and results (`{"hparam/validation.accuracy": 0.93}`) for TensorBoard's
        HPARAMS tab: the hparams plugin's experiment, session start and session end, then the metrics as scalars."""
        from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2
        summary_pb2 = _proto("summary_pb2")
        start = plugin_data_pb2.SessionStartInfo()
        infos = []
        for key, value in params.items():
            kind = "STRING" if isinstance(value, str) else "BOOL" if isinstance(value, bool) else "FLOAT64"
            field = {"STRING": "string_value", "BOOL": "bool_value", "FLOAT64": "number_value"}[kind]
            setattr(start.hparams[key], field, value if kind != "FLOAT64" else float(value))
            infos.append(api_pb2.HParamInfo(name=key, type=api_pb2.DataType.Value(f"DATA_TYPE_{kind}")))
        experiment = api_pb2.Experiment(hparam_infos=infos,
                                        metric_infos=[api_pb2.MetricInfo(name=api_pb2.MetricName(tag=tag))
                                                      for tag in metrics])
        end = plugin_data_pb2.SessionEndInfo(status=api_pb2.Status.Value("STATUS_SUCCESS"))
        for tag, data in (("experiment", plugin_data_pb2.HParamsPluginData(experiment=experiment)),
                          ("session_start_info", plugin_data_pb2.HParamsPluginData(session_start_info=start)),
                          ("session_end_info", plugin_data_pb2.HParamsPluginData(session_end_info=end))):
            metadata = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(
                plugin_name="hparams", content=data.SerializeToString()))
            self._add(step=0, summary=summary_pb2.Summary(value=[summary_pb2.Summary.Value(
                tag=f"_hparams_/{tag}", metadata=metadata)]))
        for tag, value in metrics.items():
            self._add(step=0, summary=summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag,
                                                                                          simple_value=value)]))
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def _proto(name: str):
    """tensorboard's copy of a TensorFlow protocol buffer module (event_pb2, summary_pb2)."""
    return importlib.import_module(f"tensorboard.compat.proto.{name}")


def write_events(run_dir: str) -> str:
    """Write a run's events again from its metrics.jsonl (its earlier event files removed); the run directory."""
    from mpitrain.base.errors import MpitrainError
    from mpitrain.rundir.directory import RunDir
    from mpitrain.rundir.metrics_file import read_records

    if not available():
        raise MpitrainError("TensorBoard event files need the tensorboard package: pip install 'mpitrain[tensorboard]'")
    path = RunDir(run_dir).metrics
    if not os.path.exists(path):
        raise MpitrainError(f"{run_dir}: no metrics.jsonl; expected a run directory written by `mpitrain train`")
    records = read_records(path)
    windows = [r for r in records if r.get("kind") == "window"]
    steps_per_epoch = _steps_per_epoch(windows)
    for old in glob.glob(os.path.join(run_dir, EVENTS_GLOB)):
        os.remove(old)
    writer = EventWriter(run_dir, steps_per_epoch)
    for record in records:
        writer.write(record)
    writer.close()
    return run_dir


def _steps_per_epoch(windows: list[dict]) -> int:
    """A run's steps per epoch from its window records (global_step = epoch x steps per epoch + step): from a
    window after the first epoch, else the first epoch's last window, which ends at its last step."""
    later = [w for w in windows if w["epoch"] > 0]
    if later:
        return (later[0]["global_step"] - later[0]["step"]) // later[0]["epoch"]
    return max((w["step"] for w in windows), default=1)
