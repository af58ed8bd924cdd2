"""A layer stack of your own (a small batch-norm CNN) with parameter averaging, then evaluation, from Python.

    mpiexec -n 2 python examples/custom_layers.py data/fashion --run-dir runs/example_custom_layers

Layers are plain objects (`mpitrain.Conv2D`, `BatchNorm`, `MaxPool2D`, `Dropout`, `Dense`, ...);
the model holds them over one flat parameter buffer, so each averaging is one Allreduce.
After training, the script evaluates the model itself, as `mpitrain eval` would.
"""
import argparse

import mpitrain


def layer_stack(num_classes: int) -> list:
    """Two conv + batch norm + ReLU blocks, a max-pool after each, then a dense head with dropout."""
    return [mpitrain.Conv2D(8, 3, padding="same", init="he"), mpitrain.BatchNorm(), mpitrain.ReLU(),
            mpitrain.MaxPool2D(2),
            mpitrain.Conv2D(16, 3, padding="same", init="he"), mpitrain.BatchNorm(), mpitrain.ReLU(),
            mpitrain.MaxPool2D(2),
            mpitrain.Flatten(), mpitrain.Dropout(0.25), mpitrain.Dense(64, activation="relu", init="he"),
            mpitrain.Dense(num_classes)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dataset", help="a dataset folder of images written by `mpitrain etl`")
    parser.add_argument("--run-dir", default="runs/example_custom_layers")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--max-rows", type=int, default=0, help="use only the first rows of each split (0: all)")
    args = parser.parse_args()

    comm = mpitrain.init(backend="auto")
    reader = mpitrain.DatasetReader(args.dataset, comm, max_rows=args.max_rows)
    model = mpitrain.Sequential(layer_stack(reader.manifest.num_classes), reader.manifest.feature_shape,
                                xp=comm.backend.xp)
    sync = mpitrain.create_synchronizer(mpitrain.SyncConfig(mode="averaging", frequency=4), comm)
    config = mpitrain.Config(optimizer=mpitrain.OptimizerConfig(type="adam", lr=2e-3),
                             train=mpitrain.TrainConfig(epochs=args.epochs, batch_size=32, log_every=20),
                             run_dir=args.run_dir, report=False)
    mpitrain.train(config, comm, reader=reader, model=model, sync=sync)

    run = mpitrain.setup_run(mpitrain.load_config(f"{args.run_dir}/config.yaml"), comm)  # as `mpitrain eval` does
    checkpoint = run.checkpointer.restore(run.model).path
    rows = run.reader.eval_rows("test")  # this rank's share of the test split, read block by block
    result = mpitrain.evaluate(run.model, rows, run.model_input(), 256, run.comm, run.reader.manifest.num_classes,
                               run.backend)
    if comm.is_root:
        print(f"{len(model.layers)} layers, {model.n_params} parameters; test accuracy {result.accuracy:.4f} "
              f"from {checkpoint}")


if __name__ == "__main__":
    main()
