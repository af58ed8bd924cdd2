"""`spark-submit etl/score.py --model RUN_DIR|model.onnx --source idx:/folder --out p.parquet`; see mpitrain.etl.scoring."""
import sys

from mpitrain.etl.cli import main_score

if __name__ == "__main__":
    sys.exit(main_score())
