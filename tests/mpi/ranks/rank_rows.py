"""Under mpiexec -n N: ranks read disjoint rows that together cover the split (less the remainder)."""
import sys

import numpy as np

from mpitrain.parallel.comm import Communicator
from mpitrain.data.reader import load_rank_rows, read_rows
from mpitrain.data.shards import read_manifest

dataset = sys.argv[1]
comm = Communicator()
manifest = read_manifest(dataset)
n = manifest.rows("train")
mine = load_rank_rows(dataset, manifest, "train", comm.rank, comm.size, training=True)
gathered = comm.gather_obj((mine.rows, mine.x, mine.y))
if comm.is_root:
    everything = read_rows(dataset, manifest, "train", range(n), True)
    ranges = [g[0] for g in gathered]
    covered = [i for r in ranges for i in r]
    assert len(covered) == len(set(covered)) == n - n % comm.size, ranges
    assert covered == list(range(n - n % comm.size))
    for rows, x, y in gathered:
        np.testing.assert_array_equal(x, everything.x[rows.start:rows.stop])
        np.testing.assert_array_equal(y, everything.y[rows.start:rows.stop])
    print("OK", comm.size, [len(r) for r in ranges])
comm.barrier()
