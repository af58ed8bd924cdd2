"""An MLP on Fashion-MNIST whose ranks share threshold-encoded updates, built and trained from Python.

    mpitrain etl --source idx:/usr/share/datasets/fashion-mnist --out data/fashion --shards 8
    mpiexec -n 2 python examples/mlp_sharing.py data/fashion --run-dir runs/example_mlp_sharing
    mpiexec -n 2 mpitrain eval runs/example_mlp_sharing       # the run directory works like any other

The same run as `configs/fashion_mlp.yaml --set sync.mode=sharing`, with the parts built here:
a dataset reader, a model, a synchronizer. Every rank runs this whole script.
"""
import argparse

import mpitrain


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", help="a dataset folder written by `mpitrain etl`")
    parser.add_argument("--run-dir", default="runs/example_mlp_sharing")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--max-rows", type=int, default=0, help="use only the first rows of each split (0: all)")
    args = parser.parse_args()

    comm = mpitrain.init(backend="auto")  # cupy when this rank has a GPU, else numpy
    reader = mpitrain.DatasetReader(args.dataset, comm, max_rows=args.max_rows)
    model = mpitrain.Sequential([mpitrain.Dense(256, activation="relu", init="he"), mpitrain.Dropout(0.2),
                                 mpitrain.Dense(128, activation="relu", init="he"),
                                 mpitrain.Dense(reader.manifest.num_classes)],
                                reader.manifest.feature_shape, xp=comm.backend.xp)
    sync = mpitrain.create_synchronizer(mpitrain.SyncConfig(mode="sharing", threshold=1e-3), comm)
    config = mpitrain.Config(optimizer=mpitrain.OptimizerConfig(type="sgd", lr=0.05, momentum=0.9),
                             train=mpitrain.TrainConfig(epochs=args.epochs, batch_size=64),
                             run_dir=args.run_dir, report=False)
    summary = mpitrain.train(config, comm, reader=reader, model=model, sync=sync)
    if comm.is_root:
        print(f"test accuracy {summary['test_accuracy']:.4f}, "
              f"{summary['bytes_sent_per_step']:.0f} bytes sent per step per rank "
              f"({100 * summary['bytes_sent_per_step'] / (4 * model.n_params):.2f}% of a dense gradient)")


if __name__ == "__main__":
    main()
