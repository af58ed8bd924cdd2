"""Training inside a Spark cluster: one barrier stage of N tasks hosts an MPI job of N ranks.

`mpitrain spark-train CONFIG --ranks N` and `spark-submit etl/train.py CONFIG --ranks N` (`cli.py`) run
`mpitrain train` on N ranks started by MPICH's Hydra with its manual launcher (`hydra.py`) from the tasks of
one barrier stage (`stage.py`), in process groups that die with their task (`processes.py`); the driver shows
the ranks' output as it comes (`logstream.py`). See docs/spark-training.md.
"""
