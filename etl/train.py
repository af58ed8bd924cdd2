"""`spark-submit etl/train.py CONFIG --ranks N [--set K=V ...]`: `mpitrain train` on N ranks in one Spark
barrier stage; see mpitrain.spark.cli."""
import sys

from mpitrain.spark.cli import main

if __name__ == "__main__":
    sys.exit(main())
