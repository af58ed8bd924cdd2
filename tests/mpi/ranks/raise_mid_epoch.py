"""`mpitrain train CONFIG` with rank RANK raising in its STEP-th training step (a fault injected from outside)."""
import sys

from mpi4py import MPI

from mpitrain.cli import main
from mpitrain.nn.model import Sequential

config, failing_rank, failing_step = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
train_batch = Sequential.train_batch
steps = 0


def train_batch_that_fails(self, x, y, **kwargs):
    global steps
    steps += 1
    if MPI.COMM_WORLD.Get_rank() == failing_rank and steps == failing_step:
        raise RuntimeError(f"injected fault at step {steps}")
    return train_batch(self, x, y, **kwargs)


Sequential.train_batch = train_batch_that_fails
sys.exit(main(["train", config]))
