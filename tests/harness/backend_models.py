"""The models that check the GPU's path against the CPU's, each with its dataset: a conv net (conv, batch norm, both
poolings, dropout), the sequence and attention layers, the bag and token layers (empty bags among them), and a
recurrent net. tests/system/test_gpu.py trains them on cupy and numpy; tests/mpi/test_reference_paths.py on the
numba kernels and on the references cupy runs (mpitrain.testing.reference_paths), on the CPU."""
from __future__ import annotations

from mpitrain.testing.datasets import make_dataset
from mpitrain.testing.sequences import make_bag_dataset, make_sequence_dataset

CNN = {"layers": [{"type": "conv2d", "filters": 4, "kernel": 3, "padding": "same"}, {"type": "batchnorm"},
                  {"type": "relu"}, {"type": "maxpool2d", "pool": 2}, {"type": "avgpool2d", "pool": 2},
                  {"type": "flatten"}, {"type": "dense", "units": 12, "activation": "relu"},
                  {"type": "dropout", "rate": 0.2}, {"type": "dense", "units": 3}]}  # dropout: the same masks on both
# The layers of sequences and bags (docs/sequences.md, docs/tables.md), each on its dataset
SEQUENCE_MODELS = {
    "transformer": {"layers": [], "graph": [
        {"name": "d", "type": "dense", "input": "readings", "units": 8},
        {"name": "c", "type": "cls_token", "input": "d"},
        {"name": "p", "type": "positional", "input": "c"},
        {"name": "t", "type": "transformer", "input": "p", "heads": 2, "ff_units": 16, "rate": 0.1},
        {"name": "a", "type": "attention", "input": "t", "heads": 2, "causal": True},
        {"name": "n", "type": "layernorm", "input": "a"},
        {"name": "g", "type": "gelu_tanh", "input": "n"},
        {"name": "first", "type": "cls_pool", "input": "t"},
        {"name": "mean", "type": "global_avg_pool", "input": "g"},
        {"name": "j", "type": "concat", "inputs": ["first", "mean"]},
        {"name": "out", "type": "dense", "input": "j", "units": 4}]},
    "bags": {"layers": [], "graph": [
        {"name": "bag", "type": "embedding_bag", "input": "recent", "dim": 4, "mode": "mean"},
        {"name": "tokens", "type": "token_embedding", "input": "recent", "dim": 4},
        {"name": "over", "type": "attention", "input": "tokens", "heads": 2},
        {"name": "most", "type": "global_max_pool", "input": "over"},
        {"name": "j", "type": "concat", "inputs": ["bag", "most", "numeric"]},
        {"name": "h", "type": "dense", "input": "j", "units": 8, "activation": "silu"},
        {"name": "out", "type": "dense", "input": "h", "units": 2}]},
    "recurrent": {"layers": [{"type": "lstm", "units": 8, "return_sequences": True}, {"type": "gru", "units": 6},
                             {"type": "dense", "units": 4}]},
}


def write_model_data(name: str, path) -> None:
    """The dataset of model `name` ("cnn" or a SEQUENCE_MODELS name) into `path`."""
    if name == "cnn":
        make_dataset(path, n_train=320, shape=(1, 8, 8))
    elif name == "bags":
        make_bag_dataset(path, n_train=320, n_test=64, ids=50)  # empty bags among them
    else:
        make_sequence_dataset(path, n_train=320, n_test=64, lengths=(5, 30))
