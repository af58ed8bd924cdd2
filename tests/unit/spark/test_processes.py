"""The guard of a Spark task's programs (mpitrain.spark.processes): nothing it started outlives the task, not
even a grandchild in a session of its own (as Hydra starts its ranks), whether the task is killed or the
program dies."""
import json
import os
import signal
import subprocess
import sys

from mpitrain.testing.launch import running, wait_until_gone

# a program that starts a grandchild in a session of its own, prints both pids, then waits
FAMILY = ("import json, subprocess, sys, time; "
          "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True); "
          "print(json.dumps([__import__('os').getpid(), child.pid]), flush=True); time.sleep(600)")

# a stand-in for the Spark task: starts FAMILY guarded, passes its pids on, prints the guard's exit status
TASK = ("import sys; from mpitrain.spark.processes import start_guarded; "
        f"guard = start_guarded([sys.executable, '-c', {FAMILY!r}], stdout=sys.stdout); print(guard.wait())")


def start_task():
    task = subprocess.Popen([sys.executable, "-c", TASK], stdout=subprocess.PIPE, text=True)
    program, grandchild = json.loads(task.stdout.readline())
    return task, program, grandchild


def test_a_killed_task_takes_its_program_and_the_program_s_own_sessions_with_it():
    task, program, grandchild = start_task()
    assert running(program) and running(grandchild)
    task.kill()
    task.wait()
    assert wait_until_gone([program, grandchild], 10) == []


def test_a_killed_program_takes_what_it_started_and_the_guard_reports_the_signal():
    task, program, grandchild = start_task()
    os.kill(program, signal.SIGKILL)
    assert wait_until_gone([grandchild], 10) == []
    # 128 + 9, as a shell reports a program killed by SIGKILL
    assert task.stdout.readline().strip() == "137"
    assert task.wait(timeout=10) == 0
