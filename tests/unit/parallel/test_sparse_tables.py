"""mpitrain.parallel.sync.sparse: a table's touched rows travel as ids and values in one message of the gradient's
dtype; the ids are integers carried bit for bit (`id_bits`), so a row beyond float32's integers (2**24) arrives as
itself."""
import numpy as np

from mpitrain.nn.embedding import TableGrad
from mpitrain.parallel.sync.sparse import _message, _part, id_bits


def test_touched_ids_beyond_two_to_the_24_arrive_as_themselves():
    table = TableGrad("table", rows=2**24 + 8, dim=1)
    table.touched = np.array([3, 2**24 + 1, 2**24 + 7], np.int64)  # float32 would make 2**24 + 1 into 2**24
    grads = np.zeros(table.rows, np.float32)
    grads[table.touched] = [1.0, 2.0, 3.0]
    message = np.concatenate(_message(grads, table))
    assert message.dtype == np.float32 and len(message) == 6
    ids, values = _part(message, [3], [0], [table], 0)
    assert ids.tolist() == table.touched.tolist() and values[:, 0].tolist() == [1.0, 2.0, 3.0]
    assert id_bits(np.float32) == np.int32 and id_bits(np.float64) == np.int64
