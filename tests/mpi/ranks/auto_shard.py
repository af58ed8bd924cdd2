"""`shard: auto` on ranks that have little memory: `mpitrain.train` of CONFIG, each rank's memory
(`mpitrain.training.run.rank_memory_bytes`) set to MEMORY bytes on rank 0 and 11x that on rank 1 and so on, as nodes
of other sizes or other numbers of ranks would have it: the ranks must agree on one choice, rank 0's.

    mpiexec -n N python auto_shard.py CONFIG MEMORY
"""
import sys

import mpitrain
from mpitrain.training import run

comm = mpitrain.init(backend="numpy")
run.rank_memory_bytes = lambda ranks_on_node: int(sys.argv[2]) * (1 + 10 * comm.rank)
mpitrain.setup_logging(comm.rank)
mpitrain.train(mpitrain.load_config(sys.argv[1]), comm)
