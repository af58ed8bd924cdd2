"""Several runs in one job, as a Python script would train them: `mpitrain.train` of each config file in turn (with
the `--set KEY=VALUE` overrides that follow it, as `mpitrain train` takes them), each in its own run directory, on
every rank, logging as the command line does. One launch and one start-up for scenarios that differ only in their
config (tests/mpi/test_mpi.py's sync modes, test_allocations.py's configs); each run's files are the test's to read.

    mpiexec -n N python train_each.py CONFIG [--set KEY=VALUE ...] [CONFIG [--set ...] ...]
"""
import sys

import mpitrain

runs = []  # [(config file, [overrides])]
arguments = iter(sys.argv[1:])
for argument in arguments:
    if argument == "--set":
        runs[-1][1].append(next(arguments))
    else:
        runs.append((argument, []))

comm = mpitrain.init(backend="numpy")
mpitrain.setup_logging(comm.rank)
for path, overrides in runs:
    mpitrain.train(mpitrain.load_config(path, overrides), comm)
