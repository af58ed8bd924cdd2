"""PyTorch DDP (gloo, CPU, 1 thread per rank) on benchmarks/embeddings.py's table model, with a sparse or dense nn.Embedding.

The twin of an mpitrain run of the same config: per categorical column an `nn.Embedding` of its
ids (rows normal with standard deviation 1/sqrt(dim), as mpitrain's), flattened and joined to
the numeric columns, a dense layer with ReLU, a dense layer of 1 (Xavier weights, zero biases),
BCEWithLogitsLoss (mpitrain's `binary_cross_entropy`), plain SGD at the config's learning rate.
The shape comes from the config's `model.graph` (benchmarks/embeddings.py's: embedding, flatten,
concat, dense, dense) and the dataset's column groups; each rank trains on the rows, epoch order
and batches of an mpitrain rank (`torch_ddp.rank_batches`).

`--sparse`: `nn.Embedding(sparse=True)`, whose gradient is a sparse tensor of the batch's rows; DDP
hands it to gloo, which coalesces it (one entry per distinct id) and allgathers its int64 indices
and float32 values, and `torch.optim.SGD` (no momentum) updates only those rows. Without it the
tables' gradients are dense and allreduced whole, and SGD passes over every row.

The bytes are computed, not measured (gloo counts nothing): per step and rank, what the rank hands
to gloo, as mpitrain counts its own (each Allreduce's buffer once, each Allgatherv's own message
once): dense, every gradient's bytes; sparse, the dense layers' gradients plus, per table, the
distinct ids of the rank's batch x (8 bytes of index + 4 x dim bytes of values); gloo's few
dozen bytes of sizes per sparse tensor are left out.

Prints one JSON line: samples/s over the steps after the first `--warmup-steps` (all ranks; each
rank's time of those steps, the slowest counts), the test split's mean log loss, and bytes per
step per rank (mean over the ranks, least and most).

    python benchmarks/torch_embeddings.py --config RUN.yaml --ranks 2 --sparse --warmup-steps 50
"""
from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np
import torch
import torch.distributed as dist
from torch_ddp import rank_batches, rank_reader, spawn_ranks

from mpitrain.config.sections import load_config

GRAPH_TYPES = ["embedding", "flatten", "concat", "dense", "dense"]
EVAL_BATCH = 10_000


class TableModel(torch.nn.Module):
    """Embeddings of each categorical column, flattened, joined to the numbers; dense + ReLU; dense."""

    def __init__(self, ids: tuple[int, ...], dim: int, numeric: int, hidden: int, sparse: bool):
        super().__init__()
        self.tables = torch.nn.ModuleList(torch.nn.Embedding(n, dim, sparse=sparse) for n in ids)
        self.hidden = torch.nn.Linear(len(ids) * dim + numeric, hidden)
        self.out = torch.nn.Linear(hidden, 1)
        for table in self.tables:
            torch.nn.init.normal_(table.weight, 0.0, 1.0 / math.sqrt(dim))
        for layer in (self.hidden, self.out):
            torch.nn.init.xavier_uniform_(layer.weight)
            torch.nn.init.zeros_(layer.bias)

    def forward(self, numbers, ids):
        joined = torch.cat([table(ids[:, j]) for j, table in enumerate(self.tables)] + [numbers], dim=1)
        return self.out(torch.relu(self.hidden(joined)))


def model_shape(config) -> tuple[int, int]:
    """(embedding dim, hidden units) of the config's graph, which must be benchmarks/embeddings.py's."""
    graph = config.model.graph
    types = [node["type"] for node in graph]
    if types != GRAPH_TYPES or not isinstance(graph[0]["dim"], int) or graph[-1]["units"] != 1:
        raise SystemExit(f"{[node.get('name') for node in graph]}: expected the graph of benchmarks/embeddings.py "
                         f"({' -> '.join(GRAPH_TYPES)}, one embedding dim, 1 output)")
    return graph[0]["dim"], graph[3]["units"]


def worker(rank: int, args, init_file: str, results) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=args.ranks)
    config = load_config(args.config)
    dim, hidden = model_shape(config)
    reader, batches = rank_batches(config, rank, args.ranks)
    groups = reader.manifest.input_groups
    numeric, categorical = groups["numeric"], groups["categorical"]
    torch.manual_seed(config.train.seed)
    model = TableModel(categorical.ids, dim, numeric.shape[0], hidden, args.sparse)
    dense_bytes = 4 * sum(p.numel() for name, p in model.named_parameters() if not name.startswith("tables."))
    model = torch.nn.parallel.DistributedDataParallel(model)  # broadcasts rank 0's parameters
    optimizer = torch.optim.SGD(model.parameters(), lr=config.optimizer.lr)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    seconds, samples, sent = 0.0, 0, []
    tick = time.perf_counter()
    for step, (x, y) in enumerate(batches.epoch(0)):
        counted = step >= args.warmup_steps
        ids = torch.from_numpy(x.columns["categorical"]).long()  # the reader's batch: numbers and int32 ids
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(torch.from_numpy(x.x), ids), torch.from_numpy(y))
        loss.backward()
        optimizer.step()
        now = time.perf_counter()
        seconds += (now - tick) * counted
        samples += len(y) * counted
        if counted:  # outside the timed part
            sent.append(dense_bytes + table_bytes(ids, dim, categorical.ids, args.sparse))
        tick = time.perf_counter()
    slowest = torch.tensor([seconds])
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    per_rank = [None] * args.ranks
    dist.all_gather_object(per_rank, float(np.mean(sent)))
    if rank == 0:
        results.put({"samples_per_s": samples * args.ranks / float(slowest[0]), "test_loss": test_loss(model.module,
                     config, numeric, categorical), "bytes_sent_per_step": float(np.mean(per_rank)),
                     "bytes_sent_per_step_min": min(per_rank), "bytes_sent_per_step_max": max(per_rank),
                     "steps": len(sent)})
    dist.destroy_process_group()


def table_bytes(ids, dim: int, rows: tuple[int, ...], sparse: bool) -> int:
    """The bytes of the tables' gradients a rank hands to gloo in a step on the batch's `ids` (batch, columns): the
    coalesced sparse tensors (int64 index and float32 values of each distinct id), or the tables of `rows` rows."""
    if sparse:
        return sum(torch.unique(ids[:, j]).numel() * (8 + 4 * dim) for j in range(ids.shape[1]))
    return 4 * dim * sum(rows)


def test_loss(model, config, numeric, categorical) -> float:
    """The mean log loss of `model` on every row of the config's test split."""
    test = rank_reader(config, 0, 1).eval_rows(config.data.test_split)
    total = 0.0
    with torch.no_grad():
        for x, y in test.batches(EVAL_BATCH):
            logits = model(torch.from_numpy(x.x), torch.from_numpy(x.columns["categorical"]).long())
            total += float(torch.nn.functional.binary_cross_entropy_with_logits(logits, torch.from_numpy(y),
                                                                                reduction="sum"))
    return total / len(test)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", required=True, help="the run config benchmarks/embeddings.py wrote")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--sparse", action="store_true", help="sparse nn.Embedding gradients (default: dense)")
    parser.add_argument("--warmup-steps", type=int, default=0, help="first steps trained but not counted")
    args = parser.parse_args(argv)
    result = spawn_ranks(worker, args, args.ranks)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
