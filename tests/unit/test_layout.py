"""docs/architecture.md's layout table lists every module of the package, and no module that is gone; the ground
floor (mpitrain/base/) imports nothing above it."""
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


def mpitrain_imports(path: str) -> set[str]:
    """The mpitrain modules a file imports, at its top or inside a function (absolute imports: the package uses
    no relative ones outside kernels/)."""
    import ast
    with open(path) as f:
        tree = ast.parse(f.read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.split(".")[0] == "mpitrain"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "mpitrain":
            found.add(node.module)
    return found


def test_the_ground_floor_imports_nothing_of_mpitrain_above_it():
    """mpitrain/base/ holds what every floor uses (errors, array_module, the workspace, the atomic file writer, the
    thread plan); it imports only itself, so any module may use it without a cycle (docs/architecture.md)."""
    ground = sorted(glob.glob(os.path.join(REPO, "mpitrain", "base", "*.py")))
    assert len(ground) >= 6
    above = {os.path.relpath(path, REPO): sorted(m for m in mpitrain_imports(path) if not m.startswith("mpitrain.base"))
             for path in ground}
    assert {path: modules for path, modules in above.items() if modules} == {}


def test_setup_py_installs_every_package_folder():
    """Each folder with an __init__.py is in setup.py's `packages` (under its installed name), else a wheel would
    leave it out: an editable install finds it anyway, so only this test notices."""
    installed_as = {"mpitrain": "mpitrain", "etl": "mpitrain.etl", "kernels": "mpitrain.kernels",
                    os.path.join("tests", "harness"): "mpitrain.testing"}
    folders = set()
    for folder, name in installed_as.items():
        for init in glob.glob(os.path.join(REPO, folder, "**", "__init__.py"), recursive=True):
            inside = os.path.relpath(os.path.dirname(init), os.path.join(REPO, folder))
            folders.add(name if inside == "." else name + "." + inside.replace(os.sep, "."))
    with open(os.path.join(REPO, "setup.py")) as f:
        listed = re.search(r"packages=\[(.*?)\]", f.read(), re.S).group(1)
    assert folders - set(re.findall(r'"([\w.]+)"', listed)) == set()


# The floors, lowest first (docs/architecture.md#layout): a module imports its own floor and those below, never one
# above. `mpitrain` itself (the package: the thread plan, the version, the API's names loaded on first use) is
# reachable from every floor.
FLOORS = ("base", "kernels", "data", "nn", "parallel", "config", "rundir", "training", "spark", "etl", "tune",
          "arguments", "api", "cli", "__main__")


def floor_of(module: str) -> str:
    """The floor of an installed module name: mpitrain.X..., mpitrain.etl..., mpitrain.kernels..."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "mpitrain"


def installed_modules() -> dict[str, str]:
    """{installed module name: its file} of mpitrain, etl/ and kernels/ (not the test harness)."""
    found = {}
    for folder, name in (("mpitrain", "mpitrain"), ("etl", "mpitrain.etl"), ("kernels", "mpitrain.kernels")):
        for path in glob.glob(os.path.join(REPO, folder, "**", "*.py"), recursive=True):
            inside = os.path.relpath(path, os.path.join(REPO, folder))[:-3].replace(os.sep, ".")
            if folder == "mpitrain" and inside.split(".")[0] in ("etl", "kernels"):
                continue
            found[name if inside == "__init__" else f"{name}.{inside.removesuffix('.__init__')}"] = path
    return found


def test_no_module_imports_a_floor_above_its_own():
    """Relative imports (kernels/ uses them) stay inside a folder, so the absolute ones are all that can climb."""
    upward = {}
    for module, path in installed_modules().items():
        floor = floor_of(module)
        if floor == "mpitrain":
            continue
        assert floor in FLOORS, f"{module}: its folder {floor!r} is not in FLOORS (tests/unit/test_layout.py)"
        for imported in mpitrain_imports(path):
            to = floor_of(imported)
            if to != "mpitrain" and FLOORS.index(to) > FLOORS.index(floor):
                upward.setdefault((floor, to), []).append(f"{module} imports {imported}")
    assert upward == {}
