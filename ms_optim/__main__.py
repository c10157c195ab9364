"""``python -m ms_optim SCRIPT [ARGS...]``: the same as ``python -m ms_optim.run SCRIPT [ARGS...]``."""
import sys

from ms_optim.run import main

if __name__ == "__main__":
    sys.exit(main())
