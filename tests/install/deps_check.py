#!/usr/bin/python3
"""Checks that everything strata uses from outside its source tree comes from
a Debian package that the README commands install (scripts/setup.sh).

What counts as used is read by deps_scan.py from a build's own records and
from the sources: headers, libraries and build tools of the build; the
programs that CTest, the scripts, tests and tools run; the modules the
Python files import from Debian's Python (this script must run under
/usr/bin/python3). Each file is mapped to the package owning it
(dpkg-query -S, trying the path, its real path and its /usr-merge alias).
That package must be in STRATA_PACKAGES, in their dependency closure
(Depends and Pre-Depends, of `a | b` the first alternative, as apt installs
on a fresh machine), or of Priority required (important is not enough:
minimal images leave it out).

A file no package owns fails too (a `pip install` or `make install` by
hand), unless it lies under a root of NOT_FROM_DEBIAN (the CUDA toolkit,
which the build uses when present and nothing installs): those are listed
and pass. A script or test that installs packages itself fails.

Usage: deps_check.py --source DIR --build DIR [--setup FILE]
Exit status 0 when every package is installed by the README commands, 1
otherwise, each problem named with its fix ("add `libxxhash-dev` to
STRATA_PACKAGES in scripts/setup.sh").
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from deps_scan import (Use, build_uses, hand_installs, module_uses,  # noqa: E402
                       program_uses)

STATUS_FILE = "/var/lib/dpkg/status"

# Roots of files that no Debian package owns and strata may still use: the
# CUDA toolkit (used when nvcc is found; the README commands never install
# it). Anything else unowned was installed by hand.
NOT_FROM_DEBIAN = re.compile(r"^/usr/local/cuda(-[0-9.]+)?/")


@dataclass
class Report:
    failures: list[str] = field(default_factory=list)
    unowned: list[Use] = field(default_factory=list)  # under NOT_FROM_DEBIAN
    owners: dict[str, int] = field(default_factory=dict)  # package -> files


# --- Packages ---------------------------------------------------------------

def usr_merge_alias(path: str) -> str | None:
    for a, b in (("/usr/lib/", "/lib/"), ("/usr/bin/", "/bin/"), ("/usr/sbin/", "/sbin/")):
        if path.startswith(a):
            return b + path[len(a):]
        if path.startswith(b):
            return a + path[len(b):]
    return None


def owner_candidates(path: str) -> list[str]:
    """The names dpkg may know `path` by: as used, its real path, and the
    /usr-merge alias of each."""
    names = []
    for p in (path, os.path.realpath(path)):
        for q in (p, usr_merge_alias(p)):
            if q and q not in names:
                names.append(q)
    return names


def dpkg_owners(paths: list[str]) -> dict[str, list[str]]:
    """path -> the packages owning it: one dpkg-query -S per round, asking
    each path's next candidate name until it has an owner or none is left."""
    candidates = {p: owner_candidates(p) for p in paths}
    result: dict[str, list[str]] = {}
    for round_ in range(max((len(c) for c in candidates.values()), default=0)):
        asked: dict[str, list[str]] = {}
        for p, names in candidates.items():
            if p not in result and round_ < len(names):
                asked.setdefault(names[round_], []).append(p)
        if not asked:
            break
        out = subprocess.run(["dpkg-query", "-S", *asked], capture_output=True, text=True).stdout
        for line in out.splitlines():
            pkgs, sep, path = line.partition(": /")
            if not sep or line.startswith("diversion ") or "/" + path not in asked:
                continue
            for p in asked["/" + path]:
                result[p] = [q.strip().split(":")[0] for q in pkgs.split(",")]
    return result


@dataclass
class Installed:
    priority: dict[str, str]
    depends: dict[str, list[list[str]]]  # package -> groups of alternatives
    provides: dict[str, list[str]]  # virtual name -> installed providers


def parse_status(text: str) -> Installed:
    db = Installed({}, {}, {})
    for stanza in text.split("\n\n"):
        fields = dict(re.findall(r"^([\w-]+): (.*(?:\n .*)*)", stanza, re.M))
        if "install ok installed" not in fields.get("Status", ""):
            continue
        name = fields["Package"]
        db.priority[name] = fields.get("Priority", "")
        groups = []
        for key in ("Pre-Depends", "Depends"):
            for group in filter(None, (g.strip() for g in fields.get(key, "").split(","))):
                groups.append([re.split(r"[\s(:]", alt.strip())[0] for alt in group.split("|")])
        db.depends[name] = groups
        for virtual in filter(None, (v.strip() for v in fields.get("Provides", "").split(","))):
            db.provides.setdefault(re.split(r"[\s(:]", virtual)[0], []).append(name)
    return db


def closure(roots: list[str], db: Installed) -> set[str]:
    """The installed packages that `roots` pull in through Depends and
    Pre-Depends. Of `a | b` only `a` counts, as apt on a fresh machine
    installs the first alternative; a virtual package counts through its
    installed provider."""
    seen, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        real = [name] if name in db.depends else db.provides.get(name, [])[:1]
        for pkg in real:
            if pkg not in seen:
                seen.add(pkg)
                todo += [group[0] for group in db.depends[pkg]]
    return seen


def base_packages(db: Installed) -> set[str]:
    """Priority required: on every Debian system. (Priority important is
    not: minimal images leave it out.)"""
    return {p for p, prio in db.priority.items() if prio == "required"}


def listed_packages(setup: str) -> list[str]:
    out = subprocess.run(["bash", "-c", 'source "$1"; printf "%s\\n" "${STRATA_PACKAGES[@]}"',
                          "_", setup], capture_output=True, text=True, check=True).stdout
    return out.split()


def evaluate(uses: list[Use], owners: dict[str, list[str]], listed: list[str],
             db: Installed) -> Report:
    """Which used files come from packages the README commands leave out,
    or from no package."""
    report = Report()
    installed = closure(listed, db) | base_packages(db)
    missing: dict[str, list[Use]] = {}
    for use in uses:
        pkgs = owners.get(use.path)
        if not pkgs and NOT_FROM_DEBIAN.match(use.path):
            report.unowned.append(use)
        elif not pkgs:
            report.failures.append(
                f"{use.used_by} uses {use.path} ({use.kind}), which comes from no Debian "
                f"package (installed by hand?): install its package through STRATA_PACKAGES "
                f"in scripts/setup.sh")
        else:
            for pkg in pkgs:
                report.owners[pkg] = report.owners.get(pkg, 0) + 1
            if not any(p in installed for p in pkgs):
                missing.setdefault(pkgs[0], []).append(use)
    for pkg, its_uses in sorted(missing.items()):
        first = its_uses[0]
        report.failures.append(
            f"add `{pkg}` to STRATA_PACKAGES in scripts/setup.sh: it owns {first.path} "
            f"({first.kind}, used by {first.used_by}; {len(its_uses)} file(s) in all), "
            f"and the README commands do not install it")
    return report


# --- The check --------------------------------------------------------------

def collect(source: str, build: str) -> tuple[list[Use], list[str]]:
    """Every file used from outside the tree, and the failures found before
    any package is looked at."""
    src, bld = os.path.realpath(source), os.path.realpath(build)

    def outside(path: str) -> bool:
        p = os.path.realpath(path)
        return not (p.startswith(src + os.sep) or p.startswith(bld + os.sep))

    built, failures = build_uses(build)
    programs = program_uses(source, build)
    failures += [f"{u.used_by} runs '{u.path}', which is not on this machine: add the "
                 f"package that has it to STRATA_PACKAGES in scripts/setup.sh"
                 for u in programs if not u.path.startswith("/")]
    modules, module_failures = module_uses(source)
    uses = [u for u in built + programs if u.path.startswith("/") and outside(u.path)]
    return ([Use(os.path.normpath(u.path), u.kind, u.used_by) for u in uses + modules],
            failures + module_failures + hand_installs(source))


def print_report(uses: list[Use], report: Report) -> None:
    kinds: dict[str, int] = {}
    for u in {(u.path, u.kind): u for u in uses}.values():
        kinds[u.kind] = kinds.get(u.kind, 0) + 1
    print("deps_check: used from outside the tree: " +
          ", ".join(f"{n} {k} files" for k, n in sorted(kinds.items())))
    print(f"deps_check: owned by {len(report.owners)} packages: " +
          " ".join(sorted(report.owners)))
    unowned = sorted({u.path for u in report.unowned})
    if unowned:
        print(f"deps_check: {len(unowned)} files of the CUDA toolkit, which no Debian "
              f"package owns (not a failure), e.g.:")
        for path in unowned[:8]:
            print(f"  {path}")
    for line in report.failures:
        print(f"deps_check: FAIL: {line}")
    if not report.failures:
        print("deps_check: every package is installed by the README commands (scripts/setup.sh)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--setup", help="default: <source>/scripts/setup.sh")
    args = ap.parse_args()
    uses, failures = collect(args.source, args.build)
    owners = dpkg_owners(sorted({u.path for u in uses}))
    with open(STATUS_FILE) as f:
        db = parse_status(f.read())
    listed = listed_packages(args.setup or os.path.join(args.source, "scripts", "setup.sh"))
    report = evaluate(uses, owners, listed, db)
    report.failures = failures + report.failures
    print_report(uses, report)
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
