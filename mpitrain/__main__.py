"""`python -m mpitrain`: the same as the `mpitrain` command."""
import sys

from mpitrain.cli import main

sys.exit(main())
