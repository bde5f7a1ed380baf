"""python -m strata.torch.export CKPT OUT: see strata.torch.export."""
import sys

from strata.torch.export import main

sys.exit(main())
