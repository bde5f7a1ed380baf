#!/usr/bin/python3
"""The GPU check's bundle, proven where there may be no GPU: made from this
build by scripts/gpu-bundle.sh --no-build, it fits in the 64 MiB a device
run carries; every program's and library's run path is relative to itself
(DT_RPATH, ahead of any LD_LIBRARY_PATH) and, with no LD_LIBRARY_PATH,
every library resolves inside the bundle or is glibc's; copied to a fresh
directory (the one made is removed first), its gpu-check.sh runs with an
empty environment, and the dynamic loader's trace shows each program
loading nothing from outside the bundle but glibc (and the NVIDIA
driver). Without a GPU the CUDA parts are reported skipped, with the
reason, and the others pass (exit 77); with one, every part passes (exit
0).

Run: /usr/bin/python3 tests/install/gpu_bundle_test.py SOURCE_DIR BUILD_DIR
Exit status 77 (skipped) when the build has no CUDA.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

SOURCE = BUILD = ""
LIMIT = 64 << 20
GLIBC = re.compile(r"^(linux-vdso|ld-linux-x86-64|libc|libm|libmvec|libpthread|libdl|librt"
                   r"|libresolv|libutil|libanl|libnss_\w+|libthread_db)\.so")
DRIVER = re.compile(r"^(libcuda|libnvidia-[\w-]+)\.so")


def elf_files(root: str) -> list[str]:
    return sorted(os.path.join(root, d, f) for d in ("bin", "lib")
                  for f in os.listdir(os.path.join(root, d)))


class GpuBundleTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        scratch = os.path.join(BUILD, "test-scratch")
        os.makedirs(scratch, exist_ok=True)
        cls.tmp = tempfile.mkdtemp(prefix="gpu-bundle-", dir=scratch)
        made = os.path.join(cls.tmp, "made")
        proc = subprocess.run([os.path.join(SOURCE, "scripts", "gpu-bundle.sh"), "--build",
                               BUILD, "--out", made, "--no-build"], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        cls.made_output = proc.stdout
        cls.bundle = os.path.join(cls.tmp, "fresh")
        shutil.copytree(made, cls.bundle, symlinks=True)
        shutil.rmtree(made)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def loaded_only_from_the_bundle(self, trace: str) -> int:
        """Checks the dynamic loader's trace of every bundle program: each
        object it loaded lies in the bundle, or is glibc's or the NVIDIA
        driver's. Returns how many programs' traces it read."""
        programs = 0
        for name in os.listdir(trace):
            with open(os.path.join(trace, name), errors="replace") as f:
                text = f.read()
            if f"from file {self.bundle}/bin/" not in text:
                continue  # python3, bash: not ours
            programs += 1
            for path in re.findall(r"calling init: (\S+)", text):
                inside = os.path.realpath(path).startswith(self.bundle + os.sep)
                ok = inside or GLIBC.match(os.path.basename(path)) or DRIVER.match(
                    os.path.basename(path))
                self.assertTrue(ok, f"{name}: loaded {path}")
        return programs

    def test_fits_what_a_device_run_carries(self):
        size = sum(os.path.getsize(os.path.join(d, f))
                   for d, _, fs in os.walk(self.bundle) for f in fs)
        self.assertLessEqual(size, LIMIT)
        self.assertIn("of the 64 MiB a device run carries", self.made_output)
        with open(os.path.join(self.bundle, "MANIFEST.json")) as f:
            manifest = json.load(f)
        self.assertRegex(manifest["glibc_needed"], r"^2\.\d+$")
        self.assertIn("bin/pcie_bench", manifest["files"])

    def test_every_library_resolves_inside_or_is_glibc(self):
        env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
        for path in elf_files(self.bundle):
            dynamic = subprocess.run(["readelf", "-d", path], capture_output=True,
                                     text=True, check=True).stdout
            runpath = re.search(r"\(RPATH\).*\[(.*)\]", dynamic)
            self.assertIsNotNone(runpath, path)
            self.assertTrue(runpath[1].startswith("$ORIGIN"), f"{path}: {runpath[1]}")
            ldd = subprocess.run(["ldd", path], capture_output=True, text=True, env=env,
                                 check=True).stdout
            for soname, target in re.findall(r"^\s*(\S+) => (.*?)(?: \(0x[0-9a-f]+\))?$",
                                             ldd, re.M):
                inside = os.path.realpath(target).startswith(self.bundle + os.sep)
                self.assertTrue(inside or GLIBC.match(soname), f"{path}: {soname} => {target}")

    def test_the_check_runs_from_the_fresh_copy_loading_only_its_own_libraries(self):
        report = os.path.join(self.tmp, "report.json")
        trace = os.path.join(self.tmp, "ld-trace")
        os.makedirs(trace)
        proc = subprocess.run([os.path.join(self.bundle, "gpu-check.sh"), "--report", report],
                              env={"PATH": "/usr/bin:/bin", "HOME": self.tmp, "LD_DEBUG": "libs",
                                   "LD_DEBUG_OUTPUT": os.path.join(trace, "pid")},
                              cwd=self.tmp, capture_output=True, text=True)
        self.assertGreaterEqual(self.loaded_only_from_the_bundle(trace), 5)
        with open(report) as f:
            doc = json.load(f)
        out = proc.stdout + proc.stderr
        self.assertEqual(proc.returncode, 0 if doc["gpu"] else 77, out)
        self.assertEqual(doc["result"], "passed" if doc["gpu"] else "skipped")
        for part in doc["parts"]:
            if part["cuda"] and not doc["gpu"]:
                self.assertEqual(part["status"], "skipped", part)
                self.assertTrue(part["reason"], part)
            else:
                self.assertEqual(part["status"], "passed", part)
        self.assertGreater(sum(p["cuda"] for p in doc["parts"]), 3)
        self.assertGreater(sum(not p["cuda"] for p in doc["parts"]), 2)
        if not doc["gpu"]:
            self.assertIn("no GPU here", doc["why_no_gpu"])
            self.assertIn("the CUDA parts are SKIPPED", out)
        for own in ("bin", "lib"):
            self.assertNotIn(os.path.join(BUILD, own), json.dumps(doc))


if __name__ == "__main__":
    SOURCE, BUILD = (os.path.realpath(p) for p in sys.argv[1:3])
    if not os.path.exists(os.path.join(BUILD, "bin", "pcie_bench")):
        print("skipped: this build has no CUDA (nvcc was not found at configure), so there is "
              "no GPU bundle to make")
        sys.exit(77)
    unittest.main(argv=sys.argv[:1])
