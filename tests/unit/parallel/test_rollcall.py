"""The roll-call's record and verdict (mpitrain/parallel/rollcall.py) without MPI: the ring keeps the last
collectives in order with their phase and the step, and the verdict names the rank that is not where the most
are, where the others wait, ranks that wrote nothing, and says so when every rank is in the same collective."""
from mpitrain.parallel.rollcall import ALLREDUCE, BCAST, DATA_READ, STEP, RollCall, verdict


def state(rank, phase="forward, backward and the update", where="epoch 1 step 3", collective=None, host="n1"):
    return {"rank": rank, "host": host, "phase": phase, "where": where, "phase_seconds": 4.0,
            "collective": None if collective is None else {"name": collective, "seq": 7, "seconds": 3.5}}


def test_the_ring_keeps_the_last_collectives_in_order_with_their_phase_and_step():
    calls = RollCall(2, "n1", capacity=4)
    calls.at(DATA_READ, 0, 2)
    calls.at(STEP, 0, 2)
    for i in range(6):
        calls.leave(calls.enter(ALLREDUCE if i % 2 else BCAST, 100 * i))
    calls.enter(ALLREDUCE, 800)  # in progress
    s = calls.state("ignored")
    assert (s["rank"], s["host"], s["phase"], s["where"]) == (2, "n1", "forward, backward and the update",
                                                              "epoch 1 step 3")
    assert [entry["seq"] for entry in s["ring"]] == [3, 4, 5, 6]  # the last four, oldest first
    assert [entry["bytes"] for entry in s["ring"]] == [300, 400, 500, 800]
    assert s["ring"][-1]["seconds"] is None and s["ring"][0]["seconds"] >= 0
    assert s["collective"]["name"] == "Allreduce" and s["collective"]["seq"] == 6
    assert RollCall(0, "n1").state("start-up (the manifest)")["where"] == "start-up (the manifest)"


def test_the_verdict_names_the_rank_that_is_elsewhere_and_where_the_others_wait():
    states = [state(0, collective="Allreduce"), state(1, collective="Allreduce"), state(2, "the data read", host="n2"),
              state(4, collective="Allreduce"), state(5, collective="Allreduce")]
    assert verdict(states, 7) == ("rank 2 on n2 is in the data read of epoch 1 step 3 (4.0 s); ranks 0-1, 4-5 wait "
                                  "in the Allreduce of epoch 1 step 3; ranks 3, 6 did not answer (a rank holding "
                                  "the interpreter, or its node gone)")
    # two ranks, one in a collective: the one in the collective waits (a tie goes to the collective)
    assert verdict([state(0, "the checkpoint write"), state(1, collective="Gather")], 2).startswith(
        "rank 0 on n1 is in the checkpoint write of epoch 1 step 3 (4.0 s); rank 1 waits in the Gather")
    assert verdict([state(0, collective="Allreduce"), state(1, collective="Allreduce")], 2) == (
        "every rank that answered is in the Allreduce of epoch 1 step 3 (3.5 s): none is elsewhere (a stuck network "
        "or device?)")
