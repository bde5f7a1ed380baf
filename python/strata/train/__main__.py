"""python -m strata.train: strata-train."""
import sys

from strata.train.cli import main

sys.exit(main())
