"""PyTorch DistributedDataParallel (gloo, CPU, 1 thread per rank) on the same model, rows, batches and optimizer.

Each rank reads its rows through `mpitrain.data.reader` (same rows, same per-epoch shuffle as an
mpitrain run), so the only difference measured is the training engine and its allreduce.
With `--device cuda` one process trains on the GPU without DDP (the twin of a 1-rank
`backend: cupy` run), each batch uploaded as mpitrain uploads it.
Prints one JSON line: samples/s (all ranks, training steps only) and test accuracy.

    python benchmarks/torch_ddp.py --data data/fashion --config configs/fashion_mlp.yaml --ranks 2 --epochs 1
    python benchmarks/torch_ddp.py --data data/fashion --device cuda --batch-size 256
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from mpitrain.parallel.backend import create_backend
from mpitrain.config.sections import load_config
from mpitrain.data.reader import Batches, load_rank_rows
from mpitrain.data.shards import read_manifest


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
            modules.append(_initialized(torch.nn.Linear(int(np.prod(current)), spec["units"]), spec))
        elif kind == "conv2d":
            modules.append(_initialized(torch.nn.Conv2d(current[0], spec["filters"], spec["kernel"],
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


def _initialized(module, spec):
    if spec.get("init") == "he":
        torch.nn.init.kaiming_normal_(module.weight, nonlinearity="relu")
    else:
        torch.nn.init.xavier_uniform_(module.weight)
    torch.nn.init.zeros_(module.bias)
    return module


def worker(rank: int, args, init_file: str, results) -> None:
    torch.set_num_threads(1)
    distributed = args.device == "cpu"
    if distributed:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=args.ranks)
    config = load_config(args.config, [f"data.path={args.data}"])
    manifest = read_manifest(config.data.path)
    backend = create_backend("numpy")
    rows = load_rank_rows(config.data.path, manifest, "train", rank, args.ranks, training=True)
    batches = Batches(rows, manifest, args.batch_size or config.train.batch_size, backend, "float32",
                      config.train.seed, rank)
    torch.manual_seed(config.train.seed)
    model = build_torch_model(config.model.layers, manifest.feature_shape).to(args.device)
    if distributed:
        model = torch.nn.parallel.DistributedDataParallel(model)
    weights = [m.weight for m in model.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d))]
    biases = [p for p in model.parameters() if all(p is not w for w in weights)]  # and batch-norm scales
    opt = config.optimizer
    optimizer = torch.optim.SGD([{"params": weights, "weight_decay": opt.l2}, {"params": biases}],
                                lr=opt.lr, momentum=opt.momentum, nesterov=opt.nesterov)
    loss_fn = torch.nn.CrossEntropyLoss()
    seconds, samples = 0.0, 0
    for epoch in range(args.epochs):
        tick = time.perf_counter()
        counted = epoch >= args.warmup_epochs
        for x, y in batches.epoch(epoch):
            optimizer.zero_grad(set_to_none=True)
            x, y = torch.from_numpy(x).to(args.device), torch.from_numpy(y).to(args.device)
            loss = loss_fn(model(x), y.long())
            loss.backward()
            optimizer.step()
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
        test = load_rank_rows(config.data.path, manifest, "test", 0, 1, training=False)
        model.eval()
        with torch.no_grad():
            logits = (model.module if distributed else model)(
                torch.from_numpy(batches.to_model_input(test.x)).to(args.device))
        accuracy = float((logits.argmax(1).cpu().numpy() == test.y).mean())
        results.put({"samples_per_s": samples * args.ranks / float(slowest[0]), "test_accuracy": accuracy})
    if distributed:
        dist.destroy_process_group()


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--config", default="configs/fashion_mlp.yaml")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=0, help="per rank; default: the config's")
    parser.add_argument("--warmup-epochs", type=int, default=0,
                        help="first epochs trained but not counted in samples/s (of --epochs)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cuda: one process, no DDP")
    args = parser.parse_args(argv)
    if args.device == "cuda" and args.ranks != 1:
        parser.error("--device cuda runs one process: use --ranks 1")
    context = mp.get_context("spawn")
    results = context.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        processes = [context.Process(target=worker, args=(r, args, os.path.join(tmp, "init"), results))
                     for r in range(args.ranks)]
        for p in processes:
            p.start()
        result = results.get(timeout=3600)
        for p in processes:
            p.join()
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
