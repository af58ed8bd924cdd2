"""`spark-submit etl/prepare.py --source idx:/folder --out data/fashion --shards 8`; see mpitrain.etl.cli."""
import sys

from mpitrain.etl.cli import main

if __name__ == "__main__":
    sys.exit(main())
