"""docs/architecture.md's layout table lists every module of the package, and no module that is gone."""
import glob
import os
import re

from mpitrain.testing.launch import REPO

PACKAGE_FOLDERS = ("mpitrain", "etl", "kernels", os.path.join("tests", "harness"))


def modules_on_disk() -> set[str]:
    found = set()
    for folder in PACKAGE_FOLDERS:
        for path in glob.glob(os.path.join(REPO, folder, "**", "*.py"), recursive=True):
            if os.path.basename(path) != "__init__.py":
                found.add(os.path.relpath(path, REPO))
    return found


def modules_in_the_table() -> set[str]:
    with open(os.path.join(REPO, "docs", "architecture.md")) as f:
        text = f.read()
    table = text[text.index("## Layout"):]
    table = table[:table.index("\n\n", table.index("| path |"))]
    listed = re.findall(r"^\| `([\w/]+\.py)` \|", table, re.MULTILINE)
    return {path for path in listed if path.startswith(tuple(f + "/" for f in PACKAGE_FOLDERS))
            and os.path.basename(path) != "__init__.py"}


def test_the_layout_table_lists_every_module_and_only_those():
    on_disk, listed = modules_on_disk(), modules_in_the_table()
    assert len(on_disk) > 50
    assert on_disk - listed == set(), "modules missing from docs/architecture.md's layout table"
    assert listed - on_disk == set(), "modules in docs/architecture.md's layout table that do not exist"
