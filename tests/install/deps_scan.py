"""What strata uses from outside its source tree, for deps_check.py: read
from a build's own records and from the sources, as files on this machine.

- headers: every file in the compilers' dependency files (*.o.d);
- libraries and build tools: the files on every link line (link.txt) and
  the file paths CMake found (CMakeCache.txt: compilers, pkg-config,
  find_library results, the config file of each find_package);
- programs: the first word of every CTest command, and the programs that
  scripts, tests and benchmarks run (shell commands, subprocess and exec
  calls in Python, system()/popen() commands in C and C++, and the table
  RUN_BY_OUR_TOOLS for programs our own tools start);
- Python modules: every import of the Python files under tests/, bench/,
  scripts/, python/ and examples/, as Debian's Python (the one running this) finds
  it, except the project's own modules and those of VENV_ONLY;
- hand installs: a script or test that runs apt-get install or dpkg -i
  itself, outside scripts/setup.sh.

The scanners read commands as a careful reader would, not as a shell or an
interpreter does: a program named only through a variable, or run by a
program other than the wrappers below, is not seen. Here-documents are
data, and so are `case` patterns.
"""

from __future__ import annotations

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
from dataclasses import dataclass

SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/cuda/bin"

# Modules that only peers' virtualenvs hold (never Debian's Python), with
# the place that says so. Each must still be imported somewhere.
VENV_ONLY = {
    "deepspeed": "bench/ds_aio_compare.py and deepspeed_offload_bench.py run it in bench/ds_venv.py's venv",
    "torchao": "bench/deepspeed_offload_bench.py --device cuda runs it in bench/ds_venv.py's venv",
    "tqdm": "examples/train_gpt.py (scripts/main.sh) runs in the torch venv (strata_torch_venv)",
    "matplotlib": "examples/train_gpt.py (scripts/main.sh) runs in the torch venv",
    "transformers": "examples/ds_train_gpt2.py and the adapter's tests run in the torch venv",
    "safetensors": "strata.torch's save_16bit_model runs in the torch venv (python.pytest)",
    "ml_dtypes": "View.numpy's bf16 arrays: python/tests run in the torch venv (python.pytest)",
}

# Programs that our own binaries start, which no scan of a command string
# finds: program -> (the source that names it, why). The source must still
# name it, so the table cannot outlive the code.
RUN_BY_OUR_TOOLS = {
    "fio": ("tools/nvme_bench/cli.h", "strata-nvme-bench --vs-fio (scripts/main.sh)"),
}

# Programs that exist only on a GPU machine (its driver's), never from a
# Debian package here.
GPU_MACHINE_ONLY = {"nvidia-smi"}

RUNNERS = {"run", "Popen", "call", "check_call", "check_output", "getoutput", "system",
           "popen", "execv", "execvp", "execve", "execvpe"}

SHELL_WORDS = set("""
if then else elif fi for in while until do done case esac function return local
export source . exec set unset shift cd echo printf read test [ [[ ]] ]] true false
trap wait eval command declare readonly exit break continue time env sudo { } ! :
pushd popd umask ulimit type hash kill let shopt getopts mapfile
""".split())

# Words that run the command after them: wrapper -> (how many words of
# its own it takes after its options, its options that take a value).
WRAPPERS = {
    "sudo": (0, {"-u", "-g", "-C", "-h", "-p"}),
    "env": (0, {"-u", "-C", "-S", "--unset", "--chdir"}),
    "timeout": (1, {"-s", "-k", "--signal", "--kill-after"}),
    "xargs": (0, {"-I", "-n", "-P", "-d", "-L", "-s", "-E", "-a"}),
    **{w: (0, set()) for w in ("exec", "time", "command", "nohup", "!", "then", "do", "else",
                               "elif", "if", "while", "until")},
}


@dataclass
class Use:
    """One file strata uses from outside its tree, and what uses it."""
    path: str
    kind: str  # header, library, build tool, program, python module
    used_by: str


# --- What the build used ---------------------------------------------------

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
    """Files of the build matching `name_pattern`, leaving out test scratch
    space and the builds nested in it (a test's own CMake project, which
    may be half written while this runs)."""
    found = []
    for root, dirs, files in os.walk(build):
        dirs[:] = [d for d in dirs if d not in ("test-scratch", "install-test")
                   and not os.path.exists(os.path.join(root, d, "CMakeCache.txt"))]
        found += [os.path.join(root, f) for f in files if re.fullmatch(name_pattern, f)]
    return sorted(found)


def read_text(path: str) -> str:
    """A record's text, or "" when it went away meanwhile."""
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def build_uses(build: str) -> tuple[list[Use], list[str]]:
    """What the build used, and failures when it left no records to read."""
    uses = []
    depfiles = build_records(build, r".*\.o\.d")
    for dep in depfiles:
        for p in depfile_paths(read_text(dep)):
            uses.append(Use(p, "header", os.path.relpath(dep, build)))
    for link in build_records(build, r"link\.txt"):
        for word in shlex.split(read_text(link)):
            path = word.split(",")[-1] if word.startswith("-Wl,") else word
            if path.startswith("/") and os.path.isfile(path):
                uses.append(Use(path, "library", os.path.relpath(link, build)))
    for p in cmake_cache_paths(read_text(os.path.join(build, "CMakeCache.txt"))):
        uses.append(Use(p, "build tool", "CMakeCache.txt"))
    failures = [] if depfiles else [
        f"{build} has no compiler dependency files (*.o.d), so its headers cannot be "
        f"checked: build it with the Unix Makefiles generator (the presets' default)"]
    return uses, failures


# --- What the tests and scripts run ----------------------------------------

def shell_functions(text: str) -> set[str]:
    return set(re.findall(r"^\s*(?:function\s+)?([A-Za-z_][\w-]*)\s*\(\)", text, re.M))


def strip_wrappers(tokens: list[str]) -> list[str]:
    """The command words from the command's name on: without assignments,
    $sudo, and the WRAPPERS with their options and arguments."""
    while tokens:
        word = tokens[0]
        if re.match(r"^[A-Za-z_]\w*(\[.*\])?\+?=", word) or re.match(r"^\$\{?sudo\}?$", word):
            tokens = tokens[1:]
        elif word in WRAPPERS:
            own_words, valued = WRAPPERS[word]
            tokens = tokens[1:]
            while tokens and tokens[0].startswith("-"):
                tokens = tokens[2 if tokens[0] in valued else 1:]
            tokens = tokens[own_words:]
        else:
            break
    return tokens


def shell_commands(text: str, functions: set[str]) -> list[list[str]]:
    """The commands a shell script runs, each as its words from the program
    on: every command of every line, pipeline and $(...). Quoted words,
    array literals, here-documents, case patterns, words with expansions
    and the shell functions named in `functions` are not programs."""
    text = re.sub(r"<<-?\s*['\"]?(\w+)['\"]?(.*?)\n(.*?)\n\s*\1\n", r"\2\n", text,
                  flags=re.S)  # here-documents: the text is data, the command stays
    text = re.sub(r"\\\n", " ", text)
    text = re.sub(r"(^|\s)#.*", r"\1", text)
    text = re.sub(r"(^|\n)[ \t]*[\w.*|-]+\)(?=[ \t\n])", r"\1", text)  # case patterns
    text = re.sub(r"\b\w+\+?=\((.*?)\)", "", text, flags=re.S)  # arrays
    text = re.sub(r"\$\(\(.*?\)\)", "", text)  # arithmetic
    text = re.sub(r"\d*(?:>>|>|<)&?\d*", " ", text)  # redirections
    substitutions = re.findall(r"\$\(([^()]*)\)", text)
    text = re.sub(r"\$\([^()]*\)", "\0", "\n".join([text] + substitutions))
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "\0", text)
    commands = []
    for part in re.split(r"\|\||&&|[;|&`(){}\n]", text):
        tokens = strip_wrappers(part.split())
        word = tokens[0] if tokens else ""
        if (word and word not in SHELL_WORDS and word not in functions
                and re.match(r"^[A-Za-z0-9_./+-]+$", word) and not word.startswith("-")):
            commands.append(tokens)
    return commands


def python_commands(tree: ast.AST) -> list[list[str]]:
    """Commands a Python file runs, as their literal words ("\\0" for one
    that is not a literal): the command given to a subprocess.* or os.*
    call named in RUNNERS (a literal list, or a literal string's words),
    and a literal list given to a local function of such a name (a wrapper
    of run)."""
    commands = []
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
            commands.append([e.value if isinstance(e, ast.Constant) and isinstance(e.value, str)
                             else "\0" for e in first.elts])
        elif module_call and isinstance(first, ast.Constant) and isinstance(first.value, str):
            commands.append(first.value.split())
    return [c for c in commands if c and c[0] not in ("", "\0")]


def c_command_words(text: str) -> list[str]:
    """Programs C and C++ code starts through system() or popen() with a
    literal command."""
    return [m.group(1) for m in re.finditer(r"\b(?:system|popen)\(\s*\"([A-Za-z0-9_./+-]+)", text)]


def source_files(source: str, patterns: list[str]) -> list[str]:
    files = []
    for pattern in patterns:
        files.extend(glob.glob(os.path.join(source, pattern), recursive=True))
    return sorted(set(f for f in files if os.path.isfile(f)))


def python_files(source: str) -> list[str]:
    return source_files(source, ["tests/**/*.py", "bench/*.py", "scripts/*.py",
                                 "python/**/*.py", "examples/*.py"])


def script_commands(source: str) -> list[tuple[list[str], str]]:
    """Every command of the shell scripts and Python files: (words, file)."""
    scripts = {f: read_text(f) for f in source_files(
        source, ["scripts/*.sh", ".ci/*", "tests/**/*.sh", "bench/*.sh"])}
    functions = set().union(*map(shell_functions, scripts.values()))
    found = [(c, f) for f, text in scripts.items() for c in shell_commands(text, functions)]
    for f in python_files(source):
        found += [(c, f) for c in python_commands(ast.parse(read_text(f), f))]
    return [(c, os.path.relpath(f, source)) for c, f in found]


def hand_installs(source: str) -> list[str]:
    """Failures for scripts and tests that install Debian packages
    themselves instead of listing them in scripts/setup.sh."""
    failures = []
    for words, where in script_commands(source):
        installs = (words[0] in ("apt-get", "apt", "aptitude") and "install" in words) or \
            (words[0] == "dpkg" and ("-i" in words or "--install" in words))
        if installs and where != os.path.join("scripts", "setup.sh"):
            failures.append(f"{where} installs Debian packages itself ({' '.join(words[:4])} "
                            f"...): list them in STRATA_PACKAGES in scripts/setup.sh instead")
    return failures


def ctest_tests(build: str) -> list[dict]:
    out = subprocess.run(["ctest", "--show-only=json-v1"], cwd=build, capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out).get("tests", [])


def program_uses(source: str, build: str) -> list[Use]:
    """Each program the scripts, tests and tools run, as a path on this
    machine (its bare name when it is not here)."""
    found = [(words[0], where) for words, where in script_commands(source)]
    for f in source_files(source, ["tests/**/*.c", "tests/**/*.cc", "tools/**/*.cc",
                                   "bench/*.cc"]):
        found += [(w, os.path.relpath(f, source)) for w in c_command_words(read_text(f))]
    for program, (named_in, why) in RUN_BY_OUR_TOOLS.items():
        if f'"{program}"' not in read_text(os.path.join(source, named_in)):
            raise SystemExit(f"deps_check: RUN_BY_OUR_TOOLS says {named_in} names "
                             f"'{program}', but it does not: update the table")
        found.append((program, why))
    found += [(t["command"][0], "ctest " + t["name"]) for t in ctest_tests(build)
              if t.get("command")]
    uses = []
    for word, where in found:
        if ("/" in word and not word.startswith("/")) or word in GPU_MACHINE_ONLY:
            continue  # relative: one of ours (build/bin/..., scripts/...)
        path = word if word.startswith("/") else shutil.which(word, path=SYSTEM_PATH)
        uses.append(Use(path or word, "program", where))
    return uses


# --- What the Python files import ------------------------------------------

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
    # Top-level modules only: strata/torch/deepspeed.py is not `deepspeed`.
    own = {os.path.splitext(os.path.basename(f))[0] for f in python_files(source)
           if not os.path.exists(os.path.join(os.path.dirname(f), "__init__.py"))}
    own |= {os.path.basename(d) for d in glob.glob(os.path.join(source, "python", "*"))}
    for f in python_files(source):
        modules = imported_modules(ast.parse(read_text(f), f))
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
                                f"in tests/install/deps_scan.py)")
                continue
            origin = spec.origin if spec.origin not in (None, "built-in", "frozen") \
                else os.path.realpath(sys.executable)
            uses.append(Use(origin, "python module", f"{rel} (import {name})"))
    for name in sorted(set(VENV_ONLY) - seen_venv):
        failures.append(f"VENV_ONLY names '{name}', which nothing imports any more: remove it")
    return uses, failures
