"""Several runs in one job, as a Python script would train them: `mpitrain.train` of each config file in turn, each
in its own run directory, on every rank. One launch and one start-up for scenarios that differ only in their config
(tests/mpi/test_mpi.py's sync modes); each run's summary.json and metrics.jsonl are the test's to read.

    mpiexec -n N python train_each.py CONFIG...
"""
import sys

import mpitrain

comm = mpitrain.init(backend="numpy")
for path in sys.argv[1:]:
    mpitrain.train(mpitrain.load_config(path), comm)
