"""Rewrite README.md's measured results from benchmarks/results, touching only the text between the markers.

`make bench` runs this after the benchmarks, so the README shows what their last runs wrote
(each NAME.md table, headed by the machine, date and versions saved in NAME.json), never
figures typed by hand. Benchmarks without a results file are left out.

    python benchmarks/readme_table.py --results benchmarks/results --readme README.md
"""
from __future__ import annotations

import argparse
import json
import os
import sys

BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
SECTIONS = [("throughput", "Throughput per sync mode, beside PyTorch DDP (`benchmarks/throughput.py`)"),
            ("cnn_accuracy", "Conv nets: accuracy after 10 epochs (`benchmarks/cnn_accuracy.py`)"),
            ("communication", "Bytes sent per step and accuracy per sync mode (`benchmarks/communication.py`)"),
            ("scaling", "Scaling and communication cost model (`benchmarks/scaling.py`, "
                        "plot in `benchmarks/results/scaling.png`)"),
            ("kernels", "Threshold kernels (`benchmarks/kernels.py`)"),
            ("throughput_gpu", "One GPU beside PyTorch CUDA (`benchmarks/throughput.py --backend cupy`)"),
            ("kernels_gpu", "Threshold kernels on the GPU (`benchmarks/kernels.py --backend cupy`)"),
            ("soak", "Soak: kill a random rank, resume, 20 times (`benchmarks/soak.py`)"),
            ("dbn", "Deep belief net, pretrained versus not, beside the seed's MNIST figures (`benchmarks/dbn.py`)"),
            ("etl", "Spark ETL beside a single-process conversion (`benchmarks/etl.py`)")]


def replace_between_markers(text: str, content: str, begin: str = BEGIN, end: str = END) -> str:
    """`text` with everything between `begin` and `end` replaced by `content`; the rest is kept byte for byte."""
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise ValueError(f"expected one {begin} line followed by one {end} line")
    start, stop = text.index(begin) + len(begin), text.index(end)
    return text[:start] + "\n" + content.strip("\n") + "\n" + text[stop:]


def machine_line(machine: dict | None) -> str:
    if not machine:
        return "Machine, date and versions were not recorded for this result."
    versions = ", ".join(f"{name} {version}" for name, version in machine["versions"].items() if version)
    return f"Measured {machine['date']} on {machine['arch']}, {machine['cores']} cores; {versions}."


def results_markdown(results_dir: str) -> str:
    """One section per benchmark that left NAME.json and NAME.md in `results_dir` ("" when none did)."""
    parts = []
    for name, title in SECTIONS:
        path = os.path.join(results_dir, name)
        if not (os.path.exists(path + ".json") and os.path.exists(path + ".md")):
            continue
        with open(path + ".json") as f:
            machine = json.load(f).get("machine")
        with open(path + ".md") as f:
            parts += [f"### {title}", "", machine_line(machine), "", f.read().strip("\n"), ""]
    if not parts:
        return ""
    return "\n".join(["Written by `make bench` (`benchmarks/readme_table.py`); do not edit by hand.", "", *parts])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default="benchmarks/results")
    parser.add_argument("--readme", default="README.md")
    args = parser.parse_args(argv)
    content = results_markdown(args.results)
    if not content:
        sys.exit(f"{args.results}: no results (NAME.json and NAME.md); run the benchmarks first")
    try:
        with open(args.readme) as f:
            text = replace_between_markers(f.read(), content)
    except (OSError, ValueError) as e:
        sys.exit(f"{args.readme}: {e}")
    with open(args.readme + ".tmp", "w") as f:
        f.write(text)
    os.replace(args.readme + ".tmp", args.readme)
    print(f"rewrote the results in {args.readme} from {args.results}")


if __name__ == "__main__":
    main()
