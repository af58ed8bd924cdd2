"""`sync.deterministic`: the same config on 1, 2, 3 and 4 ranks (global batch 96) ends with byte-identical
parameters and running statistics, for an MLP, LeNet with dropout and augmentation, and a batch-norm CNN; plain
`allreduce` does not (the control that shows the comparison can fail)."""
import json

from mpitrain.testing.datasets import make_dataset, write_config
from mpitrain.testing.launch import train_each

MODELS = {
    "mlp": {"layers": [{"type": "dense", "units": 24, "activation": "relu"}, {"type": "dense", "units": 3}]},
    "lenet": {"layers": [  # LeNet's shape, small, with dropout; trained on flipped and shifted images
        {"type": "conv2d", "filters": 4, "kernel": 3, "padding": "same", "activation": "relu"},
        {"type": "maxpool2d", "pool": 2}, {"type": "conv2d", "filters": 6, "kernel": 3, "activation": "relu"},
        {"type": "maxpool2d", "pool": 2}, {"type": "flatten"}, {"type": "dense", "units": 12, "activation": "relu"},
        {"type": "dropout", "rate": 0.3}, {"type": "dense", "units": 3}]},
    "batchnorm_cnn": {"layers": [
        {"type": "conv2d", "filters": 4, "kernel": 3, "padding": "same"}, {"type": "batchnorm"}, {"type": "relu"},
        {"type": "maxpool2d", "pool": 2}, {"type": "flatten"}, {"type": "dense", "units": 12},
        {"type": "batchnorm", "activation": "relu"}, {"type": "dense", "units": 3}]},
}
RANKS = (1, 2, 3, 4)


def test_deterministic_sums_give_byte_identical_models_on_1_to_4_ranks(tmp_path):
    make_dataset(tmp_path / "data", n_train=480, n_test=96, shape=(1, 12, 12))
    runs = {}  # (name, deterministic) -> config file
    for name, model in MODELS.items():
        for deterministic in (True, False):
            runs[name, deterministic] = write_config(
                tmp_path / f"{name}-{deterministic}.yaml", tmp_path / "data", model=model,
                data={"augment": name == "lenet"}, optimizer={"type": "adam", "lr": 0.01},
                train={"epochs": 4, "global_batch_size": 96, "seed": 5},
                sync={"mode": "allreduce", "deterministic": deterministic, "deterministic_rows": 8})
    hashes = {}
    for n in RANKS:
        arguments = []
        for (name, deterministic), config in runs.items():
            if deterministic or name == "mlp":
                arguments += [config, "--set", f"run_dir={tmp_path / f'{name}-{deterministic}-{n}'}"]
        result = train_each(n, *arguments)
        assert result.returncode == 0, result.stdout + result.stderr
        for (name, deterministic) in runs:
            if deterministic or name == "mlp":
                summary = json.loads((tmp_path / f"{name}-{deterministic}-{n}" / "summary.json").read_text())
                assert len(set(summary["replica_hashes"])) == 1, (name, n, summary["replica_hashes"])
                assert summary["test_accuracy"] > 0.5, (name, n, summary["test_accuracy"])  # 3 classes: it learned
                hashes[name, deterministic, n] = summary["replica_hashes"][0]
    for name in MODELS:
        assert len({hashes[name, True, n] for n in RANKS}) == 1, \
            f"{name}: parameters and statistics differ between rank counts: {[hashes[name, True, n] for n in RANKS]}"
    assert len({hashes["mlp", False, n] for n in RANKS}) > 1, "plain allreduce was identical on 1-4 ranks too"
