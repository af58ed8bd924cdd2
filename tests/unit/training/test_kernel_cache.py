"""`mpitrain warm-up` (mpitrain.training.kernel_cache): its cases meet every layer type, loss and optimizer a config
can name, so a new one is warmed too or this fails; `--part I/N` splits the cases and is checked."""
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
