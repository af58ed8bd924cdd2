"""`comm.device_collectives` (mpitrain/parallel/nccl.py) without a GPU: which jobs NCCL serves, decided alike on every
rank, with the device query (GPU count, NCCL in cupy) faked at its boundary; `nccl` refused with the reason where a
rank cannot have it; `mpi` never asks. The NCCL collectives themselves run in tests/system/test_gpu.py."""
from types import SimpleNamespace

import numpy as np
import pytest
from mpi4py import MPI

from mpitrain.base.errors import ConfigError
from mpitrain.config.sections import CommConfig
from mpitrain.parallel import nccl
from mpitrain.parallel.comm import Communicator, StagedCommunicator
from mpitrain.parallel.nccl import unique_id_message, unique_id_of, wants_nccl, why_not_nccl


class Job:
    """A rank of a job: its node's rank count, and what the other ranks answer to an allgather."""

    def __init__(self, local_size: int, others=()):
        self.local_size, self.others = local_size, list(others)

    def allgather_obj(self, value) -> list:
        return [value, *self.others]


def test_auto_takes_nccl_only_where_every_rank_has_a_gpu_of_its_own_and_cupy_has_nccl():
    assert wants_nccl("auto", Job(2), devices=2, available=True)
    assert wants_nccl("auto", Job(1), devices=8, available=True)
    assert not wants_nccl("auto", Job(2), devices=1, available=True)  # two ranks would share GPU 0
    assert not wants_nccl("auto", Job(1), devices=1, available=False)
    assert not wants_nccl("auto", Job(1, others=[None, "cupy has no NCCL"]), devices=1, available=True)  # another rank


def test_nccl_where_a_rank_cannot_have_it_is_one_error_naming_the_key_the_reason_and_the_rank():
    with pytest.raises(ConfigError, match=r"comm.device_collectives: 'nccl', but 4 ranks on a node with 2 GPU\(s\) "
                                          r"share GPUs .* needs a GPU per rank \(seen on rank 0\); use auto or mpi"):
        wants_nccl("nccl", Job(4), devices=2, available=True)
    with pytest.raises(ConfigError, match=r"cupy has no NCCL .* \(seen on rank 2\)"):
        wants_nccl("nccl", Job(1, others=[None, why_not_nccl(1, 1, False)]), devices=1, available=True)
    assert wants_nccl("nccl", Job(2, others=[None]), devices=4, available=True)


def test_mpi_never_asks_for_the_devices(monkeypatch):
    def no_query():
        raise AssertionError("the device query ran under comm.device_collectives: mpi")
    monkeypatch.setattr(nccl, "device_count", no_query)
    monkeypatch.setattr(nccl, "nccl_available", no_query)
    assert not wants_nccl("mpi", Job(8), devices=0, available=False)
    comm = Communicator(MPI.COMM_SELF).for_backend(SimpleNamespace(on_gpu=True), False, "mpi")
    assert type(comm) is StagedCommunicator and comm.device_collectives == "mpi"


def test_for_backend_keeps_mpi_without_nccl_and_refuses_nccl_there(monkeypatch):
    monkeypatch.setattr(nccl, "device_count", lambda: 1)
    monkeypatch.setattr(nccl, "nccl_available", lambda: False)
    gpu = SimpleNamespace(on_gpu=True)
    assert type(Communicator(MPI.COMM_SELF).for_backend(gpu, False, "auto")) is StagedCommunicator
    with pytest.raises(ConfigError, match="cupy has no NCCL"):
        Communicator(MPI.COMM_SELF).for_backend(gpu, False, "nccl")
    cpu = Communicator(MPI.COMM_SELF).for_backend(SimpleNamespace(on_gpu=False), False, "nccl")  # numpy: MPI's
    assert type(cpu) is Communicator and cpu.device_collectives == "mpi"


def test_the_unique_id_crosses_mpi_as_int32s_and_comes_back_in_the_form_cupy_made_it():
    as_bytes = bytes(range(128))  # CuPy 14
    as_chars = tuple(range(-64, 64))  # CuPy 13: signed chars
    for uid in (as_bytes, as_chars):
        message = unique_id_message(uid)
        assert message.dtype == np.int32 and message.shape == (129,)
        assert unique_id_of(message) == uid and type(unique_id_of(message)) is type(uid)
    assert not unique_id_message(None).any()  # what a receiving rank hands to the Bcast


def test_the_setting_is_checked_against_its_domain_at_load():
    assert CommConfig(device_collectives="nccl").validate("run.yaml").device_collectives == "nccl"
    with pytest.raises(ConfigError, match=r"comm.device_collectives is 'gloo', expected one of \('auto', 'nccl', 'mpi'\)"):
        CommConfig(device_collectives="gloo").validate("run.yaml")
