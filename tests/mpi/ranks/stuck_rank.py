"""Under mpiexec -n 2: rank 1 stops making progress while rank 0 waits for it; the watchdog must abort."""
import time

from mpitrain.parallel.comm import Communicator
from mpitrain.training.watchdog import Watchdog

comm = Communicator()
with Watchdog(2.0 if comm.rank == 1 else 20.0, comm.rank, comm.abort, poll=0.2) as watchdog:
    watchdog.beat("the test's first step")
    if comm.rank == 1:
        time.sleep(60)  # stuck: no beat
    comm.barrier()
print("the job was not aborted")
