"""The metrics of a run as training gathers them: the time each collective took, and the time steps waited for their
batches (the file they go to: tests/unit/rundir/test_metrics_file.py)."""
import numpy as np

from mpitrain.parallel.backend import create_backend
from mpitrain.training.metrics import Traffic, Window, mean_ms_per_step


def test_each_collective_is_timed_once():
    """A clock that ticks one second per reading: every blocking call spends exactly one second inside MPI and
    communicating, so nested timing (allgatherv's own Allgather of sizes) would show as more."""
    from unittest import mock

    import numpy as np
    from mpi4py import MPI

    from mpitrain.parallel.comm import Communicator
    comm = Communicator(MPI.COMM_SELF)
    ticks = iter(range(100))
    with mock.patch("mpitrain.parallel.comm.time.perf_counter", lambda: float(next(ticks))):
        comm.allgatherv(np.arange(3, dtype=np.int32))  # the Allgather of sizes, then the Allgatherv
        assert (comm.mpi_seconds, comm.comm_seconds) == (2.0, 2.0)
        comm.allreduce_(np.ones(4, dtype=np.float32))
        assert (comm.mpi_seconds, comm.comm_seconds) == (3.0, 3.0)
        posted = [comm.iallreduce_(np.ones(4, dtype=np.float32))]  # posted at 6 (1 s inside MPI) ...
        comm.complete(posted)  # ... completed from 8 to 9 (1 s more inside MPI): 3 s from post to end
        assert (comm.mpi_seconds, comm.comm_seconds) == (5.0, 6.0)
        posted = [comm.iallreduce_(np.ones(4, dtype=np.float32))]  # posted at 10 (1 s) ...
        comm.complete(posted, last=np.ones(4, dtype=np.float32))  # ... the last bucket and the wait from 12 to 13
        assert (comm.mpi_seconds, comm.comm_seconds) == (7.0, 9.0)
        comm.complete([], last=np.ones(4, dtype=np.float32))  # a one-bucket cut: a blocking Allreduce, 14 to 15
        assert (comm.mpi_seconds, comm.comm_seconds) == (8.0, 10.0)


def test_the_time_steps_waited_for_their_batch_and_their_host_cpu_time_are_kept_apart_and_summed():
    window = Window()
    window.add(0, np.float32(1.0), np.int64(3), 4, 0.010, Traffic(), 0.002, 0.005)
    window.add(1, np.float32(2.0), np.int64(1), 4, 0.030, Traffic(), 0.004, 0.007)
    totals = window.totals(create_backend("numpy"))
    assert (totals.steps, totals.seconds, totals.input_seconds, totals.host_seconds) == (2, 0.040, 0.006, 0.012)
    assert ((totals + totals).input_seconds, (totals + totals).host_seconds) == (0.012, 0.024)
    assert mean_ms_per_step([0.006, 0.002], 2) == 2.0  # two ranks' 8 ms over 2 steps each


