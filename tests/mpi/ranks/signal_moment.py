"""`mpitrain ARGS...` (through `mpitrain.cli.main`, as the command runs) with every rank held at MOMENT until the
test says go, so a signal reaches it there and nowhere else.

    mpiexec -n 2 python signal_moment.py BARRIER_DIR MOMENT train CONFIG
    mpiexec -n 2 python signal_moment.py BARRIER_DIR MOMENT script CONFIG   # mpitrain.train from a script

A script (`script CONFIG`) has SIGUSR1 and SIGTERM handlers of its own, trains, and when a signal stops it, says
whether its handlers are back and trains again (a resume), printing a line per rank on stderr.

At start each rank writes BARRIER_DIR/pid-R (R from the launcher's PMI_RANK: MPI has not started yet); at MOMENT
it writes BARRIER_DIR/ready-R, JSON of its pid, whether MPI has started and whether SIGUSR1 is blocked, and waits
for BARRIER_DIR/go; at its end it writes BARRIER_DIR/exit-R with main's return value. Moments (a rank with no such
moment, like rank 1 at `report`, just runs):

    before-mpi-init    main's first line installed mpitrain's handlers; mpi4py is not imported yet
    mpi-init           MPI has started, its own SIGUSR1 handler installed, mpitrain's not yet back
    set-up             the start of `train`: the dataset, the model, the run directory are still to come
    pretraining        the 3rd step of a deep belief net's second RBM
    first-step         the first training step, before its forward pass
    mid-epoch          the 6th step of the first epoch
    stopping           mid-epoch, then again (ready-stopped-R, go-stopped) as the stop leaves `train`
    final-evaluation   the last epoch's evaluation (train.epochs of them)
    report             rank 0 drawing the report, summary.json written, rank 1 waiting in the collective after
    ended              `train` returned: its last agreement is behind it
    eval               `mpitrain eval`'s evaluation
"""
import contextlib
import json
import os
import sys
import time

import mpitrain.cli
import mpitrain.rundir.report
import mpitrain.training.loop
import mpitrain.training.trained

folder, moment, args = sys.argv[1], sys.argv[2], sys.argv[3:]
rank = int(os.environ["PMI_RANK"])


def write(name: str, text: str) -> None:
    with open(os.path.join(folder, name + ".tmp"), "w") as f:
        f.write(text)
    os.replace(os.path.join(folder, name + ".tmp"), os.path.join(folder, name))


def blocked(number: int) -> bool:
    with open("/proc/thread-self/status") as f:
        return bool(int(next(line for line in f if line.startswith("SigBlk")).split()[1], 16) >> (number - 1) & 1)


def pause(name: str = "") -> None:
    """Say ready, then wait for go (a signal meanwhile runs mpitrain's handler, or stays pending where blocked);
    `name` tells a second pause apart (ready-NAME-R, go-NAME)."""
    write(f"ready{name}-{rank}", json.dumps({"pid": os.getpid(), "mpi_started": "mpi4py.MPI" in sys.modules,
                                             "sigusr1_blocked": blocked(10)}))
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(folder, f"go{name}")):
        if time.monotonic() > deadline:
            raise RuntimeError("no go from the test within 60 s")
        time.sleep(0.005)


def pausing_at(function, call: int = 1, ranks=(0, 1)):
    """`function`, pausing before its `call`-th call on `ranks`."""
    calls = 0

    def paused(*a, **kw):
        nonlocal calls
        calls += 1
        if calls == call and rank in ranks:
            pause()
        return function(*a, **kw)
    return paused


def then_pausing(function, name: str = ""):
    """`function`, pausing when it has returned or raised."""
    def paused(*a, **kw):
        try:
            return function(*a, **kw)
        finally:
            pause(name)
    return paused


def pausing_inside(blocking):
    """The context manager `blocking` (the CLI's signals_blocked_while_mpi_starts), pausing at the end of its body:
    MPI has started and mpitrain's handlers are not back yet."""
    @contextlib.contextmanager
    def paused():
        with blocking():
            yield
            pause()
    return paused


def epochs() -> int:
    import yaml
    with open(args[1]) as f:
        return yaml.safe_load(f)["train"]["epochs"]


write(f"pid-{rank}", str(os.getpid()))
if moment == "before-mpi-init":
    mpitrain.cli.hold_stop_signals = then_pausing(mpitrain.cli.hold_stop_signals)
elif moment == "mpi-init":
    mpitrain.cli.signals_blocked_while_mpi_starts = pausing_inside(mpitrain.cli.signals_blocked_while_mpi_starts)
elif moment == "set-up":
    mpitrain.training.loop.setup_run = pausing_at(mpitrain.training.loop.setup_run)
elif moment == "pretraining":
    from mpitrain.nn.rbm import RBM
    trained, steps = [], 0

    def train_batch(self, *a, **kw):
        global steps
        if self not in trained:
            trained.append(self)
            steps = 0
        steps += 1
        if len(trained) == 2 and steps == 3:
            pause()
        return train_rbm_batch(self, *a, **kw)
    train_rbm_batch, RBM.train_batch = RBM.train_batch, train_batch
elif moment in ("first-step", "mid-epoch", "stopping"):
    mpitrain.training.loop._step = pausing_at(mpitrain.training.loop._step, 1 if moment == "first-step" else 6)
    if moment == "stopping":
        mpitrain.cli._train = then_pausing(mpitrain.cli._train, "-stopped")
elif moment == "ended":
    mpitrain.cli._train = then_pausing(mpitrain.cli._train)
elif moment == "final-evaluation":
    mpitrain.training.loop._evaluate = pausing_at(mpitrain.training.loop._evaluate, epochs())
elif moment == "report":
    mpitrain.rundir.report.write_report = pausing_at(mpitrain.rundir.report.write_report, ranks=(0,))
elif moment == "eval":
    mpitrain.training.trained.evaluate = pausing_at(mpitrain.training.trained.evaluate)
else:
    raise SystemExit(f"unknown moment {moment}")


def train_from_a_script(config: str) -> int:
    import signal

    import mpitrain
    from mpitrain.training.preemption import Stopped

    def own(number, frame):
        print(f"rank {rank}: the script's own handler got {signal.Signals(number).name}", file=sys.stderr)
    for number in (signal.SIGUSR1, signal.SIGTERM):
        signal.signal(number, own)
    comm = mpitrain.init(backend="numpy")
    try:
        mpitrain.train(mpitrain.load_config(config), comm)
        return 0
    except Stopped as e:
        back = all(signal.getsignal(number) is own for number in (signal.SIGUSR1, signal.SIGTERM))
        mpitrain.train(mpitrain.load_config(config), comm)
        print(f"rank {rank}: Stopped: {e}; the script's handlers {'are back' if back else 'are not back'}; trained "
              "again to the end", file=sys.stderr)
        return 3


code = train_from_a_script(args[1]) if args[0] == "script" else mpitrain.cli.main(args)
write(f"exit-{rank}", str(code))
sys.exit(code)
