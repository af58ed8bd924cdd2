"""The sync modes' extension points: each mode's own options composed into the config's `sync` section, its
checkpoint state as one state()/load_state() pair, and sharing's codec slot, filled here by a second codec that the
mode runs without a change."""
import dataclasses

import numpy as np
import pytest

from mpitrain.base.errors import ConfigError
from mpitrain.config.sections import Config, SyncConfig, SyncKeys, ignored_options
from mpitrain.parallel.sync import SYNCHRONIZERS
from mpitrain.parallel.sync import codec as codec_module
from mpitrain.parallel.sync.codec import ThresholdCodec
from mpitrain.parallel.sync.sharing import SharingSync
from tests.unit.parallel.test_sync import one_rank, trained


def names(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def test_the_sync_section_is_the_common_keys_then_every_modes_own():
    assert names(SyncConfig) == names(SyncKeys) + [name for mode in SYNCHRONIZERS.values()
                                                   for name in names(mode.Options)]
    assert names(SYNCHRONIZERS["allreduce"].Options) == ["overlap", "bucket_mb"]
    assert "threshold" in names(SYNCHRONIZERS["sharing"].Options) and not names(SYNCHRONIZERS["none"].Options)


def test_a_key_of_another_mode_is_named_with_the_mode_that_reads_it():
    config = dataclasses.replace(Config(), sync=SyncConfig(mode="allreduce", threshold=0.01, frequency=4).validate("x"))
    assert [each for each in ignored_options(config) if each.startswith("sync.")] == ["sync.frequency (read by averaging only; sync.mode is allreduce)",
                                       "sync.threshold (read by sharing only; sync.mode is allreduce)"]


def test_each_modes_own_checks_run_at_load_whichever_mode_is_chosen():
    with pytest.raises(ConfigError, match=r"run.yaml: sync.adaptive.decay is 1.5, expected a number in \(0, 1\)"):
        SyncConfig(mode="allreduce", adaptive={"decay": 1.5}).validate("run.yaml")
    with pytest.raises(ConfigError, match="run.yaml: pretrain.sync.frequency is 'often', expected a number of steps"):
        SyncConfig(frequency="often").validate("run.yaml", "pretrain.sync")
    assert SyncConfig(residual_clip=True).validate("x").residual_clip == {"factor": 5.0, "every": 5}


def test_a_mode_reads_its_own_options_and_the_common_keys_from_the_config():
    sync = SYNCHRONIZERS["averaging"](one_rank(), SyncConfig(mode="averaging", frequency=3, embeddings="dense"))
    assert sync.options == SYNCHRONIZERS["averaging"].Options(frequency=3, average_updater=False)
    assert sync.config.embeddings == "dense"


def test_state_is_the_named_attributes_and_load_state_takes_back_numbers_of_its_own_only():
    sync = SYNCHRONIZERS["sharing"](one_rank(), SyncConfig(mode="sharing", threshold=0.01).validate("test"))
    trained(sync.config, steps=3, sync=sync, end_epoch=False)
    state = sync.state()
    assert set(state) == {"tau", "steps", "residual"} and state["residual"] is sync.residual and state["steps"] == 3
    again = SYNCHRONIZERS["sharing"](one_rank(), sync.config)
    trained(sync.config, steps=1, sync=again, end_epoch=False)
    again.load_state({"tau": state["tau"], "steps": 3, "steps_since_average": 7}, {"residual": state["residual"]})
    assert (again.tau, again.steps) == (state["tau"], 3) and not hasattr(again, "steps_since_average")
    assert np.array_equal(again.residual, sync.residual) and again.residual is not sync.residual


class HalvingCodec(ThresholdCodec):
    """A second codec: threshold messages whose values are applied at half strength, carried by allgather only."""

    exchanges = ("allgather",)
    decoded = 0

    def decode(self, message, params, scale):
        HalvingCodec.decoded += 1
        return super().decode(message, params, scale / 2)


def test_a_second_codec_fills_the_slot_and_the_mode_runs_it_unchanged(monkeypatch):
    monkeypatch.setitem(codec_module.CODECS, "halving", HalvingCodec)
    monkeypatch.setattr("mpitrain.parallel.sync.sharing.CODECS", codec_module.CODECS)
    fixed = {"threshold": 0.01, "adaptive": False, "residual_clip": False}
    config = dataclasses.replace(SyncConfig(mode="sharing", **fixed).validate("test"), codec="halving",
                                 exchange="auto")
    sync = SharingSync(one_rank(), config)
    start = trained(SyncConfig(mode="none"), steps=0)
    halved = trained(config, steps=4, sync=sync, end_epoch=False)
    whole = trained(SyncConfig(mode="sharing", **fixed).validate("test"), steps=4, end_epoch=False)
    assert HalvingCodec.decoded == 4 and sync.metrics()["allgather_steps"] == 4
    assert not np.array_equal(halved, whole) and np.abs(halved - start).max() < np.abs(whole - start).max()
