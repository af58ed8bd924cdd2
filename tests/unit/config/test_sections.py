"""Config loading: defaults, overrides, and one clear error per bad key or value."""
import os
import re
import subprocess
import sys

import pytest

from mpitrain.base.errors import ConfigError
from mpitrain.config.sections import config_yaml, ignored_options, load_config
from mpitrain.testing import launch

REPO = launch.REPO


def write(tmp_path, text):
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    return str(path)


def test_shipped_config_loads_with_overrides():
    config = load_config(os.path.join(REPO, "configs/fashion_mlp.yaml"),
                         ["sync.mode=averaging", "sync.frequency=5", "optimizer.lr=1e-3", "train.epochs=2"])
    assert config.sync.mode == "averaging" and config.sync.frequency == 5
    assert config.optimizer.lr == pytest.approx(1e-3) and config.train.epochs == 2
    assert config.run_dir == os.path.abspath("runs/fashion_mlp")
    assert os.path.isabs(config.data.path)


def test_frequency_epoch_and_run_dir(tmp_path):
    config = load_config(write(tmp_path, "data: {path: d}\nmodel: {layers: [{type: dense, units: 2}]}\n"
                                         "sync: {mode: averaging, frequency: epoch}\nrun_dir: out/r1\n"))
    assert config.sync.frequency == "epoch" and config.run_dir == os.path.abspath("out/r1")


@pytest.mark.parametrize("text, override, message", [
    ("sync: {modee: allreduce}", [], r"unknown key 'sync.modee'; did you mean 'sync.mode'\?"),
    ("train: {watchdog_s: 0}", [], r"train.watchdog_s is 0.0"),
    ("bogus: 1", [], r"unknown key 'bogus'"),
    ("sync: {mode: ring}", [], r"sync.mode is 'ring', expected one of"),
    ("sync: {frequency: 0}", [], r"sync.frequency is 0"),
    ("sync: {bucket_mb: -1}", [], r"sync.bucket_mb is -1.0, expected a number in \[0, 1e6\]"),
    ("sync: {overlap: sometimes}", [], r"sync.overlap is 'sometimes', expected bool"),
    ("train: {epochs: two}", [], r"train.epochs is 'two', expected int"),
    ("train: {batch_size: 0}", [], r"train.batch_size is 0"),
    ("optimizer: {lr: -1}", [], r"optimizer.lr is -1.0"),
    ("optimizer: {type: lbfgs}", [], r"optimizer.type is 'lbfgs'"),
    ("", ["train.epochs"], r"expected section.key=value"),
    ("", ["checkpoint.unit=hour"], r"checkpoint.unit is 'hour'"),
    ("", ["resume=sometimes"], r"resume is 'sometimes'"),
    ("sync: {mode: sharing, adaptive: {decay: 2}}", [], r"sync.adaptive.decay is 2.0"),
    ("sync: {mode: sharing, adaptive: {speed: 2}}", [], r"unknown key sync.adaptive.speed"),
    ("sync: {mode: sharing, residual_clip: {every: 0}}", [], r"sync.residual_clip.every is 0"),
    ("sync: {mode: sharing, encoding: zip}", [], r"sync.encoding is 'zip'"),
    ("sync: {mode: sharing, exchange: ring}", [], r"sync.exchange is 'ring', expected one of \('auto', 'allgather', "
                                                  r"'split', 'recursive'\)"),
    ("sync: {mode: sharing, link_gbps: 0}", [], r"sync.link_gbps is 0.0, expected a number in \(0, 1e5\]"),
    ("", ["sync.latency_us=-1"], r"sync.latency_us is -1.0, expected a number in \[0, 1e7\]"),
    ("", ["data.augment={shift: -1}"], r"data.augment.shift is -1"),
    ("", ["data.augment={rotate: 10}"], r"unknown key data.augment.rotate"),
    ("", ["model.loss=regression"], r"model.loss is 'regression', expected one of \('softmax_cross_entropy', "),
    ("", ["model.loss_options={pos_weight: 2}"], r"unknown key model.loss_options.pos_weight for loss "
                                                 r"softmax_cross_entropy; expected one of \['class_weights', 'label_smoothing'\]"),
    ("", ["model.loss=huber", "model.loss_options.delta=0"], r"model.loss_options.delta is 0, expected a positive"),
    ("backend: tpu", [], r"backend is 'tpu', expected one of \('auto', 'numpy', 'cupy'\)"),
    ("comm: {cuda_aware: maybe}", [], r"comm.cuda_aware is 'maybe', expected one of \('auto', True, False\)"),
    ("comm: {cuda_aware: 1}", [], r"comm.cuda_aware is 1, expected bool or str"),
    ("train: {cuda_graph: maybe}", [], r"train.cuda_graph is 'maybe', expected one of \('auto', True, False\)"),
    ("train: {cuda_graph: true}", [], r"train.cuda_graph is True, expected auto or false with backend: numpy"),
    ("[1, 2]", [], r"expected a mapping"),
])
def test_bad_configs_name_the_key(tmp_path, text, override, message):
    base = "data: {path: d}\nmodel: {layers: [{type: dense, units: 2}]}\n"
    text = text if text.startswith("[") else base + text
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=message) as error:
        load_config(path, override)
    assert "exp.yaml" in str(error.value) or override


def test_sharing_options(tmp_path):
    base = "data: {path: d}\nmodel: {layers: [{type: dense, units: 2}]}\n"
    config = load_config(write(tmp_path, base + "sync: {mode: sharing, adaptive: {max_sparsity: 0.05}}\n"))
    assert config.sync.adaptive == {"min_sparsity": 1e-4, "max_sparsity": 0.05, "decay": 0.965936}
    assert config.sync.residual_clip == {"factor": 5.0, "every": 5}
    config = load_config(write(tmp_path, base + "sync: {mode: sharing, adaptive: false, residual_clip: false}\n"))
    assert config.sync.adaptive is False and config.sync.residual_clip is False
    assert (config.sync.exchange, config.sync.latency_us, config.sync.link_gbps) == ("auto", 1.0, 100.0)
    assert ignored_options(config) == []


def test_the_exchange_and_its_network_are_sharing_options(tmp_path):
    base = "data: {path: d}\nmodel: {layers: [{type: dense, units: 2}]}\n"
    config = load_config(write(tmp_path, base + "sync: {mode: allreduce, exchange: split, link_gbps: 10}\n"),
                         ["pretrain.sync.latency_us=2"])
    assert ignored_options(config) == ["sync.exchange (read by sharing only; sync.mode is allreduce)",
                              "sync.link_gbps (read by sharing only; sync.mode is allreduce)",
                              "pretrain.sync.latency_us (read by sharing only; pretrain.sync.mode is averaging)"]
    config = load_config(write(tmp_path, base + "sync: {mode: sharing, exchange: split, link_gbps: 10}\n"))
    assert ignored_options(config) == [] and config.sync.exchange == "split" and config.sync.link_gbps == 10.0


def test_augment_options(tmp_path):
    path = write(tmp_path, "data: {path: d}\nmodel: {layers: [{type: dense, units: 2}]}\n")
    assert load_config(path).data.augment is False
    assert load_config(path, ["data.augment=true"]).data.augment == {"flip": True, "shift": 2}
    assert load_config(path, ["data.augment={shift: 1}"]).data.augment == {"flip": True, "shift": 1}


def test_backend_and_cuda_aware_choices(tmp_path):
    base = "data: {path: d}\nmodel: {layers: [{type: dense, units: 2}]}\n"
    config = load_config(write(tmp_path, base))
    assert config.backend == "numpy" and config.comm.cuda_aware == "auto"
    config = load_config(write(tmp_path, base + "backend: auto\ncomm: {cuda_aware: false}\n"))
    assert config.backend == "auto" and config.comm.cuda_aware is False and config.train.cuda_graph == "auto"
    config = load_config(write(tmp_path, base + "backend: cupy\ntrain: {cuda_graph: true}\n"))
    assert config.train.cuda_graph is True  # refused at start where no GPU is (test_step_graph's `graphed`)


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(str(tmp_path / "nope.yaml"))
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "data: [unclosed"))


def test_logging_keeps_other_libraries_info_out():
    code = ("import logging; from mpitrain.cli import setup_logging; setup_logging(0); "
            "logging.getLogger('numba.cuda.cudadrv.driver').info('add pending dealloc'); "
            "logging.getLogger('numba.cuda.cudadrv.driver').warning('a library warning'); "
            "logging.getLogger('mpitrain').info('epoch 1/2 done'); logging.getLogger('mpitrain.data.reader').info('rows')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == ["[numba.cuda.cudadrv.driver] a library warning", "[mpitrain] epoch 1/2 done",
                                          "[mpitrain.data.reader] rows"]


BASE = "data: {path: d}\nmodel: {layers: [{type: dense, units: 2}]}\n"


@pytest.mark.parametrize("text, override, message", [
    (BASE + "train:\n\tepochs: 2\n", [], r"^{path}:4:1: not valid YAML: found character '\\t' that cannot start any "
                                         r"token \(YAML indents with spaces, not tabs\)$"),
    (BASE + "train: {epochs: 2\n", [], r"^{path}:4:1: not valid YAML: expected ',' or '}}', but got '<stream end>', "
                                      r"while parsing a flow mapping that starts at 3:8$"),
    (BASE + "train:\n  epochs: 2\n   seed: 3\n", [], r"^{path}:5:8: not valid YAML: mapping values are not allowed "
                                                    r"here \(a `key: value` where a plain value belongs"),
    (BASE + "train: {epochs: 2}\ntrain: {seed: 1}\n", [], r"^{path}:4:1: 'train' appears twice \(also at line 3\)"),
    (BASE, ["x=["], r"^--set x=\[: at character 2 of the value: not valid YAML: expected the node content, but "
                    r"found '<stream end>', while parsing a flow node that starts at character 2 of the value$"),
    (BASE, ["train.epochs={a: 1, a: 2}"], r"^--set train.epochs=\{{a: 1, a: 2\}}: at character 8 of the value: 'a' appears twice"),
    (BASE, ["epochs=3"], r"^--set epochs=3: unknown key 'epochs'; did you mean 'train.epochs'\? expected one of"),
    (BASE, ["train.epoch=3"], r"^--set train.epoch=3: unknown key 'train.epoch'; did you mean 'train.epochs'\?"),
    (BASE, ["train.seed=1", "train.epochs=abc"], r"^--set train.epochs=abc: train.epochs is 'abc', expected int$"),
    (BASE, ["train.epochs=5", "train.epochs=0"], r"^--set train.epochs=0: train.epochs is 0, expected an integer in"),
    (BASE, ["sync.adaptive={decay: 2}"], r"^--set sync.adaptive=\{{decay: 2\}}: sync.adaptive.decay is 2"),
    (BASE, ["model.layers=[{type: dense, units: 0}]"], r"^--set model.layers=\[.*\]: model.layers\[0\].units is 0"),
    (BASE + "train: {epochs: 0}\n", ["train.seed=2"], r"^{path}: train.epochs is 0, expected an integer in"),
    ("data: {path: d}\nmodel: {layers: [{type: dense, units: 2}]}\nepochs: 3\n", [],
     r"^{path}: unknown key 'epochs'; did you mean 'train.epochs'\?"),
], ids=["tab", "unclosed-flow", "bad-indent", "duplicate", "set-unclosed", "set-duplicate", "set-unknown-section",
        "set-unknown-key", "set-wrong-type", "set-last-wins", "set-nested", "set-layer", "file-blamed-for-its-own",
        "file-unknown"])
def test_each_mistake_is_one_line_naming_where_it_was_made(tmp_path, text, override, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=message.format(path=re.escape(path))) as error:
        load_config(path, override)
    assert "\n" not in str(error.value)


def laughs(levels: int) -> str:
    """A "billion laughs" value: `levels` lists, each of 9 aliases of the one before (9^levels strings)."""
    lists = ["&a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"] + \
        [f"&a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return f"[{', '.join(lists)}]"


@pytest.mark.parametrize("text, override, message", [
    (BASE + f"train: {{seed: {laughs(9)}}}\n", [], r"^{path}: its aliases expand the 36 values written into "
                                                   r"490,329,072; expected at most 100,000 values more than written"),
    (BASE, [f"train.seed={laughs(9)}"], r"^--set train.seed=.*: its aliases expand the 19 values written into "),
    (BASE + "train: {seed: &a [*a]}\n", [], r"^{path}:3:15: this anchored value holds itself through an alias"),
    ("data: {path: d}\nmodel: {layers: &l [{type: dense, units: 2}, *l]}\n", [],
     r"^{path}:2:17: this anchored value holds itself through an alias"),
    (BASE + "train: {seed: " + "[" * 3000 + "]" * 3000 + "}\n", [], r"^{path}: nested too deeply for PyYAML to read"),
    (BASE + f"train: {{seed: {laughs(4)}}}\n", [], r"^{path}: train.seed is \[\['lol', .{{0,400}}\], expected int$"),
    (BASE + f"train: {{seed: {list(range(100_000))}}}\n", [], r"^{path}: train.seed is \[0, 1, 2, 3, 4, 5, 6, 7, "
                                                              r"\.\.\.\], expected int$"),
], ids=["billion-laughs", "set-billion-laughs", "holds-itself", "layers-hold-themselves", "nested-3000-deep",
        "aliased-value-shown-short", "long-list-shown-short"])
def test_a_config_that_aliases_or_nesting_make_huge_is_one_short_line(tmp_path, text, override, message):
    """Before: a 500-byte config of aliases of aliases ran for minutes, growing without bound, to print a repr of
    490 million strings; a value holding itself (`&l [..., *l]`) and nesting 3,000 deep were a RecursionError
    traceback on every rank (exit 1)."""
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=message.format(path=re.escape(path))) as error:
        load_config(path, override)
    assert "\n" not in str(error.value) and len(str(error.value)) < 1000


def test_user_yaml_is_read_by_one_function():
    """Every YAML a user wrote goes through mpitrain.config.yaml_input.read_yaml: its errors are one line."""
    import pathlib
    root = pathlib.Path(__file__).parents[3]
    readers = [str(p.relative_to(root)) for folder in ("mpitrain", "etl") for p in (root / folder).rglob("*.py")
               if re.search(r"yaml\.(safe_|full_|unsafe_)?load\(", p.read_text())]
    assert readers == ["mpitrain/config/yaml_input.py"]


def test_a_runs_own_config_yaml_warns_only_for_what_the_user_set(tmp_path):
    user = load_config(write(tmp_path, BASE + "sync: {mode: allreduce, threshold: 0.01}\npretrain: {epochs: 3}\n"))
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(config_yaml(user))
    (run / "metrics.jsonl").write_text("")
    again = load_config(str(run / "config.yaml"))
    assert ignored_options(again) == ignored_options(user) == ["sync.threshold (read by sharing only; sync.mode is "
                                                               "allreduce)"]
    for mode in ("none", "averaging", "sharing"):
        assert ignored_options(load_config(str(run / "config.yaml"), [f"sync.mode={mode}", "sync.threshold=0.001"])) \
            == []
