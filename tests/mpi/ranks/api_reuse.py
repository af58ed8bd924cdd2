"""The Python API's parts used by two runs in one process: `mpitrain.train` with a fresh reader, model and `sharing`
synchronizer (run `fresh`, first in the process), then twice with one reader, model and synchronizer (runs `first`
and `second`, in other run directories). Rank 0 prints one JSON line {run: summary}; each run's final checkpoint
and metrics.jsonl stay in OUT/RUN for the test to compare.

    mpiexec -n 2 python api_reuse.py DATA OUT
"""
import json
import sys

import mpitrain

data, out = sys.argv[1], sys.argv[2]
comm = mpitrain.init(backend="numpy")


def parts():
    reader = mpitrain.DatasetReader(data, comm)
    model = mpitrain.Sequential([mpitrain.Dense(16, activation="relu"), mpitrain.Dense(reader.manifest.outputs)],
                                reader.manifest.feature_shape, xp=comm.backend.xp)
    sync = mpitrain.create_synchronizer(mpitrain.SyncConfig(mode="sharing", threshold=0.01), comm)
    return {"reader": reader, "model": model, "sync": sync}


def config(run: str):
    return mpitrain.Config(optimizer=mpitrain.OptimizerConfig(lr=0.05, momentum=0.9),
                           train=mpitrain.TrainConfig(epochs=2, batch_size=16, seed=1, log_every=5),
                           run_dir=f"{out}/{run}", report=False)


summaries = {"fresh": mpitrain.train(config("fresh"), comm, **parts())}
shared = parts()
for run in ("first", "second"):
    summaries[run] = mpitrain.train(config(run), comm, **shared)
if comm.is_root:
    print(json.dumps(summaries, default=str), flush=True)
