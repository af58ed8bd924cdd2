"""Under mpiexec: rank 0 prints, as JSON, every rank's [rank, host name, ranks on its node as MPI sees them]."""
import json
import socket

from mpi4py import MPI

world = MPI.COMM_WORLD
node_size = world.Split_type(MPI.COMM_TYPE_SHARED).Get_size()
ranks = world.gather([world.rank, socket.gethostname(), node_size])
if world.rank == 0:
    print(json.dumps(ranks))
