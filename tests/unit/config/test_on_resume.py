"""What may change on resume: every key has a rule, declared beside it, and `first_change` names the first key a
resume may not change, down to the entry that differs."""
import dataclasses

import yaml

from mpitrain.base.options import ALLOWED, AT_EPOCH_END, REFUSED, Options, option
from mpitrain.config.on_resume import first_change, global_batch_change, resume_rules
from mpitrain.config.sections import Config, DataConfig, ModelConfig, config_yaml


def as_recorded(**sections) -> dict:
    """A config as a checkpoint records it (config.yaml's mapping), with `sections` replaced."""
    config = dataclasses.replace(Config(data=DataConfig(path="/d"), model=ModelConfig(
        layers=[{"type": "dense", "units": 4}, {"type": "dropout", "rate": 0.2}])), **sections)
    return yaml.safe_load(config_yaml(config))


def test_every_key_has_a_rule_and_a_section_refuses_unless_it_says_otherwise():
    rules = resume_rules()
    assert set(rules.values()) <= {REFUSED, AT_EPOCH_END, ALLOWED}
    assert all(key in rules for key in ("data.normalize", "sync.mode", "pretrain.sync.mode", "checkpoint.keep"))
    assert {key for key, rule in rules.items() if rule == REFUSED} == {
        "data.normalize", "data.standardize_targets", "model.layers", "model.graph", "model.loss", "model.loss_options", "model.dtype",
        "model.target", "optimizer.type", "optimizer.amsgrad", "pretrain.layers"}
    assert {key for key, rule in rules.items() if rule == AT_EPOCH_END} == {
        "data.train_split", "data.shuffle", "data.max_rows", "train.batch_size", "train.global_batch_size",
        "train.accumulate", "train.seed"}

    @dataclasses.dataclass(frozen=True)
    class NewSection(Options):  # a section someone adds: its keys are kept until they say otherwise
        new_key: int = option(1, "A new key.")
        free_key: int = option(1, "A key declared free.", on_resume=ALLOWED)

    assert resume_rules(NewSection) == {"new_key": REFUSED, "free_key": ALLOWED}


def test_first_change_names_the_entry_that_differs_and_only_keys_that_may_not_change():
    saved = as_recorded()
    assert first_change(saved, as_recorded(), mid_epoch=True) is None
    normalize = as_recorded(data=DataConfig(path="/d", normalize=False))
    assert first_change(saved, normalize, mid_epoch=False) == ("data.normalize", True, False, REFUSED)
    rate = as_recorded(model=ModelConfig(layers=[{"type": "dense", "units": 4}, {"type": "dropout", "rate": 0.5}]))
    assert first_change(saved, rate, mid_epoch=False) == ("model.layers[1].rate", 0.2, 0.5, REFUSED)
    moved = as_recorded(data=DataConfig(path="/elsewhere", shuffle=False))  # where it lies: allowed; the order:
    assert first_change(saved, moved, mid_epoch=False) is None                # at an epoch's end only
    assert first_change(saved, moved, mid_epoch=True) == ("data.shuffle", True, False, AT_EPOCH_END)
    del saved["data"]["normalize"]  # a checkpoint of an older version: keys it lacks are not compared
    assert first_change(saved, normalize, mid_epoch=False) is None


def test_the_global_batch_is_compared_by_what_it_gives_on_any_number_of_ranks():
    saved = as_recorded()  # batch_size 64, global_batch_size 0
    assert global_batch_change(saved, as_recorded(), 128, 128, 2) is None
    assert global_batch_change(saved, as_recorded(), 0, 64, 1) is None  # a checkpoint that recorded no order
    assert global_batch_change(saved, as_recorded(), 128, 192, 3) == \
        "a global batch of 128 rows; the number of ranks changed, so this run's is 192 (train.batch_size 64 x 3 ranks)"
    assert global_batch_change({}, as_recorded(), 128, 192, 3) == \
        "a global batch of 128 rows; this run's is 192 (train.batch_size 64 x 3 ranks)"  # it recorded no config
    bigger = as_recorded(train=dataclasses.replace(Config().train, batch_size=32))
    assert global_batch_change(saved, bigger, 128, 64, 2) == \
        "a global batch of 128 rows; train.batch_size was 64, so this run's is 64 (train.batch_size 32 x 2 ranks)"
