"""python -m strata [--version | info [--config ds_config.json]]: the
version, or what strata finds on this machine (device, host backing, I/O
backend) and its tiers with their budgets and homes: a small probe
engine's, or those a ds_config gives (reading one needs torch)."""
from __future__ import annotations

import argparse
import sys

import strata


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m strata", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="store_true",
                        help="print the package and library versions")
    parser.add_argument("command", nargs="?", choices=["info"],
                        help="info: the device, tiers and budgets found")
    parser.add_argument("--config", metavar="ds_config.json",
                        help="info: show the device, budgets and homes "
                             "this DeepSpeed-style config gives")
    args = parser.parse_args(argv)
    try:
        if args.version:
            print(f"strata {strata.__version__} "
                  f"(libstrata {strata.version()})")
        else:
            strata.info(args.config)
    except (strata.StrataError, ImportError, ValueError) as error:
        print(f"strata: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
