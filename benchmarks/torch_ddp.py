"""PyTorch DistributedDataParallel (gloo, CPU, 1 thread per rank) on the same model, rows, batches and optimizer.

Each rank reads its rows through `mpitrain.data.reader` as an mpitrain rank does (`rank_batches`: the same
rows, epoch order and batches as an mpitrain run on as many ranks), so the only difference measured is the
training engine and its allreduce.
A `model.graph` of images (a residual net) gets `torch_graph.GraphModel`; a dataset of one sequence column gets
`torch_sequences.SequenceModel` (the twins of `lstm`, `conv1d`, the global pools, `dense`, `positional`,
`layernorm` and `transformer`: `nn.TransformerEncoderLayer`), fed each padded `SequenceBatch` the reader gives,
values and lengths.
With `--device cuda` one process trains on the GPU without DDP (the twin of a 1-rank
`backend: cupy` run), each batch uploaded as mpitrain uploads it.
The optimizer is the config's SGD, Adam or AdamW, with its `train.clip_norm` (PyTorch's `clip_grad_norm_`).
With `--compile` the DDP model goes through `torch.compile` in its default mode (TorchInductor; DDP's optimizer
splits the graph at its buckets), as PyTorch 2 recommends; its first steps compile, so count from a second epoch
(`--warmup-epochs 1`).
With `--hook` DDP's gradients go through its communication hook: `bf16` and `fp16` (`bf16_compress_hook`,
`fp16_compress_hook`: 16 bits on the wire, an Allreduce in that precision) or `powersgd` (`powerSGD_hook` of
rank 1 with error feedback and warm start, compressing from step 2, the earliest it allows, where its default waits
1,000 steps: mpitrain's `powersgd` compresses from the first).
With `--launcher mpi` the ranks are started by mpiexec (one process each, e.g. on the simulated cluster's nodes:
benchmarks/compression.py) instead of spawned here: each takes its rank and the number of ranks from MPICH's
PMI_RANK and PMI_SIZE and meets the others at `--init` (tcp://HOST:PORT, rank 0's node); rank 0 prints the result.
Prints one JSON line: samples/s (all ranks, training steps only), test accuracy and the steps each rank trained.

    python benchmarks/torch_ddp.py --data data/fashion --config configs/fashion_mlp.yaml --ranks 2 --epochs 1
    python benchmarks/torch_ddp.py --data data/fashion --compile --epochs 2 --warmup-epochs 1
    python benchmarks/torch_ddp.py --data data/fashion --device cuda --batch-size 256
"""
from __future__ import annotations

import argparse
import json
import os
import queue
import tempfile
import time
from types import SimpleNamespace

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch_graph import GraphModel
from torch_sequences import SequenceModel, initialized

from mpitrain.config.sections import load_config
from mpitrain.data.reader import Batches, DatasetReader
from mpitrain.data.sequences import SequenceBatch
from mpitrain.parallel.backend import create_backend

EVAL_BATCH = 10_000


def rank_reader(config, rank: int, ranks: int) -> DatasetReader:
    """Rank `rank` of `ranks`'s reader of `config`'s dataset, built as an mpitrain rank builds it (a DatasetReader is
    no collective: it needs only the rank and the number of ranks)."""
    data = config.data
    return DatasetReader(data.path, SimpleNamespace(rank=rank, size=ranks), verify_checksums=data.verify_checksums,
                         max_rows=data.max_rows, storage_options=data.storage_options)


def rank_batches(config, rank: int, ranks: int, batch_size: int = 0) -> tuple[DatasetReader, Batches]:
    """Rank `rank` of `ranks`'s reader and training batches: the rows, epoch order and batches an mpitrain rank of a
    run on `ranks` ranks trains on (`mpitrain.training.run.Run.train_batches`), `batch_size` rows per rank (0: the
    config's train.batch_size or global_batch_size), as float32 numpy arrays."""
    data, train = config.data, config.train
    reader = rank_reader(config, rank, ranks)
    global_batch = batch_size * ranks if batch_size else train.global_batch(ranks)
    rows = reader.train_rows(data.train_split, global_batch, data.buffer_mb, train.seed, data.shuffle)
    return reader, Batches(rows, reader.manifest, create_backend("numpy"), "float32", train.seed, rank,
                           normalize=data.normalize, prefetch=data.prefetch)


def build_torch_model(layers, input_shape) -> torch.nn.Sequential:
    """The torch twin of a config's layers: dense, conv2d, pooling, flatten, dropout, batchnorm, activations.

    Weights are initialized as the config asks (He for `init: he`, else Xavier), biases 0.
    """
    activations = {"relu": torch.nn.ReLU, "tanh": torch.nn.Tanh, "sigmoid": torch.nn.Sigmoid}
    modules = []

    def shape():
        return tuple(torch.nn.Sequential(*modules)(torch.zeros(2, *input_shape)).shape[1:])

    for spec in layers:
        kind, current = spec["type"], shape()
        if kind == "dense":
            if len(current) > 1:
                modules.append(torch.nn.Flatten())
            modules.append(initialized(torch.nn.Linear(int(np.prod(current)), spec["units"]), spec))
        elif kind == "conv2d":
            modules.append(initialized(torch.nn.Conv2d(current[0], spec["filters"], spec["kernel"],
                                                       spec.get("stride", 1), spec.get("padding", "valid")), spec))
        elif kind in ("maxpool2d", "avgpool2d"):
            pool = torch.nn.MaxPool2d if kind == "maxpool2d" else torch.nn.AvgPool2d
            modules.append(pool(spec.get("pool", 2), spec.get("stride")))
        elif kind == "batchnorm":
            norm = torch.nn.BatchNorm1d if len(current) == 1 else torch.nn.BatchNorm2d
            modules.append(norm(current[0], momentum=1 - spec.get("momentum", 0.9)))
        else:
            modules.append({"flatten": torch.nn.Flatten, "dropout": lambda: torch.nn.Dropout(spec.get("rate", 0.5)),
                            **activations}[kind]())
        if spec.get("activation", "none") != "none":
            modules.append(activations[spec["activation"]]())
    return torch.nn.Sequential(*modules)


def torch_inputs(x, device) -> tuple:
    """A batch's input as the torch model's arguments: (x,), or a SequenceBatch's (values, lengths)."""
    if isinstance(x, SequenceBatch):
        return torch.from_numpy(x.values).to(device), torch.from_numpy(x.lengths)
    return (torch.from_numpy(x).to(device),)


def torch_optimizer(opt, weights, biases):
    """The config's SGD (momentum, Nesterov), Adam, or AdamW; L2 (AdamW: its decoupled decay) on the weights alone."""
    if opt.type == "adamw":
        groups = [{"params": weights, "weight_decay": opt.weight_decay}, {"params": biases, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=opt.lr, betas=(opt.beta1, opt.beta2), eps=opt.eps)
    groups = [{"params": weights, "weight_decay": opt.l2}, {"params": biases}]
    if opt.type == "adam":
        return torch.optim.Adam(groups, lr=opt.lr, betas=(opt.beta1, opt.beta2), eps=opt.eps)
    if opt.type != "sgd":
        raise ValueError(f"optimizer.type {opt.type}: the PyTorch twin runs sgd, adam or adamw")
    return torch.optim.SGD(groups, lr=opt.lr, momentum=opt.momentum, nesterov=opt.nesterov)


def with_hook(model, hook: str):
    """Register DDP's communication hook `hook` (none, bf16, fp16, powersgd) on the DDP `model`; returns it."""
    if hook == "powersgd":
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2)
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    elif hook != "none":
        model.register_comm_hook(None, {"bf16": default_hooks.bf16_compress_hook,
                                        "fp16": default_hooks.fp16_compress_hook}[hook])
    return model


def worker(rank: int, args, init_method: str, results) -> None:
    torch.set_num_threads(1)
    distributed = args.device == "cpu"
    if distributed:
        dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=args.ranks)
    overrides = [f"data.path={args.data}"] + ([f"data.max_rows={args.max_rows}"] if args.max_rows else [])
    config = load_config(args.config, overrides)
    reader, batches = rank_batches(config, rank, args.ranks, args.batch_size)
    torch.manual_seed(config.train.seed)
    if reader.manifest.sequences:
        model = SequenceModel(config.model.layers, reader.manifest.input_shape[1],
                              reader.manifest.sequences[0]["longest"]).to(args.device)
    elif config.model.graph:
        model = GraphModel(config.model.graph, reader.manifest.feature_shape).to(args.device)
    else:
        model = build_torch_model(config.model.layers, reader.manifest.feature_shape).to(args.device)
    network = model  # the module itself, for evaluation
    if distributed:
        model = with_hook(torch.nn.parallel.DistributedDataParallel(model), args.hook)
    if args.compile:
        model = torch.compile(model)
    weights = [p for m in network.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d,
                                                                torch.nn.LSTM, torch.nn.MultiheadAttention))
               for name, p in m.named_parameters(recurse=False) if name.startswith(("weight", "in_proj_weight"))]
    biases = [p for p in network.parameters() if all(p is not w for w in weights)]  # and batch-norm scales
    optimizer = torch_optimizer(config.optimizer, weights, biases)
    clip_norm = config.train.clip_norm
    loss_fn = torch.nn.CrossEntropyLoss()
    seconds, samples, host_seconds, steps = 0.0, 0, 0.0, 0
    for epoch in range(args.epochs):
        tick = time.perf_counter()
        counted = epoch >= args.warmup_epochs
        for x, y in batches.epoch(epoch):
            host_tick = time.thread_time()  # the step's CPU time in this thread (on a GPU: launching its kernels)
            optimizer.zero_grad(set_to_none=True)
            y = torch.from_numpy(y).to(args.device)
            loss = loss_fn(model(*torch_inputs(x, args.device)), y.long())
            loss.backward()
            if clip_norm:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
            optimizer.step()
            host_seconds += (time.thread_time() - host_tick) * counted
            steps += counted
            now = time.perf_counter()
            seconds += (now - tick) * counted
            samples += len(y) * counted
            tick = time.perf_counter()
        if args.device == "cuda":  # the work the epoch queued on the GPU counts too
            torch.cuda.synchronize()
            seconds += (time.perf_counter() - tick) * counted
    slowest = torch.tensor([seconds])
    if distributed:
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    if rank == 0:
        test = rank_reader(config, 0, 1).eval_rows(config.data.test_split)
        network.eval()
        right = 0
        with torch.no_grad():
            for x, y in test.batches(EVAL_BATCH):
                logits = network(*torch_inputs(batches.to_model_input(x), args.device))
                right += int((logits.argmax(1).cpu().numpy() == y).sum())
        accuracy = right / len(test)
        results.put({"samples_per_s": samples * args.ranks / float(slowest[0]), "test_accuracy": accuracy,
                     "host_cpu_ms_per_step": 1e3 * host_seconds / max(steps, 1),
                     "steps": batches.steps_per_epoch * args.epochs})
    if distributed:
        dist.destroy_process_group()


def spawn_ranks(worker, args, ranks: int) -> dict:
    """Start `ranks` processes of `worker(rank, args, init_method, results)` (spawned, one per rank as torchrun starts
    them; `init_method`, a file, is their rendezvous for `dist.init_process_group`) and return what rank 0 puts in
    `results`. A process that fails ends them all, with an error."""
    context = mp.get_context("spawn")
    results = context.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        processes = [context.Process(target=worker, args=(r, args, f"file://{os.path.join(tmp, 'init')}", results))
                     for r in range(ranks)]
        for p in processes:
            p.start()
        result = None
        try:
            while result is None:
                try:
                    result = results.get(timeout=5)
                except queue.Empty:
                    codes = [p.exitcode for p in processes]
                    if any(code not in (None, 0) for code in codes) or all(code == 0 for code in codes):
                        raise SystemExit(f"PyTorch ranks ended without a result (exit status of each: {codes}); "
                                         "their error is above") from None
        finally:
            for p in processes:
                if result is None and p.exitcode is None:
                    p.terminate()
                p.join()
    return result


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--config", default="configs/fashion_mlp.yaml")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=0, help="per rank; default: the config's")
    parser.add_argument("--max-rows", type=int, default=0, help="the config's data.max_rows (0: the config's)")
    parser.add_argument("--warmup-epochs", type=int, default=0,
                        help="first epochs trained but not counted in samples/s (of --epochs)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cuda: one process, no DDP")
    parser.add_argument("--compile", action="store_true", help="torch.compile the (DDP) model, default mode")
    parser.add_argument("--hook", choices=["none", "bf16", "fp16", "powersgd"], default="none",
                        help="DDP's communication hook")
    parser.add_argument("--launcher", choices=["spawn", "mpi"], default="spawn",
                        help="mpi: this process is one rank of an mpiexec job (PMI_RANK, PMI_SIZE), meeting at --init")
    parser.add_argument("--init", default="", help="--launcher mpi: rank 0's tcp://HOST:PORT")
    args = parser.parse_args(argv)
    if args.device == "cuda" and args.ranks != 1:
        parser.error("--device cuda runs one process: use --ranks 1")
    if args.launcher == "mpi":
        if not args.init:
            parser.error("--launcher mpi needs --init tcp://HOST:PORT")
        rank, args.ranks = int(os.environ["PMI_RANK"]), int(os.environ["PMI_SIZE"])
        results = queue.Queue()
        worker(rank, args, args.init, results)
        if rank:
            return {}
        result = results.get()
    else:
        result = spawn_ranks(worker, args, args.ranks)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
