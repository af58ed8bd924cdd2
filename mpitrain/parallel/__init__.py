"""What runs the ranks side by side: thread pools sized for the node (`threads`, imported before
numpy), the array backend and device of each rank (`backend`), the MPI communicator and its
collectives (`comm`), launch concerns (`launch`: the abort hook, srun checks), the
synchronizers that keep the replicas one model (`sync`) and the communication cost model
(`costmodel`). Only `comm` and `launch` import mpi4py."""
