"""A node's activations for every row of a split: `mpitrain predict RUN --embeddings NODE` (an autoencoder's code).

    path, rows = predict_activations("runs/digits_autoencoder", comm, "code")   # RUN_DIR/embeddings-test.h5

NODE names what to read out (`node_of`):

- a graph model (`model.graph`): a node's name; its output after its activation;
- a `layers:` model: the index of an entry of `model.layers` as the run's config.yaml lists them (0: the first);
  that entry's output after its own `activation` (the expanded layer names of the checkpoint's layout, `03_relu`,
  are not accepted: a dense layer runs its activation fused, so its own output is never held apart).

A node that gives a sequence is refused: its rows have steps of any length, which one (rows, ...) array cannot
hold; a node after a global pool or an lstm's last state gives one vector per row.

The HDF5 file holds `embeddings` float32 (rows, *the node's shape), in the order `mpitrain predict` writes its
rows, and `label`, the dataset's labels as `predict` writes a class target's or a target's columns (not the
reconstruction's: a code is coloured by what its row is), with the provenance and `node` as attributes. The
forward pass stops at the node, in evaluation mode (dropout off, batch norm's running statistics).
"""
from __future__ import annotations

import numpy as np

from mpitrain.base.errors import MpitrainError
from mpitrain.base.files import write_hdf5
from mpitrain.rundir.directory import RunDir, check_output
from mpitrain.training.evaluation import batched_logits
from mpitrain.training.trained import Trained, checked_output


def node_of(model, model_config, node: str):
    """`Network.forward`'s `until` for the NODE a user names (see the module docstring): a graph's node name, or the
    index into a Sequential's layers of `model_config.layers[NODE]`'s last layer; an MpitrainError naming what there
    is otherwise."""
    if hasattr(model, "nodes"):
        names = [each.name for each in model.nodes]
        if node not in names:
            raise MpitrainError(f"--embeddings {node!r}: the model (model.graph) has no such node; expected one of "
                                f"{names}")
        index = names.index(node)
        _check_one_vector_per_row(model, model.first_layer[index] + len(model.nodes[index].layers) - 1, node)
        return node
    specs = model_config.layers
    if not node.isdigit() or int(node) >= len(specs):
        raise MpitrainError(f"--embeddings {node!r}: expected the index of an entry of the run's model.layers, 0 to "
                            f"{len(specs) - 1}")
    index = sum(1 + (spec.get("activation", "none") != "none") for spec in specs[:int(node) + 1]) - 1
    _check_one_vector_per_row(model, index, node)
    return index


def _check_one_vector_per_row(model, layer: int, node: str) -> None:
    """An MpitrainError when the model's layer `layer` (NODE's last) gives a sequence: rows of steps of any length,
    which no (rows, ...) array of embeddings holds."""
    if model.gives_sequence[layer]:
        raise MpitrainError(f"--embeddings {node!r}: the node gives a sequence (a vector per step, of any length); "
                            "expected a node of one vector per row (after a global pool or an lstm's last state)")


def predict_activations(run_dir: str, comm, node: str, split: str = "test", out: str | None = None,
                        checkpoint: str | None = None, batch_size: int | None = None,
                        allow_other_dataset: bool = False, overwrite: bool = False) -> tuple[str, int]:
    """Write node `node`'s activations for every row of `split` with a run's checkpoint (a collective; arguments as
    `mpitrain.training.trained.predict_run`'s; `out` default RUN_DIR/embeddings-SPLIT.h5, replaced on every call).
    Returns the path and the row count."""
    path, overwrite = checked_output(comm, out, overwrite, RunDir(run_dir).embeddings(split))
    trained = Trained(run_dir, comm, split, checkpoint, batch_size, allow_other_dataset)
    run = trained.run
    values, labels = [], []
    try:
        with comm.agreed_errors():
            until = node_of(run.model, run.config.model, node)
            for activations, batch_labels in batched_logits(run.model, trained.rows, trained.to_input,
                                                            trained.batch_size, until):
                values.append(run.backend.to_host(activations).astype(np.float32))
                labels.append(np.array(batch_labels))  # a copy: the batch is reused
    finally:
        run.reader.close()
    rows = sum(map(len, values))
    parts = comm.gather_obj((values, labels))
    with comm.agreed_errors():
        if comm.is_root:
            check_output(path, overwrite)  # again: something may have appeared there while the ranks worked
            embeddings, label = (np.concatenate([array for part in parts for array in part[i]] or [np.empty(0)])
                                 for i in range(2))

            def fill(h5):
                h5.create_dataset("embeddings", data=embeddings)
                h5.create_dataset("label", data=label)
                h5.attrs.update(trained.provenance())
                h5.attrs["node"] = node
            write_hdf5(path, fill)
    return path, sum(comm.allgather_obj(rows))
