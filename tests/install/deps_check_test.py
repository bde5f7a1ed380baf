#!/usr/bin/python3
"""Tests of tests/install/deps_check.py, the check that every dependency comes
from the README commands: that it fails, naming the package and the fix,
when a package is dropped from a copy of STRATA_PACKAGES; and that each of
its readers (dependency files, CMake's cache, shell, Python and C command
scanners, the dpkg status closure) finds what it must and nothing else.

Run: /usr/bin/python3 tests/install/deps_check_test.py SOURCE_DIR BUILD_DIR
"""

import os
import re
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import deps_check as dc  # noqa: E402

SOURCE = BUILD = ""


def setup_without(package: str, directory: str) -> str:
    """A copy of scripts/setup.sh whose STRATA_PACKAGES lacks `package`."""
    with open(os.path.join(SOURCE, "scripts", "setup.sh")) as f:
        text = f.read()
    start = text.index("STRATA_PACKAGES=(")
    end = text.index("\n)", start)
    body = re.sub(rf"(?<![\w.+-]){re.escape(package)}(?![\w.+-])", "", text[start:end])
    path = os.path.join(directory, "setup.sh")
    with open(path, "w") as f:
        f.write(text[:start] + body + text[end:])
    return path


class DroppedPackageTest(unittest.TestCase):
    def test_the_check_names_a_dropped_package_and_the_fix(self):
        with tempfile.TemporaryDirectory() as tmp:
            setup = setup_without("libxxhash-dev", tmp)
            self.assertNotIn("libxxhash-dev", dc.listed_packages(setup))
            proc = subprocess.run(
                [sys.executable, os.path.join(HERE, "deps_check.py"), "--source", SOURCE,
                 "--build", BUILD, "--setup", setup], capture_output=True, text=True)
        self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)
        self.assertIn("add `libxxhash-dev` to STRATA_PACKAGES in scripts/setup.sh", proc.stdout)
        self.assertIn("/usr/include/xxhash.h", proc.stdout)

    def test_every_listed_package_is_needed_or_pulled_in_by_the_others(self):
        uses, failures = dc.collect(SOURCE, BUILD)
        self.assertEqual(failures, [])
        owners = dc.dpkg_owners(sorted({u.path for u in uses}))
        with open(dc.STATUS_FILE) as f:
            db = dc.parse_status(f.read())
        listed = dc.listed_packages(os.path.join(SOURCE, "scripts", "setup.sh"))
        self.assertEqual(dc.evaluate(uses, owners, listed, db).failures, [])
        used = {p for u in uses for p in owners.get(u.path, [])}
        caught = []
        for package in listed:
            rest = [p for p in listed if p != package]
            report = dc.evaluate(uses, owners, rest, db)
            lost = dc.closure(listed, db) - dc.closure(rest, db)
            needed = sorted(lost & used - {p for p, prio in db.priority.items()
                                           if prio in ("required", "important")})
            named = sorted(p for p in needed if any(f"`{p}`" in f for f in report.failures))
            self.assertEqual(named, needed, f"dropping {package}: {report.failures}")
            if package in needed:
                caught.append(package)
        for package in ("libxxhash-dev", "liburing-dev", "libtbb-dev", "fio", "python3-torch",
                        "patchelf"):
            self.assertIn(package, caught)


class ReaderTest(unittest.TestCase):
    def test_depfile(self):
        text = "a.o: /src/a.cc /usr/include/x.h \\\n /usr/include/with\\ space.h\n"
        self.assertEqual(dc.depfile_paths(text),
                         ["/src/a.cc", "/usr/include/x.h", "/usr/include/with space.h"])

    def test_cmake_cache_takes_file_paths_and_package_configs(self):
        with tempfile.TemporaryDirectory() as tmp:
            config = os.path.join(tmp, "FooConfig.cmake")
            open(config, "w").close()
            text = (f"CMAKE_CXX_COMPILER:FILEPATH=/usr/bin/c++\nFoo_DIR:PATH={tmp}\n"
                    "CMAKE_COMMAND:INTERNAL=/usr/bin/cmake\nNUMA_INCLUDE_DIR:PATH=/usr/include\n"
                    "CMAKE_BUILD_TYPE:STRING=Release\n")
            self.assertEqual(dc.cmake_cache_paths(text),
                             ["/usr/bin/c++", config, "/usr/bin/cmake"])

    def test_shell_words(self):
        script = """#!/bin/bash
PKGS=(
  libfoo-dev  # comment
  bar
)
helper() { cmake --build "$1" -j"$(nproc)"; }
missing+=("$pkg")
[ "$(id -u)" -ne 0 ] && sudo=sudo
$sudo apt-get install -y "${PKGS[@]}"   # installs
X=1 exec build/bin/tool --flag "quoted words" | grep -q 'a b'
echo "$((1 + 2)) (not a command)" >&2; helper 2>&1 | sort
python3 - "$x" <<'EOF'
import os
print(os.getcwd())
EOF
"""
        words = dc.shell_command_words(script, dc.shell_functions(script))
        self.assertEqual(sorted(words),
                         ["apt-get", "build/bin/tool", "cmake", "grep", "id", "nproc",
                          "python3", "sort"])

    def test_python_words(self):
        code = """
import os, subprocess
subprocess.run(["fio", "--version"])
subprocess.check_output("ldd /bin/sh", shell=True)
os.execv(py, [py, "x"])
run(["apt-get", "update"], "apt-get update")
self.call("strata_view_get_tensor", view)
job.run("write", cfg)
"""
        self.assertEqual(dc.python_command_words(dc.ast.parse(code)), ["fio", "ldd", "apt-get"])

    def test_c_words(self):
        code = 'std::system("fio --version"); popen("ls", "r"); system(cmd.c_str());'
        self.assertEqual(dc.c_command_words(code), ["fio", "ls"])

    def test_imports(self):
        tree = dc.ast.parse("import a.b, c\nfrom d.e import f\nfrom . import g\n")
        self.assertEqual(dc.imported_modules(tree), {"a", "c", "d"})


STATUS = """Package: top
Status: install ok installed
Priority: optional
Depends: lib1 (>= 1), missing-a | lib2:any, virt

Package: lib1
Status: install ok installed
Priority: optional
Pre-Depends: base

Package: lib2
Status: install ok installed
Priority: optional

Package: provider
Status: install ok installed
Priority: optional
Provides: virt (= 2)

Package: base
Status: install ok installed
Priority: required

Package: gone
Status: deinstall ok config-files
Priority: optional

Package: other
Status: install ok installed
Priority: optional
"""


class PackageTest(unittest.TestCase):
    def setUp(self):
        self.db = dc.parse_status(STATUS)

    def test_closure_follows_depends_alternatives_and_provides(self):
        self.assertEqual(dc.closure(["top"], self.db), {"top", "lib1", "lib2", "provider", "base"})
        self.assertNotIn("gone", self.db.priority)

    def test_evaluate_names_the_owner_and_the_fix(self):
        uses = [dc.Use("/usr/include/o.h", "header", "x.o.d"),
                dc.Use("/usr/include/b.h", "header", "x.o.d"),
                dc.Use("/usr/local/cuda/include/c.h", "header", "y.o.d")]
        owners = {"/usr/include/o.h": ["other"], "/usr/include/b.h": ["base"]}
        report = dc.evaluate(uses, owners, ["top"], self.db)
        self.assertEqual(len(report.failures), 1)
        self.assertIn("add `other` to STRATA_PACKAGES in scripts/setup.sh: it owns "
                      "/usr/include/o.h (header, used by x.o.d", report.failures[0])
        self.assertEqual([u.path for u in report.unowned], ["/usr/local/cuda/include/c.h"])
        self.assertEqual(dc.evaluate(uses, owners, ["top", "other"], self.db).failures, [])


if __name__ == "__main__":
    SOURCE, BUILD = sys.argv[1], sys.argv[2]
    unittest.main(argv=sys.argv[:1])
