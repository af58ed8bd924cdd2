"""A recipe of today beside the shipped one (issue 47's reference): the Fashion-MNIST MLP with a warm-up, cosine
decay and early stopping on validation accuracy, against the same MLP's fixed epochs with per-epoch decay.

Every step runs as the README's commands do: `mpitrain etl --source idx:... --validation-fraction 0.1` (a
validation split carved from the train rows, stratified), then for each recipe `mpiexec -n 2 mpitrain train
configs/fashion_mlp.yaml --set ...` evaluated on the validation split after every epoch (`data.test_split`), and
`mpitrain eval --split test`, which takes early stopping's best checkpoint. The test split is seen once per run.

- fixed: the config as shipped, 10 epochs of SGD with momentum at lr 0.05 decayed by 0.75 per epoch;
- recipe: the same model and lr, `lr_decay` 1, warm-up over the first 300 steps then cosine to 0 by step over 6
  epochs (the schedule's span is the run's), early stopping on validation accuracy (patience 2, min_delta 0.001)
  as a guard: a shorter run annealed to its end, as a user of today's recipes would write it.

Goal: the recipe's test accuracy at least the fixed run's, in fewer epochs.

Beside it, a sequence model on channels of unlike scales, the way a user's sensors come: the motif sequences of
benchmarks/sequences.py (`mpitrain.testing.sequences.motif_sequences`, 8,000 train and 2,000 test rows) with their
two channels taken to x 1000 + 5000 and x 0.001, written as Parquet, through `mpitrain etl --sequence readings`
with and without `--standardize` (each channel by its train steps' mean and std), then configs/motifs_lstm.yaml on 2
ranks at Adam lr 0.003 and `mpitrain eval`. Goal: the standardized run's test accuracy >= 0.95 (the motif LSTM's
own goal on unscaled data).

    python benchmarks/recipes.py --out benchmarks/results
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile

from mpitrain.testing.launch import FASHION
from mpitrain.testing.sequences import motif_sequences, write_parquet

from common import HERE, markdown_table, mpitrain, train, write_results

CONFIG = os.path.join(os.path.dirname(HERE), "configs", "fashion_mlp.yaml")
EPOCHS = 10  # the fixed run's
RECIPE_EPOCHS = 6
RECIPE = {"train.epochs": RECIPE_EPOCHS, "optimizer.lr_decay": 1.0, "optimizer.schedule": {"type": "cosine", "unit": "step", "warmup": 300},
          "train.early_stopping": {"monitor": "accuracy", "patience": 2, "min_delta": 0.001}}


def trained(data: str, run_dir: str, overrides: dict) -> dict:
    """Train on 2 ranks (validation after each epoch), then `mpitrain eval --split test`: the figures of the run."""
    settings = {"data.path": data, "data.test_split": "validation", "run_dir": run_dir, "resume": "never",
                "train.epochs": EPOCHS, **overrides}
    summary = train(2, CONFIG, settings)
    mpitrain("eval", run_dir, "--split", "test", ranks=2)
    with open(os.path.join(run_dir, "eval-test.json")) as f:
        test = json.load(f)
    stopping = summary.get("early_stopping", {})
    epochs = stopping["stopped_at"][0] if stopping.get("stopped_early") else settings["train.epochs"]
    return {"test_accuracy": test["accuracy"], "epochs_trained": epochs,
            "best_validation_accuracy": stopping.get("best"), "best_at": stopping.get("best_at"),
            "last_validation_accuracy": summary["test_accuracy"], "samples_per_s": summary["samples_per_s"]}


SEQUENCE_CONFIG = os.path.join(os.path.dirname(HERE), "configs", "motifs_lstm.yaml")
SEQUENCE_ROWS = {"train": 8_000, "test": 2_000}
CHANNEL_SCALE, CHANNEL_SHIFT = [1000.0, 0.001], [5000.0, 0.0]
SEQUENCE_GOAL = 0.95


def unlike_scales(work: str) -> dict:
    """The motif LSTM on channels of unlike scales, through the ETL with and without --standardize."""
    parquet = {}
    for seed, (split, rows) in enumerate(SEQUENCE_ROWS.items()):
        sequences, labels = motif_sequences(rows, seed)
        parquet[split] = os.path.join(work, f"unlike-{split}.parquet")
        write_parquet(parquet[split], [s * CHANNEL_SCALE + CHANNEL_SHIFT for s in sequences], labels)
    found = {}
    for name, options in (("as stored", []), ("standardized", ["--standardize"])):
        data = os.path.join(work, f"unlike-{len(options)}")
        mpitrain("etl", "--source", f"parquet:{parquet['train']}", "--test", parquet["test"], "--label", "label",
                 "--sequence", "readings", "--out", data, "--shards", "2", *options)
        run_dir = os.path.join(work, f"unlike-run-{len(options)}")
        summary = train(2, SEQUENCE_CONFIG, {"data.path": data, "run_dir": run_dir, "resume": "never",
                                             "optimizer.lr": 0.003})
        mpitrain("eval", run_dir, "--split", "test", ranks=2)
        with open(os.path.join(run_dir, "eval-test.json")) as f:
            found[name] = {"test_accuracy": json.load(f)["accuracy"], "epochs": summary["epochs"]}
    return {"config": "configs/motifs_lstm.yaml", "lr": 0.003, "rows": SEQUENCE_ROWS, "scale": CHANNEL_SCALE,
            "shift": CHANNEL_SHIFT, "runs": found, "goal": f"standardized test accuracy >= {SEQUENCE_GOAL}",
            "met": bool(found["standardized"]["test_accuracy"] >= SEQUENCE_GOAL)}


def measure(work: str) -> dict:
    data = os.path.join(work, "data")
    mpitrain("etl", "--source", f"idx:{FASHION}", "--out", data, "--shards", "8", "--validation-fraction", "0.1")
    fixed = trained(data, os.path.join(work, "fixed"), {})
    recipe = trained(data, os.path.join(work, "recipe"), RECIPE)
    return {"dataset": "fashion-mnist", "config": "configs/fashion_mlp.yaml", "ranks": 2, "max_epochs": EPOCHS,
            "recipe_epochs": RECIPE_EPOCHS,
            "recipe": RECIPE, "fixed": fixed, "warmup_cosine_early_stopping": recipe,
            "goal": "the recipe's test accuracy at least the fixed run's, in fewer epochs",
            "met": bool(recipe["test_accuracy"] >= fixed["test_accuracy"]
                        and recipe["epochs_trained"] < fixed["epochs_trained"]),
            "sequences_of_unlike_scales": unlike_scales(work)}


def markdown(result: dict) -> str:
    fixed, recipe = result["fixed"], result["warmup_cosine_early_stopping"]
    rows = [["fixed: lr 0.05 x 0.75 per epoch", str(fixed["epochs_trained"]), f"{fixed['last_validation_accuracy']:.4f}",
             f"{fixed['test_accuracy']:.4f}", "the last epoch's", f"{fixed['samples_per_s']:,.0f}"],
            [f"warm-up 300 steps, cosine by step over {result['recipe_epochs']} epochs, early stopping (accuracy, "
             "patience 2)", str(recipe["epochs_trained"]),
             f"{recipe['best_validation_accuracy']:.4f}", f"{recipe['test_accuracy']:.4f}",
             f"best.h5 (after {recipe['best_at'][0]} epochs)", f"{recipe['samples_per_s']:,.0f}"]]
    table = markdown_table(["recipe", "epochs", "validation accuracy", "test accuracy", "evaluated checkpoint",
                            "samples/s"], rows, "lrrrlr")
    met = "met" if result["met"] else "**not met**"
    unlike = result["sequences_of_unlike_scales"]
    sequences = markdown_table(["motif sequences, channels x 1000 + 5000 and x 0.001", "epochs", "test accuracy"],
                               [[f"`mpitrain etl` {name}", str(run["epochs"]), f"{run['test_accuracy']:.4f}"]
                                for name, run in unlike["runs"].items()], "lrr")
    return (table + f"\n\nFashion-MNIST MLP 784-500-500-10 (configs/fashion_mlp.yaml), SGD with momentum 0.9, batch 64 "
            f"per rank on 2 ranks, {result['max_epochs']} epochs fixed, {result['recipe_epochs']} for the recipe; "
            f"validation: 10% of the train rows, carved by the ETL. Goal ({result['goal']}): {met}.\n\n"
            + sequences + f"\n\n{unlike['config']} on 2 ranks at Adam lr {unlike['lr']}, "
            f"{unlike['rows']['train']:,} train and {unlike['rows']['test']:,} test sequences. Goal ({unlike['goal']}): "
            f"{'met' if unlike['met'] else '**not met**'}.\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        result = measure(work)
    write_results(args.out, "recipes", result, markdown(result))


if __name__ == "__main__":
    main()
