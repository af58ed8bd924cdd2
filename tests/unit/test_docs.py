"""The documentation stays true: the generated pages are fresh, every link resolves inside the repository, no
page points outside it, the README's headline is the benchmarks page's (the examples: tests/mpi/test_examples.py)."""
import glob
import os
import re

import pytest

from mpitrain.config.reference import markdown
from mpitrain.nn.losses import LOSSES
from mpitrain.nn.updaters import UPDATERS
from mpitrain.parallel.sync import SYNCHRONIZERS
from mpitrain.testing.launch import REPO
from mpitrain.testing.tables import HEADLINE_BEGIN, HEADLINE_END, between_markers, headline

PAGES = [os.path.join(REPO, "README.md"), *sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")



def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def test_configuration_page_is_generated_from_the_config_dataclasses():
    assert read(os.path.join(REPO, "docs", "configuration.md")) == markdown(), \
        "docs/configuration.md is stale: python -m mpitrain.config.reference > docs/configuration.md"


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
