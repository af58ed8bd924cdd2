"""Under mpiexec -n 2: rank 1 raises while rank 0 waits in a collective; the hook must abort the job."""
from mpitrain.parallel.comm import Communicator
from mpitrain.parallel.launch import install_abort_hook

install_abort_hook()
comm = Communicator()
if comm.rank == 1:
    raise RuntimeError("deliberate failure on rank 1")
comm.barrier()
print("rank 0 got past the barrier: the job did not abort")
