"""The documentation stays true: the generated pages are fresh, every link resolves inside the repository,
no page points outside it, and the two example scripts run under `mpiexec -n 2` (the README's quick
start runs in tests/test_fashion.py)."""
import glob
import os
import re
import sys

import h5py
import pytest

from conftest import MPITRAIN, make_digits_dataset, mpiexec
from mpitrain.checkpoint import list_checkpoints, load_checkpoint
from mpitrain.config_reference import markdown
from mpitrain.nn.losses import LOSSES
from mpitrain.nn.updaters import UPDATERS
from mpitrain.sync import SYNCHRONIZERS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = [os.path.join(REPO, "README.md"), *sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")

sys.path.insert(0, os.path.join(REPO, "benchmarks"))
from readme_table import HEADLINE_BEGIN, HEADLINE_END, between_markers, headline  # noqa: E402


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def test_configuration_page_is_generated_from_the_config_dataclasses():
    assert read(os.path.join(REPO, "docs", "configuration.md")) == markdown(), \
        "docs/configuration.md is stale: python -m mpitrain.config_reference > docs/configuration.md"


def test_configuration_page_names_every_key_and_the_registries_choices():
    page = markdown()
    for key in ("`data.path`", "`sync.mode`", "`pretrain.sync.mode`", "`checkpoint.keep`", "`comm.cuda_aware`",
                "`backend`", "`train.watchdog_s`"):
        assert key in page
    rows = {line.split("|")[1].strip(" `"): line.split("|")[4].strip() for line in page.splitlines()
            if line.startswith("| `")}
    assert rows["sync.mode"] == ", ".join(SYNCHRONIZERS) and "sharing" in rows["sync.mode"]
    assert rows["optimizer.type"] == ", ".join(UPDATERS) and "adam" in rows["optimizer.type"]
    assert rows["model.loss"] == ", ".join(LOSSES)


@pytest.mark.parametrize("page", PAGES, ids=[os.path.relpath(p, REPO) for p in PAGES])
def test_every_relative_link_resolves_inside_the_repository(page):
    text = read(page)
    assert "../shared" not in text and "DESIGN.md" not in text
    links = [target for target in LINK.findall(text) if not re.match(r"[a-z]+:|#", target)]
    assert links, f"{page} links nowhere"
    for target in links:
        path = os.path.normpath(os.path.join(os.path.dirname(page), target.split("#")[0]))
        assert path.startswith(REPO + os.sep) and os.path.exists(path), f"{page}: broken link {target}"


def test_readme_headline_is_copied_from_the_benchmarks_page():
    readme = read(os.path.join(REPO, "README.md"))
    expected = headline(read(os.path.join(REPO, "docs", "benchmarks.md")))
    assert between_markers(readme, HEADLINE_BEGIN, HEADLINE_END).strip("\n") == expected.strip("\n")
    assert "| MLP | mpitrain | 2 | allreduce (overlapped) |" in expected  # a row the headline must pick


def test_readme_is_a_front_door():
    assert len(read(os.path.join(REPO, "README.md")).splitlines()) <= 160


def test_examples_run_under_mpiexec_and_their_runs_evaluate_like_any_other(tmp_path):
    make_digits_dataset(tmp_path / "digits")
    outputs, printed = {}, {}
    for script, epochs in (("mlp_sharing.py", 2), ("custom_layers.py", 1)):
        run_dir = tmp_path / script
        result = mpiexec(2, sys.executable, os.path.join(REPO, "examples", script), tmp_path / "digits",
                         "--run-dir", run_dir, "--epochs", epochs, timeout=180)
        assert result.returncode == 0, result.stdout + result.stderr
        accuracy = float(re.search(r"test accuracy (\d\.\d+)", result.stdout).group(1))
        assert accuracy > 0.3  # 10 classes: chance is 0.1
        outputs[script], printed[script] = accuracy, result.stdout
        assert (run_dir / "config.yaml").exists() and (run_dir / "summary.json").exists()
    assert re.search(r"bytes sent per step per rank \((\d+\.\d+)% of a dense gradient\)", printed["mlp_sharing.py"])
    evaluated = mpiexec(2, MPITRAIN, "eval", tmp_path / "custom_layers.py", timeout=120)
    assert evaluated.returncode == 0, evaluated.stderr
    assert f"accuracy {outputs['custom_layers.py']:.4f}" in evaluated.stdout  # the config.yaml rebuilt the model
    run = tmp_path / "mlp_sharing.py"  # its synchronizer replaced the config's allreduce: both files say sharing
    saved = load_checkpoint(list_checkpoints(str(run))[-1]).config_yaml
    assert saved == (run / "config.yaml").read_text() and "mode: sharing" in saved
    predicted = mpiexec(2, MPITRAIN, "predict", tmp_path / "mlp_sharing.py", timeout=120)
    assert predicted.returncode == 0, predicted.stderr
    with h5py.File(tmp_path / "mlp_sharing.py" / "predictions-test.h5") as f:
        assert f"{(f['predicted'][...] == f['label'][...]).mean():.4f}" == f"{outputs['mlp_sharing.py']:.4f}"
