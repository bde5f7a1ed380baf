#!/usr/bin/python3
"""Checks that everything strata uses from outside its source tree comes from
a Debian package that the README commands install (scripts/setup.sh).

What counts as used, read from the build's own records and the sources:
- headers: every file in the compilers' dependency files (*.o.d) of a build;
- libraries and tools of the build: the files on every link line (link.txt)
  and the file paths CMake found (CMakeCache.txt: compilers, pkg-config,
  find_library results, the config file of each find_package);
- programs: the first word of every CTest command, and the programs that
  scripts, tests and benchmarks run (shell command words, subprocess and
  exec calls in Python, system()/popen() commands in C and C++, and the
  table RUN_BY_OUR_TOOLS for programs our own tools start);
- Python modules: every import of the Python files under tests/, bench/,
  scripts/ and python/, resolved by Debian's Python (/usr/bin/python3, the
  interpreter this script must run under), except the project's own
  modules and those of VENV_ONLY.

Each file is mapped to the package owning it (dpkg-query -S). That package
must be in STRATA_PACKAGES, in their dependency closure (Depends and
Pre-Depends of the installed packages, the first installed alternative of
each `a | b`, virtual packages through Provides), or of Priority required
or important. A file no package owns (the CUDA toolkit under /usr/local)
is listed as such and does not fail, except a Python module: one that
Debian's Python cannot import, or imports from no package (a `pip install`
by hand), fails.

Usage: deps_check.py --source DIR --build DIR [--setup FILE]
Exit status 0 when every package is installed by the README commands, 1
otherwise, each problem named with its fix ("add `libxxhash-dev` to
STRATA_PACKAGES in scripts/setup.sh").
"""

from __future__ import annotations

import argparse
import ast
import glob
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/cuda/bin"
STATUS_FILE = "/var/lib/dpkg/status"

# Modules that only peers' virtualenvs hold (never Debian's Python), with
# the place that says so. Each must still be imported somewhere.
VENV_ONLY = {
    "deepspeed": "bench/ds_aio_compare.py and cpu_adam_vs_deepspeed.py run it in build/ds-venv",
}

# Programs that our own binaries start, which no scan of a command string
# finds: program -> (the source that names it, why). The source must still
# name it, so the table cannot outlive the code.
RUN_BY_OUR_TOOLS = {
    "fio": ("tools/nvme_bench/cli.h", "strata-nvme-bench --vs-fio (scripts/main.sh)"),
}

# Programs that exist only on a GPU machine (its driver's), never from a
# Debian package here: listed, never a failure.
GPU_MACHINE_ONLY = {"nvidia-smi"}

RUNNERS = {"run", "Popen", "call", "check_call", "check_output", "getoutput", "system",
           "popen", "execv", "execvp", "execve", "execvpe"}

SHELL_WORDS = set("""
if then else elif fi for in while until do done case esac function return local
export source . exec set unset shift cd echo printf read test [ [[ ]] ]] true false
trap wait eval command declare readonly exit break continue time env sudo { } ! :
pushd popd umask ulimit type hash kill let shopt getopts mapfile
""".split())


@dataclass
class Use:
    """One file strata uses from outside its tree, and what uses it."""
    path: str
    kind: str  # header, library, build tool, program, python module
    used_by: str


@dataclass
class Report:
    failures: list[str] = field(default_factory=list)
    unowned: list[Use] = field(default_factory=list)
    owners: dict[str, int] = field(default_factory=dict)  # package -> files


# --- What the build used -------------------------------------------------

def depfile_paths(text: str) -> list[str]:
    """The prerequisites of a Makefile-style dependency file."""
    text = text.replace("\\\n", " ")
    paths = []
    for line in text.splitlines():
        _, sep, rest = line.partition(": ")
        if not sep:
            continue
        for word in re.split(r"(?<!\\) +", rest.strip()):
            if word:
                paths.append(word.replace("\\ ", " "))
    return paths


def cmake_cache_paths(text: str) -> list[str]:
    """File paths CMake found: FILEPATH entries, CMAKE_COMMAND, and the
    config file in each <Package>_DIR a find_package used."""
    paths = []
    for line in text.splitlines():
        m = re.match(r"([A-Za-z0-9_.+-]+):(FILEPATH|PATH|INTERNAL)=(/.*)$", line)
        if not m:
            continue
        name, kind, value = m.groups()
        if kind == "FILEPATH" or name in ("CMAKE_COMMAND", "CMAKE_CTEST_COMMAND"):
            paths.append(value)
        elif kind == "PATH" and name.endswith("_DIR") and os.path.isdir(value):
            configs = glob.glob(os.path.join(value, "*[Cc]onfig.cmake"))
            paths.extend(sorted(configs)[:1])
        elif kind == "PATH" and os.path.isfile(value):
            paths.append(value)
    return paths


def build_records(build: str, name_pattern: str) -> list[str]:
    """Files of the build matching `name_pattern`, leaving out the builds
    nested in it (a test's own CMake project has a CMakeCache.txt of its
    own and may be half written while this runs) and test scratch space."""
    found = []
    for root, dirs, files in os.walk(build):
        dirs[:] = [d for d in dirs if d != "test-scratch"
                   and not os.path.exists(os.path.join(root, d, "CMakeCache.txt"))]
        found += [os.path.join(root, f) for f in files if re.fullmatch(name_pattern, f)]
    return sorted(found)


def build_uses(build: str, outside) -> list[Use]:
    uses = []
    for dep in build_records(build, r".*\.o\.d"):
        with open(dep, errors="replace") as f:
            for p in depfile_paths(f.read()):
                uses.append(Use(p, "header", os.path.relpath(dep, build)))
    for link in build_records(build, r"link\.txt"):
        with open(link) as f:
            for word in shlex.split(f.read()):
                path = word.split(",")[-1] if word.startswith("-Wl,") else word
                if path.startswith("/") and os.path.isfile(path):
                    uses.append(Use(path, "library", os.path.relpath(link, build)))
    with open(os.path.join(build, "CMakeCache.txt")) as f:
        for p in cmake_cache_paths(f.read()):
            uses.append(Use(p, "build tool", "CMakeCache.txt"))
    return [u for u in uses if outside(u.path)]


# --- What the tests and scripts run ---------------------------------------

def shell_functions(text: str) -> set[str]:
    return set(re.findall(r"^\s*(?:function\s+)?([A-Za-z_][\w-]*)\s*\(\)", text, re.M))


def shell_command_words(text: str, functions: set[str]) -> list[str]:
    """The command names a shell script runs, as far as a line reader can
    tell: the first word of each command and of each $(...), after
    assignments and `sudo`, `exec`, `env`, `time`, `command`. Quoted text,
    array literals, words with expansions and the shell functions named in
    `functions` are left out."""
    text = re.sub(r"<<-?\s*['\"]?(\w+)['\"]?(.*?)\n(.*?)\n\s*\1\n", r"\2\n", text,
                  flags=re.S)  # here-documents: the text is data, the command stays
    text = re.sub(r"\\\n", " ", text)
    text = re.sub(r"(^|\s)#.*", r"\1", text)
    text = re.sub(r"\b\w+\+?=\((.*?)\)", "", text, flags=re.S)  # arrays
    text = re.sub(r"\$\(\(.*?\)\)", "", text)  # arithmetic
    text = re.sub(r"\d*(?:>>|>|<)&?\d*", " ", text)  # redirections
    commands = re.findall(r"\$\(([^()]*)\)", text)  # command substitutions
    text = re.sub(r"\$\([^()]*\)", "S", text)
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "S", text)
    words = []
    for part in re.split(r"\|\||&&|[;|&`(){}\n]", text) + commands:
        tokens = part.split()
        while tokens and (re.match(r"^[A-Za-z_]\w*(\[.*\])?\+?=", tokens[0])
                          or re.match(r"^\$\{?sudo\}?$", tokens[0])
                          or tokens[0] in ("sudo", "exec", "env", "time", "command", "!",
                                           "then", "do", "else", "elif", "if", "while",
                                           "until")):
            tokens.pop(0)
        word = tokens[0] if tokens else ""
        if (word and word not in SHELL_WORDS and word not in functions
                and re.match(r"^[A-Za-z0-9_./+-]+$", word) and not word.startswith("-")):
            words.append(word)
    return words


def python_command_words(tree: ast.AST) -> list[str]:
    """Programs a Python file starts: the command given to a subprocess.* or
    os.* call named in RUNNERS (the first element of a literal list, or the
    first word of a literal string), and the first element of a literal
    list given to a local function of such a name (a wrapper of run)."""
    words = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not node.args:
            continue
        func = node.func
        module_call = isinstance(func, ast.Attribute) and getattr(func.value, "id", "") in (
            "subprocess", "os")
        name = func.attr if module_call else getattr(func, "id", "")
        if name not in RUNNERS:
            continue
        first = node.args[1] if name.startswith("exec") and len(node.args) > 1 else node.args[0]
        if isinstance(first, ast.List) and first.elts:
            first = first.elts[0]
        elif not module_call:
            continue
        if isinstance(first, ast.Constant) and isinstance(first.value, str) and first.value:
            words.append(first.value.split()[0])
    return words


def c_command_words(text: str) -> list[str]:
    """Programs C and C++ code starts through system() or popen() with a
    literal command."""
    return [m.group(1) for m in re.finditer(r"\b(?:system|popen)\(\s*\"([A-Za-z0-9_./+-]+)", text)]


def source_files(source: str, patterns: list[str]) -> list[str]:
    files = []
    for pattern in patterns:
        files.extend(glob.glob(os.path.join(source, pattern), recursive=True))
    return sorted(set(f for f in files if os.path.isfile(f)))


def program_uses(source: str, build: str) -> list[Use]:
    found: list[tuple[str, str]] = []
    scripts = {}
    for f in source_files(source, ["scripts/*.sh", ".ci/*", "tests/**/*.sh", "bench/*.sh"]):
        with open(f) as fh:
            scripts[f] = fh.read()
    functions = set().union(*map(shell_functions, scripts.values()))
    for f, text in scripts.items():
        found += [(w, f) for w in shell_command_words(text, functions)]
    for f in python_files(source):
        with open(f) as fh:
            found += [(w, f) for w in python_command_words(ast.parse(fh.read(), f))]
    for f in source_files(source, ["tests/**/*.c", "tests/**/*.cc", "tools/**/*.cc",
                                   "bench/*.cc"]):
        with open(f) as fh:
            found += [(w, f) for w in c_command_words(fh.read())]
    for program, (named_in, why) in RUN_BY_OUR_TOOLS.items():
        with open(os.path.join(source, named_in)) as fh:
            if f'"{program}"' not in fh.read():
                raise SystemExit(f"deps_check: RUN_BY_OUR_TOOLS says {named_in} names "
                                 f"'{program}', but it does not: update the table")
        found.append((program, why))
    found += [(t["command"][0], "ctest " + t["name"]) for t in ctest_tests(build)
              if t.get("command")]
    uses = []
    for word, where in found:
        where = os.path.relpath(where, source) if where.startswith("/") else where
        if "/" in word and not word.startswith("/"):
            continue  # relative: one of ours (build/bin/..., scripts/...)
        path = word if word.startswith("/") else shutil.which(word, path=SYSTEM_PATH)
        if word in GPU_MACHINE_ONLY:
            continue
        uses.append(Use(path or word, "program", where))
    return uses


def ctest_tests(build: str) -> list[dict]:
    out = subprocess.run(["ctest", "--show-only=json-v1"], cwd=build, capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out).get("tests", [])


# --- What the Python files import -----------------------------------------

def python_files(source: str) -> list[str]:
    return source_files(source, ["tests/**/*.py", "bench/*.py", "scripts/*.py",
                                 "python/**/*.py"])


def imported_modules(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def module_uses(source: str) -> tuple[list[Use], list[str]]:
    """Each imported module's file in Debian's Python, and failures for the
    modules it cannot import."""
    uses, failures, seen_venv = [], [], set()
    own = {os.path.splitext(os.path.basename(f))[0] for f in python_files(source)}
    own |= {os.path.basename(d) for d in glob.glob(os.path.join(source, "python", "*"))}
    for f in python_files(source):
        with open(f) as fh:
            modules = imported_modules(ast.parse(fh.read(), f))
        rel = os.path.relpath(f, source)
        for name in sorted(modules - own):
            if name in VENV_ONLY:
                seen_venv.add(name)
                continue
            spec = importlib.util.find_spec(name)
            if spec is None:
                failures.append(f"{rel} imports '{name}', which Debian's Python cannot import: "
                                f"add its python3-* package to STRATA_PACKAGES in "
                                f"scripts/setup.sh (or, for a peer's virtualenv, to VENV_ONLY "
                                f"in {os.path.relpath(__file__, source)})")
                continue
            origin = spec.origin if spec.origin not in (None, "built-in", "frozen") \
                else os.path.realpath(sys.executable)
            uses.append(Use(origin, "python module", f"{rel} (import {name})"))
    for name in sorted(set(VENV_ONLY) - seen_venv):
        failures.append(f"VENV_ONLY names '{name}', which nothing imports any more: remove it")
    return uses, failures


# --- Packages -------------------------------------------------------------

def usr_merge_alias(path: str) -> str | None:
    for a, b in (("/usr/lib/", "/lib/"), ("/usr/bin/", "/bin/"), ("/usr/sbin/", "/sbin/")):
        if path.startswith(a):
            return b + path[len(a):]
        if path.startswith(b):
            return a + path[len(b):]
    return None


def dpkg_owners(paths: list[str]) -> dict[str, list[str]]:
    """path -> the packages owning it, from one dpkg-query -S per round: the
    path as used, then its real path and its /usr-merge alias."""
    result: dict[str, list[str]] = {}
    pending = {p: [p, os.path.realpath(p)] for p in paths}
    for alias in list(pending):
        for q in list(pending[alias]):
            if usr_merge_alias(q):
                pending[alias].append(usr_merge_alias(q))
    for round_ in range(3):
        asked = {cands[round_]: p for p, cands in pending.items()
                 if p not in result and len(cands) > round_}
        if not asked:
            break
        out = subprocess.run(["dpkg-query", "-S", *asked], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("diversion ") or ": /" not in line:
                continue
            pkgs, _, path = line.partition(": /")
            if "/" + path in asked:
                result[asked["/" + path]] = [p.strip().split(":")[0] for p in pkgs.split(",")]
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
    Pre-Depends: of `a | b`, the first installed alternative (apt installs
    the first one it can), a virtual package through its providers."""
    seen, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        real = [name] if name in db.depends else db.provides.get(name, [])[:1]
        for pkg in real:
            if pkg in seen:
                continue
            seen.add(pkg)
            for group in db.depends[pkg]:
                chosen = next((a for a in group if a in db.depends or a in db.provides), None)
                if chosen:
                    todo.append(chosen)
    return seen


def listed_packages(setup: str) -> list[str]:
    out = subprocess.run(["bash", "-c", 'source "$1"; printf "%s\\n" "${STRATA_PACKAGES[@]}"',
                          "_", setup], capture_output=True, text=True, check=True).stdout
    return out.split()


def evaluate(uses: list[Use], owners: dict[str, list[str]], listed: list[str],
             db: Installed) -> Report:
    """Which used files come from packages the README commands leave out."""
    report = Report()
    installed = closure(listed, db)
    base = {p for p, prio in db.priority.items() if prio in ("required", "important")}
    missing: dict[str, list[Use]] = {}
    for use in uses:
        pkgs = owners.get(use.path)
        if not pkgs:
            report.unowned.append(use)
            continue
        for pkg in pkgs:
            report.owners[pkg] = report.owners.get(pkg, 0) + 1
        if not any(p in installed or p in base for p in pkgs):
            missing.setdefault(pkgs[0], []).append(use)
    for pkg, its_uses in sorted(missing.items()):
        first = its_uses[0]
        report.failures.append(
            f"add `{pkg}` to STRATA_PACKAGES in scripts/setup.sh: it owns {first.path} "
            f"({first.kind}, used by {first.used_by}; {len(its_uses)} file(s) in all), "
            f"and the README commands do not install it")
    return report


def collect(source: str, build: str) -> tuple[list[Use], list[str]]:
    src, bld = os.path.realpath(source), os.path.realpath(build)

    def outside(path: str) -> bool:
        p = os.path.realpath(path)
        return not (p.startswith(src + os.sep) or p.startswith(bld + os.sep))

    programs = program_uses(source, build)
    failures = [f"{u.used_by} runs '{u.path}', which is not on this machine: add the package "
                f"that has it to STRATA_PACKAGES in scripts/setup.sh"
                for u in programs if not u.path.startswith("/")]
    uses = build_uses(build, outside) + [u for u in programs
                                         if u.path.startswith("/") and outside(u.path)]
    modules, module_failures = module_uses(source)
    return [Use(os.path.normpath(u.path), u.kind, u.used_by) for u in uses + modules], \
        failures + module_failures


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
    report.failures += [f"{u.used_by}: {u.path} comes from no Debian package (installed by "
                        f"hand?): add its python3-* package to STRATA_PACKAGES in "
                        f"scripts/setup.sh" for u in report.unowned if u.kind == "python module"]
    print_report(uses, report)
    return 1 if report.failures else 0


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
        print(f"deps_check: {len(unowned)} files come from no Debian package (not a failure "
              f"unless a Python module), e.g.:")
        for path in unowned[:8]:
            print(f"  {path}")
    for line in report.failures:
        print(f"deps_check: FAIL: {line}")
    if not report.failures:
        print("deps_check: every package is installed by the README commands (scripts/setup.sh)")


if __name__ == "__main__":
    sys.exit(main())
