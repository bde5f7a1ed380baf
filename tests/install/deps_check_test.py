#!/usr/bin/python3
"""Tests of tests/install/deps_check.py, the check that every dependency comes
from the README commands: that it fails, naming the package and the fix,
when a package is dropped from a copy of STRATA_PACKAGES; and that each of
its readers (dependency files, CMake's cache, the shell, Python and C
command scanners, dpkg's owners, the dpkg status closure) finds what it
must and nothing else.

Run: /usr/bin/python3 tests/install/deps_check_test.py SOURCE_DIR BUILD_DIR
"""

import ast
import os
import re
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import deps_check as dc  # noqa: E402
import deps_scan as ds  # noqa: E402

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
        # It names a header of the package that the build used.
        self.assertRegex(proc.stdout, r"it owns /usr/include/xx\w*\.h ")

    def test_dropping_a_package_names_every_used_one_it_alone_brought(self):
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
            lost = dc.closure(listed, db) - dc.closure(rest, db) - dc.base_packages(db)
            needed = sorted(lost & used)
            named = sorted(p for p in needed if any(f"`{p}`" in f for f in report.failures))
            self.assertEqual(named, needed, f"dropping {package}: {report.failures}")
            if package in needed:
                caught.append(package)
        for package in ("libxxhash-dev", "liburing-dev", "libtbb-dev", "fio", "python3-torch",
                        "patchelf"):
            self.assertIn(package, caught)


class BuildReaderTest(unittest.TestCase):
    def test_depfile(self):
        text = "a.o: /src/a.cc /usr/include/x.h \\\n /usr/include/with\\ space.h\n"
        self.assertEqual(ds.depfile_paths(text),
                         ["/src/a.cc", "/usr/include/x.h", "/usr/include/with space.h"])

    def test_cmake_cache_takes_file_paths_and_package_configs(self):
        with tempfile.TemporaryDirectory() as tmp:
            config = os.path.join(tmp, "FooConfig.cmake")
            open(config, "w").close()
            text = (f"CMAKE_CXX_COMPILER:FILEPATH=/usr/bin/c++\nFoo_DIR:PATH={tmp}\n"
                    "CMAKE_COMMAND:INTERNAL=/usr/bin/cmake\nNUMA_INCLUDE_DIR:PATH=/usr/include\n"
                    "CMAKE_BUILD_TYPE:STRING=Release\n")
            self.assertEqual(ds.cmake_cache_paths(text),
                             ["/usr/bin/c++", config, "/usr/bin/cmake"])

    def test_a_build_without_dependency_files_fails(self):
        with tempfile.TemporaryDirectory() as tmp:
            open(os.path.join(tmp, "CMakeCache.txt"), "w").close()
            nested = os.path.join(tmp, "install-test", "CMakeFiles")
            os.makedirs(nested)
            open(os.path.join(nested, "x.o.d"), "w").close()  # not this build's
            uses, failures = ds.build_uses(tmp)
        self.assertEqual(uses, [])
        self.assertEqual(len(failures), 1)
        self.assertIn("no compiler dependency files", failures[0])


SCRIPT = """#!/bin/bash
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
"$bin" --help
case "$1" in
  cuda) start=1 ;;
  *) nohup sleep 1 ;;
esac
sudo -E -u nobody true; env -u LD_LIBRARY_PATH ldd /bin/sh; timeout -s KILL 5 fio
v=$(ls | wc -l)
python3 - "$x" <<'EOF'
import os
print(os.getcwd())
EOF
"""


class CommandReaderTest(unittest.TestCase):
    def test_shell_commands(self):
        commands = ds.shell_commands(SCRIPT, ds.shell_functions(SCRIPT))
        self.assertEqual(sorted(c[0] for c in commands),
                         ["apt-get", "build/bin/tool", "cmake", "fio", "grep", "id", "ldd",
                          "ls", "nproc", "python3", "sleep", "sort", "wc"])
        self.assertIn(["apt-get", "install", "-y", "\0"], commands)

    def test_python_commands(self):
        code = """
import os, subprocess
subprocess.run(["fio", "--version"])
subprocess.check_output("ldd /bin/sh", shell=True)
os.execv(py, [py, "x"])
run(["apt-get", "install", name], "installing")
self.call("strata_view_get_tensor", view)
job.run("write", cfg)
"""
        self.assertEqual(ds.python_commands(ast.parse(code)),
                         [["fio", "--version"], ["ldd", "/bin/sh"],
                          ["apt-get", "install", "\0"]])

    def test_c_words(self):
        code = 'std::system("fio --version"); popen("ls", "r"); system(cmd.c_str());'
        self.assertEqual(ds.c_command_words(code), ["fio", "ls"])

    def test_imports(self):
        tree = ast.parse("import a.b, c\nfrom d.e import f\nfrom . import g\n")
        self.assertEqual(ds.imported_modules(tree), {"a", "c", "d"})

    def test_hand_installs_outside_setup_fail(self):
        with tempfile.TemporaryDirectory() as tmp:
            os.makedirs(os.path.join(tmp, "scripts"))
            os.makedirs(os.path.join(tmp, "bench"))
            with open(os.path.join(tmp, "scripts", "setup.sh"), "w") as f:
                f.write("apt-get install -y fio\n")
            with open(os.path.join(tmp, "bench", "peer.py"), "w") as f:
                f.write('import subprocess\nsubprocess.run(["apt-get", "install", "-y", "x"])\n')
            failures = ds.hand_installs(tmp)
        self.assertEqual(len(failures), 1)
        self.assertIn("bench/peer.py installs Debian packages itself", failures[0])


STATUS = """Package: top
Status: install ok installed
Priority: optional
Depends: lib1 (>= 1), lib2:any | missing-a, virt, missing-b | lib3

Package: lib1
Status: install ok installed
Priority: optional
Pre-Depends: base

Package: lib2
Status: install ok installed
Priority: optional

Package: lib3
Status: install ok installed
Priority: optional

Package: provider
Status: install ok installed
Priority: optional
Provides: virt (= 2)

Package: base
Status: install ok installed
Priority: required

Package: nice
Status: install ok installed
Priority: important

Package: gone
Status: deinstall ok config-files
Priority: optional
"""


class PackageTest(unittest.TestCase):
    def setUp(self):
        self.db = dc.parse_status(STATUS)

    def test_closure_takes_first_alternatives_and_providers(self):
        # lib3 is installed, but apt would install missing-b, the first.
        self.assertEqual(dc.closure(["top"], self.db), {"top", "lib1", "lib2", "provider", "base"})
        self.assertNotIn("gone", self.db.priority)
        self.assertEqual(dc.base_packages(self.db), {"base"})

    def test_evaluate_names_the_owner_the_unowned_and_the_fix(self):
        uses = [dc.Use("/usr/include/o.h", "header", "x.o.d"),
                dc.Use("/usr/include/b.h", "header", "x.o.d"),
                dc.Use("/usr/include/n.h", "header", "x.o.d"),
                dc.Use("/usr/local/cuda/include/c.h", "header", "y.o.d"),
                dc.Use("/usr/local/lib/libhand.so", "library", "link.txt")]
        owners = {"/usr/include/o.h": ["lib3"], "/usr/include/b.h": ["base"],
                  "/usr/include/n.h": ["nice"]}
        report = dc.evaluate(uses, owners, ["top"], self.db)
        self.assertEqual(len(report.failures), 3, report.failures)
        self.assertIn("/usr/local/lib/libhand.so (library), which comes from no Debian package",
                      report.failures[0])
        self.assertIn("add `lib3` to STRATA_PACKAGES in scripts/setup.sh: it owns "
                      "/usr/include/o.h (header, used by x.o.d", report.failures[1])
        self.assertIn("add `nice`", report.failures[2])
        self.assertEqual([u.path for u in report.unowned], ["/usr/local/cuda/include/c.h"])
        self.assertEqual(len(dc.evaluate(uses, owners, ["top", "lib3", "nice"],
                                         self.db).failures), 1)

    def test_owners_of_paths_that_share_a_real_path(self):
        owners = dc.dpkg_owners(["/usr/bin/awk", "/usr/bin/nawk", "/bin/sh"])
        self.assertEqual(owners["/usr/bin/awk"], owners["/usr/bin/nawk"])
        self.assertIn("dash", owners["/bin/sh"])


if __name__ == "__main__":
    SOURCE, BUILD = sys.argv[1], sys.argv[2]
    unittest.main(argv=sys.argv[:1])
