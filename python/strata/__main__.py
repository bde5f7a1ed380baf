"""python -m strata [--version | info]: the version, or what strata finds
on this machine (device, host backing, I/O backend)."""
from __future__ import annotations

import argparse
import sys

import strata


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m strata",
                                     description=__doc__)
    parser.add_argument("--version", action="store_true",
                        help="print the package and library versions")
    parser.add_argument("command", nargs="?", choices=["info"],
                        help="info: the device, tiers and budgets found")
    args = parser.parse_args(argv)
    try:
        if args.version:
            print(f"strata {strata.__version__} "
                  f"(libstrata {strata.version()})")
        else:
            strata.info()
    except (strata.StrataError, ImportError) as error:
        print(f"strata: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
