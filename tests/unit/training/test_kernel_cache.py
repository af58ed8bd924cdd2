"""`mpitrain warm-up` (mpitrain.training.kernel_cache): its cases meet every layer type, loss and optimizer a config
can name, so a new one is warmed too or this fails; and they meet every CPU kernel training, evaluation and
reading use, so a kernel added to mpitrain.kernels is warmed too or named here; `--part I/N` splits the cases and is
checked."""
import subprocess
import sys

import pytest

from mpitrain.cli import main
from mpitrain.nn.layer_types import GRAPH_TYPES, LAYER_TYPES
from mpitrain.nn.losses import LOSSES
from mpitrain.nn.updaters import UPDATERS
from mpitrain.training import kernel_cache


def test_the_cases_meet_every_layer_type_loss_and_optimizer():
    specs = [*kernel_cache.DENSE, *kernel_cache.IMAGES, *sum(kernel_cache.SEQUENCES, []), *kernel_cache.TABLE,
             *kernel_cache.TABLE_TOKENS, *kernel_cache.BAG, *kernel_cache.TOKENS]
    activations = {spec.get("activation") for spec in specs} - {None}
    assert {spec["type"] for spec in specs} | activations == set(LAYER_TYPES) | set(GRAPH_TYPES)
    assert set(kernel_cache.LOSSES) == set(LOSSES)
    assert {options["type"] for options in kernel_cache.OPTIMIZERS} == set(UPDATERS)


# numba kernels no warm-up case calls: helpers compiled into their callers' machine code (a caller loaded from the
# cache never calls them), and the codec's residual clipping (`clip_residual`), an API training does not use
NOT_WARMED = {"mpitrain.kernels.batchnorm._sums", "mpitrain.kernels.batchnorm._sums_across_rows",
              "mpitrain.kernels.threshold.cpu.clip"}
UNMET_KERNELS = """
import importlib, pkgutil
from numba.core.registry import CPUDispatcher
import mpitrain.kernels
from mpitrain.training.kernel_cache import warm_up
warm_up()
for module in pkgutil.walk_packages(mpitrain.kernels.__path__, "mpitrain.kernels."):
    if "cuda" not in module.name:
        for name, kernel in vars(importlib.import_module(module.name)).items():
            if isinstance(kernel, CPUDispatcher) and kernel.__module__ == module.name and not kernel.signatures:
                print(f"{module.name}.{name}")
"""


def test_the_cases_call_every_cpu_kernel():
    """In a process of its own (this one's kernels may hold other tests' signatures): after the warm-up, every
    numba CPU kernel of mpitrain.kernels has been called, so a run's first step loads, not compiles. Before, the
    evaluation's scoring, the stored sequences' reading and padding and the softmax loss's class weights and label
    smoothing were missed: a first run of a sequence model on two ranks took 3.1 s instead of 1.1 s."""
    done = subprocess.run([sys.executable, "-c", UNMET_KERNELS], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert set(done.stdout.split()) <= NOT_WARMED


def test_parts_split_the_cases(capsys):
    ran = []
    cases = kernel_cache.CASES
    try:
        kernel_cache.CASES = [lambda rng, k=k: ran.append(k) for k in range(5)]
        for case in kernel_cache.CASES:
            case.__name__ = "case"
        assert main(["warm-up", "--part", "2/2"]) == 0
        assert main(["warm-up", "--part", "1/2"]) == 0
    finally:
        kernel_cache.CASES = cases
    assert ran == [1, 3, 0, 2, 4] and "warm-up 1/2: numba's cache holds the kernels of its cases" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main(["warm-up", "--part", "3/2"])
    assert exit_.value.code == 2
