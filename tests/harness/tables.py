"""Rewrite docs/benchmarks.md's tables from benchmarks/results, then README.md's headline table from them.

`make bench` runs this after the benchmarks, so both show what their last runs wrote (each
NAME.md table, headed by the machine, date and versions saved in NAME.json), never figures
typed by hand. Each benchmark's section of docs/benchmarks.md sits between its own markers
and is rewritten only when its results are there, so running one benchmark keeps the
others' last figures. The README's headline is a few rows of those tables (HEADLINE says
which), copied as they stand.

    python -m mpitrain.testing.tables --results benchmarks/results --page docs/benchmarks.md --readme README.md
"""
from __future__ import annotations

import argparse
import json
import os
import sys

HEADLINE_BEGIN, HEADLINE_END = "<!-- headline:begin -->", "<!-- headline:end -->"
SECTIONS = [("throughput", "Throughput per sync mode, beside PyTorch DDP (`benchmarks/throughput.py`)"),
            ("cnn_accuracy", "Conv nets: accuracy after 10 epochs (`benchmarks/cnn_accuracy.py`)"),
            ("communication", "Bytes sent per step and accuracy per sync mode (`benchmarks/communication.py`)"),
            ("scaling", "Scaling and communication cost model (`benchmarks/scaling.py`, "
                        "plot in `benchmarks/results/scaling.png`)"),
            ("kernels", "Threshold kernels (`benchmarks/kernels.py`)"),
            ("gpu_check", "The GPU check: one GPU beside PyTorch CUDA, the GPU tests, 2 ranks sharing the GPU "
                          "(`make gpu-check`)"),
            ("throughput_gpu", "One GPU beside PyTorch CUDA (`benchmarks/throughput.py --backend cupy`)"),
            ("kernels_gpu", "Threshold kernels on the GPU (`benchmarks/kernels.py --backend cupy`)"),
            ("cluster", "Simulated multi-node cluster beside the cost model (`benchmarks/cluster.py`)"),
            ("compression", "Codecs, `sync.mode: auto` and deterministic sums on the simulated cluster "
                            "(`benchmarks/compression.py`)"),
            ("soak", "Soak: kill a random rank, resume, 20 times (`benchmarks/soak.py`)"),
            ("dbn", "Deep belief net, pretrained versus not, beside the seed's MNIST figures (`benchmarks/dbn.py`)"),
            ("etl", "Spark ETL beside a single-process conversion (`benchmarks/etl.py`)"),
            ("streaming", "Streaming data path: speed, codecs, shuffle, bytes read, memory (`benchmarks/streaming.py`)"),
            ("embeddings", "Embedding tables: touched rows beside the dense exchange and PyTorch DDP "
                           "(`benchmarks/embeddings.py`)"),
            ("sharded_tables", "Embedding tables sharded by rows: memory, speed, the cost model at scale, accuracy "
                               "(`benchmarks/sharded_tables.py`)"),
            ("tables", "Tables through the whole pipeline: beside scikit-learn and the true probabilities "
                       "(`benchmarks/tables.py`)"),
            ("autoencoder", "A dense autoencoder on digits beside PCA (`benchmarks/autoencoder.py`)"),
            ("recipes", "A recipe of today: warm-up, cosine and early stopping beside fixed epochs "
                        "(`benchmarks/recipes.py`)"),
            ("spark_train", "Training inside a Spark barrier stage beside mpiexec (`benchmarks/spark_train.py`)"),
            ("sequences", "Sequence models through the whole pipeline, beside PyTorch DDP (`benchmarks/sequences.py`)"),
            ("resnet", "A residual net on Fashion-MNIST: accuracy, and speed beside PyTorch DDP "
                       "(`benchmarks/resnet.py`)"),
            ("transformers", "Transformers through the whole pipeline (`benchmarks/transformers.py`)")]
# The README's headline: (section, what the rows show, which rows of the section's first table).
HEADLINE = [("throughput", "CPU, 2 ranks on 2 cores, beside PyTorch DDP, eager and torch.compile",
             lambda row: row["ranks"] == "2" and row["sync"] in ("allreduce (overlapped)", "DDP gloo",
                                                                 "DDP gloo, torch.compile")),
            ("communication", "Bytes each rank sends per step, 4 ranks, MLP", lambda row: row["ranks"] == "4"),
            ("cnn_accuracy", "Conv nets after 10 epochs, 4 ranks, sharing", lambda row: True),
            ("tables", "Tables through ETL, 2-rank training and eval, beside scikit-learn on the same split",
             lambda row: True),
            ("gpu_check", "One GPU beside PyTorch CUDA eager, 1 rank (`make gpu-check`)",
             lambda row: row["model"] in ("MLP", "LeNet"))]


def markers(name: str) -> tuple[str, str]:
    return f"<!-- bench:{name}:begin -->", f"<!-- bench:{name}:end -->"


def replace_between_markers(text: str, content: str, begin: str, end: str) -> str:
    """`text` with everything between `begin` and `end` replaced by `content`; the rest is kept byte for byte."""
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise ValueError(f"expected one {begin} line followed by one {end} line")
    start, stop = text.index(begin) + len(begin), text.index(end)
    return text[:start] + "\n" + content.strip("\n") + "\n" + text[stop:]


def between_markers(text: str, begin: str, end: str) -> str:
    """The text between `begin` and `end` ("" when the markers are missing)."""
    if begin not in text or end not in text:
        return ""
    return text[text.index(begin) + len(begin):text.index(end)]


def machine_line(machine: dict | None) -> str:
    if not machine:
        return "Machine, date and versions were not recorded for this result."
    versions = ", ".join(f"{name} {version}" for name, version in machine["versions"].items() if version)
    return f"Measured {machine['date']} on {machine['arch']}, {machine['cores']} cores; {versions}."


def section_markdown(results_dir: str, name: str, title: str) -> str | None:
    """The section of benchmark `name` from its NAME.json and NAME.md in `results_dir`, or None without them."""
    path = os.path.join(results_dir, name)
    if not (os.path.exists(path + ".json") and os.path.exists(path + ".md")):
        return None
    with open(path + ".json") as f:
        machine = json.load(f).get("machine")
    with open(path + ".md") as f:
        return "\n".join([f"### {title}", "", machine_line(machine), "", f.read().strip("\n")])


def rewrite_page(page: str, results_dir: str) -> tuple[str, list[str]]:
    """`page` with the sections whose results are in `results_dir` rewritten; and their names."""
    rewritten = []
    for name, title in SECTIONS:
        content = section_markdown(results_dir, name, title)
        if content is not None:
            page = replace_between_markers(page, content, *markers(name))
            rewritten.append(name)
    return page, rewritten


def first_table(markdown: str) -> tuple[list[str], list[dict]]:
    """The header and rows ({column: cell}) of the first markdown table in `markdown`."""
    lines = [line.strip() for line in markdown.splitlines()]
    start = next((i for i, line in enumerate(lines) if line.startswith("|")), None)
    if start is None:
        return [], []
    table = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        table.append([cell.strip() for cell in line.strip("|").split("|")])
    header = table[0]
    return header, [dict(zip(header, cells)) for cells in table[2:]]


def headline(page: str) -> str:
    """The README's headline tables: HEADLINE's rows of each section on `page`, as they stand there."""
    parts = []
    for name, caption, chosen in HEADLINE:
        header, rows = first_table(between_markers(page, *markers(name)))
        rows = [row for row in rows if chosen(row)]
        if not rows:
            continue
        parts += [f"**{caption}** ([details](docs/benchmarks.md))", "",
                  "| " + " | ".join(header) + " |", "|" + "---|" * len(header),
                  *("| " + " | ".join(row[column] for column in header) + " |" for row in rows), ""]
    return "\n".join(parts)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default="benchmarks/results")
    parser.add_argument("--page", default="docs/benchmarks.md")
    parser.add_argument("--readme", default="README.md")
    args = parser.parse_args(argv)
    try:
        with open(args.page) as f:
            page, rewritten = rewrite_page(f.read(), args.results)
        with open(args.readme) as f:
            readme = replace_between_markers(f.read(), headline(page), HEADLINE_BEGIN, HEADLINE_END)
    except (OSError, ValueError) as e:
        sys.exit(f"mpitrain.testing.tables: {e}")
    if not rewritten:
        sys.exit(f"{args.results}: no results (NAME.json and NAME.md); run the benchmarks first")
    for path, text in ((args.page, page), (args.readme, readme)):
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)
    print(f"rewrote {', '.join(rewritten)} in {args.page}, and the headline in {args.readme}, from {args.results}")


if __name__ == "__main__":
    main()
