#!/usr/bin/env python3
"""The GPU check: everything strata runs on a CUDA GPU, in one command, over
the bundle that scripts/gpu-bundle.sh made (no build and no package on the
GPU machine; Python's standard library only). scripts/gpu-check.sh runs it.

Parts, each passed, failed or skipped, with its figures and seconds:
- a GPU probe: pcie_bench on 1 MiB. A machine whose NVIDIA driver is there
  but cannot run the bundle (a driver older than the bundle's CUDA) fails
  here, naming both versions; only a machine with no NVIDIA driver at all
  counts as having no GPU;
- the CUDA test cases of the bundled test programs (a case whose name says
  CUDA or GPU, but not WithoutCuda, or that skips naming CUDA or a GPU):
  none may skip on a GPU machine; and every other case of those programs;
- the C ABI's lifecycle test, whose kDLCUDA export must run on a GPU;
- pcie_bench: strata's host<->device copies against cudaMemcpy of the same
  bytes on the same pinned buffers, after a byte round trip;
- store_bench on the CUDA device, every byte verified, and the same run on
  the host-emulated device beside it;
- strata-sim on the CUDA device with 2 GB of weights through a 1 GiB
  device budget (overlap and after_backward against a resident run), and a
  small strata-sim on the host-emulated device;
- strata.torch's tests (python/tests/torch) on the CUDA device with this
  machine's python3 and its torch (>= 2.1), pytest from the bundle.
Without a GPU the CUDA parts are reported as skipped, with the reason, and
the rest still runs. The whole check stays within 7.5 minutes: a part that
would run past that is cut off and fails.

Writes one JSON report (--report; default $OUT/gpu-check.json when OUT is
set, else ./gpu-check.json), rewritten after every part: the bundle's
manifest, the machine (CPU, GPU, driver and CUDA versions) and every part.
Exit status: 0 when everything passed on a GPU; 77 when there is no GPU
(CUDA parts skipped, the rest passed); 1 when a part failed; 2 when the
bundle cannot run here or is older than the sources beside it (--source).
`gpu_check.py --digest DIR` prints the digest of a source tree that
MANIFEST.json records.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

TEST_PROGRAMS = ["device_test", "pinned_pool_test", "sim_busy_test"]
SKIP = 77
NO_GPU = "no GPU (see the probe)"
BUDGET_S = 450  # the whole check stays under 8 minutes
DEADLINE = [float("inf")]
SOURCE_DIRS = ["aio", "bench", "cmake", "common", "cpu_adam", "examples", "include", "python",
               "scripts", "src", "tests", "tools"]


def run(cmd: list[str], timeout: float, env: dict | None = None) -> tuple[int, str, float]:
    """Runs cmd, for `timeout` seconds at most and never past the check's
    deadline; returns its exit status, its output and its seconds."""
    start = time.monotonic()
    timeout = min(timeout, DEADLINE[0] - start)
    if timeout < 5:
        return -1, f"not run: the check's {BUDGET_S / 60:g} minutes are spent", 0.0
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout, env=env)
        rc, out = proc.returncode, proc.stdout
    except subprocess.TimeoutExpired as e:
        rc, out = -1, (e.stdout or b"").decode(errors="replace") + f"\ntimed out after {timeout} s"
    except OSError as e:
        rc, out = -1, f"cannot run {cmd[0]}: {e}"
    return rc, out, round(time.monotonic() - start, 2)


def tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def part(name: str, cuda: bool, status: str, **fields) -> dict:
    return {"name": name, "cuda": cuda, "status": status, **fields}


def load_json(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def source_digest(root: str) -> str:
    """SHA-256 over the names and bytes of the source files under `root`
    (SOURCE_DIRS and the top-level CMake files), caches left out."""
    h = hashlib.sha256()
    files = ["CMakeLists.txt", "CMakePresets.json"]
    for top in SOURCE_DIRS:
        for d, dirs, names in os.walk(os.path.join(root, top)):
            dirs[:] = [x for x in dirs if x != "__pycache__"]
            files += [os.path.relpath(os.path.join(d, n), root) for n in names]
    for rel in sorted(files):
        path = os.path.join(root, rel)
        if os.path.isfile(path) and not rel.endswith(".pyc"):
            with open(path, "rb") as f:
                h.update(rel.encode() + b"\0" + f.read() + b"\0")
    return h.hexdigest()


# --- The machine -------------------------------------------------------------

def glibc_problem(manifest: dict) -> str | None:
    """Why this machine's C library cannot run the bundle, if it cannot."""
    need = manifest.get("glibc_needed", "0")
    have = (os.confstr("CS_GNU_LIBC_VERSION") or "glibc 0").split()[-1]
    if tuple(map(int, have.split("."))) < tuple(map(int, need.split("."))):
        return (f"the bundle needs glibc {need} and this machine has {have}: build the "
                f"bundle on a system with glibc {have} or older")
    return None


def nvidia_smi() -> dict:
    """The GPU as its driver describes it; {} without nvidia-smi."""
    if not shutil.which("nvidia-smi"):
        return {}
    info = {}
    rc, out, _ = run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,"
                      "pcie.link.gen.max,pcie.link.width.max", "--format=csv,noheader"], 30)
    if rc == 0 and out.strip():
        keys = ["name", "driver", "memory", "pcie_gen", "pcie_width"]
        info = dict(zip(keys, (v.strip() for v in out.splitlines()[0].split(","))))
    rc, out, _ = run(["nvidia-smi"], 30)
    m = re.search(r"CUDA Version: ([\d.]+)", out)
    if m:
        info["driver_cuda"] = m[1]
    return info


def machine() -> dict:
    info = {"nproc": os.cpu_count(), "kernel": platform.release(),
            "glibc": os.confstr("CS_GNU_LIBC_VERSION"), "gpu": nvidia_smi()}
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next((line.split(":", 1)[1].strip() for line in f
                                if line.startswith("model name")), "?")
    except OSError:
        info["cpu"] = "?"
    return info


def nvidia_driver_present() -> bool:
    return os.path.exists("/proc/driver/nvidia/version") or os.path.exists("/dev/nvidiactl")


def probe_gpu(bundle: str, env: dict, manifest: dict, gpu_info: dict) -> dict:
    """A part that says whether a CUDA GPU runs the bundle's CUDA code:
    passed (a GPU), skipped (no NVIDIA driver here, with the reason) or
    failed (a driver is here and the bundle cannot use it)."""
    name = "GPU probe (pcie_bench, 1 MiB)"
    pcie = os.path.join(bundle, "bin", "pcie_bench")
    if not os.path.exists(pcie):
        return part(name, True, "skipped",
                    reason="the bundle was built without CUDA (no nvcc at configure)")
    rc, out, seconds = run([pcie, "--sizes", "1M", "--repeat", "1"], 120, env)
    if rc == 0:
        return part(name, True, "passed", seconds=seconds)
    if rc == SKIP and not nvidia_driver_present():
        return part(name, True, "skipped", seconds=seconds,
                    reason="no GPU here: " + tail(out, 1).replace("pcie_bench: skipped: ", ""))
    versions = (f"the driver ({gpu_info.get('driver', '?')}) runs CUDA up to "
                f"{gpu_info.get('driver_cuda', '?')}, the bundle's runtime is CUDA "
                f"{manifest.get('cuda_runtime', '?')}")
    return part(name, True, "failed", seconds=seconds, exit_status=rc, output_tail=tail(out),
                problems=[f"an NVIDIA driver is here but the bundle cannot use the GPU: "
                          f"{versions}; make the bundle with a CUDA toolkit the driver runs"])


# --- The test programs -------------------------------------------------------

def is_cuda_case(case: dict) -> bool:
    """A case that needs a GPU: its name says CUDA or GPU (not WithoutCuda),
    or it skipped naming CUDA or a GPU other than for being on one."""
    named = re.search(r"cuda|gpu", case["name"], re.I) and "WithoutCuda" not in case["name"]
    message = case["message"]
    skipped_for_gpu = (case["result"] == "skipped" and re.search(r"CUDA|GPU", message)
                       and "present here" not in message)
    return bool(named or skipped_for_gpu)


def parse_cases(program: str, xml: str) -> list[dict]:
    """The cases of one gtest XML report: name, result, message."""
    cases = []
    for case in ET.parse(xml).getroot().iter("testcase"):
        failure, skipped = case.find("failure"), case.find("skipped")
        node = failure if failure is not None else skipped
        result = "failed" if failure is not None else "skipped" if skipped is not None \
            else "skipped" if case.get("status") == "notrun" else "passed"
        message = node.get("message", "") if node is not None else \
            "disabled" if case.get("status") == "notrun" else ""
        cases.append({"name": f"{program}: {case.get('classname')}.{case.get('name')}",
                      "result": result, "message": message})
    return cases


def test_cases(bundle: str, work: str, env: dict) -> tuple[list[dict], list[str]]:
    """Every case of the test programs, and the programs that did not
    finish as their cases say."""
    cases, broken = [], []
    for program in TEST_PROGRAMS:
        xml = os.path.join(work, program + ".xml")
        rc, out, _ = run([os.path.join(bundle, "bin", program), f"--gtest_output=xml:{xml}"],
                         180, env)
        try:
            mine = parse_cases(program, xml)
        except (OSError, ET.ParseError) as e:
            broken.append(f"{program} (exit {rc}) left no readable report ({e}): {tail(out, 10)}")
            continue
        if rc != 0 and all(c["result"] != "failed" for c in mine):
            broken.append(f"{program} exited {rc} though no case failed: {tail(out, 10)}")
        cases += mine
    return cases, broken


def test_parts(cases: list[dict], broken: list[str], gpu: bool) -> list[dict]:
    parts = []
    for cuda in (True, False):
        mine = [c for c in cases if is_cuda_case(c) == cuda]
        failed = [c for c in mine if c["result"] == "failed"]
        skipped = [c for c in mine if c["result"] == "skipped"]
        figures = {"cases": len(mine), "failed": len(failed), "skipped": len(skipped),
                   "passed": len(mine) - len(failed) - len(skipped)}
        name = "CUDA test cases" if cuda else "other test cases of those programs"
        problems = [f"{c['name']}: {c['message'][:300]}" for c in failed] + broken
        if cuda and gpu:
            problems += [f"{c['name']} skipped on a GPU machine: {c['message']}" for c in skipped]
        skipped_names = [f"{c['name']}: {c['message']}" for c in skipped]
        if problems:
            parts.append(part(name, cuda, "failed", figures=figures, problems=problems))
        elif cuda and not gpu:
            parts.append(part(name, cuda, "skipped", figures=figures, reason=NO_GPU,
                              skipped_cases=skipped_names))
        else:
            parts.append(part(name, cuda, "passed", figures=figures, skipped_cases=skipped_names))
    return parts


def capi_part(bundle: str, env: dict, gpu: bool) -> dict:
    """The C ABI's lifecycle test; on a GPU its kDLCUDA export must run."""
    name = "C ABI lifecycle (kDLCUDA export on a GPU)"
    rc, out, seconds = run([os.path.join(bundle, "bin", "capi_lifecycle_test")], 120, env)
    not_checked = "kDLCUDA export not checked" in out
    if rc != 0 or (gpu and not_checked):
        why = f"exit {rc}" if rc != 0 else "the kDLCUDA export did not run on a GPU machine"
        return part(name, False, "failed", seconds=seconds, exit_status=rc, problems=[why],
                    output_tail=tail(out))
    return part(name, False, "passed", seconds=seconds,
                figures={"kdlcuda_export_checked": not not_checked})


# --- The benchmarks ----------------------------------------------------------

def store_figures(out: str) -> dict:
    figures = {}
    m = re.search(r"hit rate ([\d.]+)% \(prefetch hits ([\d.]+)%\), stall ([\d.]+) s of "
                  r"([\d.]+) s", out)
    if m:
        figures = {"hit_rate": float(m[1]) / 100, "prefetch_hit_rate": float(m[2]) / 100,
                   "stall_seconds": float(m[3]), "run_seconds": float(m[4])}
    for a, b, gib in re.findall(r"moved (\w+)->(\w+): ([\d.]+) GiB", out):
        figures[f"{a}->{b}_gib"] = float(gib)
    figures["verified"] = "verify: OK" in out
    return figures


def sim_figures(path: str) -> dict:
    doc = load_json(path)
    runs = {r["mode"]: {"steady_step_seconds": r["steady_step_seconds"],
                        "offload_efficiency": r.get("offload_efficiency"),
                        "last_step_stall": r["steps"][-1]["stall"],
                        "optimizer_hidden_fraction": r["steps"][-1]["optimizer_hidden_fraction"],
                        "device_peak": r["memory"]["device"]["peak"],
                        "device_budget": r["memory"]["device"]["budget"]}
            for r in doc.get("runs", [])}
    return {"params": doc["params"], "compute_seconds": doc["compute_seconds"],
            "resident_step_seconds": doc.get("resident_step_seconds"), "runs": runs}


def command_parts(bundle: str, work: str) -> list[tuple]:
    """(name, cuda, command, timeout, figures(output, json path)) of each
    part that is one program run."""
    b = lambda p: os.path.join(bundle, "bin", p)  # noqa: E731
    j = lambda n: os.path.join(work, n + ".json")  # noqa: E731
    store = ["--groups", "32", "--group-mib", "16", "--device-budget-mib", "128",
             "--host-budget-mib", "256", "--passes", "6", "--compute-ms", "2",
             "--swap-dir", os.path.join(work, "swap")]
    sim_cuda = ["--params", "1G", "--layers", "16", "--device", "cuda", "--device-budget", "1G",
                "--host-budget", "20G", "--state-home", "host", "--steps", "5",
                "--tokens", "16384", "--tflops", "400", "--mode", "overlap,after_backward"]
    sim_host = ["--params", "64M", "--layers", "8", "--device", "host", "--device-budget", "64M",
                "--host-budget", "2G", "--state-home", "host", "--steps", "3", "--tflops", "4"]
    with_json = lambda f: (lambda out, path: f(path))  # noqa: E731
    return [
        ("pcie_bench (strata vs cudaMemcpy)", True,
         [b("pcie_bench"), "--sizes", "1M,16M,256M", "--repeat", "20", "--json", j("pcie")], 120,
         with_json(load_json)),
        ("store_bench --device cuda", True, [b("store_bench"), "--device", "cuda", *store], 90,
         lambda out, _: store_figures(out)),
        ("store_bench --device host (beside it)", False,
         [b("store_bench"), "--device", "host", *store], 90, lambda out, _: store_figures(out)),
        ("strata-sim --device cuda, 2 GB of weights through a 1 GiB device budget", True,
         [b("strata-sim"), *sim_cuda, "--json", j("sim-cuda")], 180, with_json(sim_figures)),
        ("strata-sim --device host (small)", False,
         [b("strata-sim"), *sim_host, "--json", j("sim-host")], 60, with_json(sim_figures)),
    ]


def run_command_part(spec: tuple, work: str, env: dict, gpu: bool) -> dict:
    name, cuda, cmd, timeout, figures_of = spec
    shown = " ".join(os.path.relpath(c, work) if c.startswith(work) else c for c in cmd)
    if cuda and not gpu:
        return part(name, cuda, "skipped", reason=NO_GPU, command=shown)
    json_path = cmd[cmd.index("--json") + 1] if "--json" in cmd else ""
    rc, out, seconds = run(cmd, timeout, env)
    try:
        figures = figures_of(out, json_path) if rc == 0 else {}
    except (OSError, ValueError, KeyError) as e:
        rc, out = 1, out + f"\ncannot read the figures: {e}"
    if rc == 0 and figures.get("verified", True):
        return part(name, cuda, "passed", command=shown, seconds=seconds, figures=figures)
    return part(name, cuda, "failed", command=shown, seconds=seconds, exit_status=rc,
                output_tail=tail(out))


def torch_part(bundle: str, env: dict, gpu: bool) -> dict:
    """strata.torch's pytest suite on the GPU, under this machine's torch."""
    name = "strata.torch tests on the CUDA device (python/tests/torch)"
    if not gpu:
        return part(name, True, "skipped", reason=NO_GPU)
    py = os.path.join(bundle, "python")
    env = dict(env, STRATA_LIBRARY=os.path.join(bundle, "lib", "libstrata.so"),
               STRATA_TEST_DEVICE="cuda", PYTHONPATH=os.pathsep.join(
                   [os.path.join(py), os.path.join(py, "examples"), os.path.join(bundle, "pylib")]))
    rc, out, _ = run([sys.executable, "-c", "import torch; print(torch.__version__, "
                      "torch.cuda.is_available())"], 120, env)
    version = out.split()[0] if rc == 0 and out.split() else ""
    if rc != 0 or tuple(int(x) for x in re.findall(r"\d+", version)[:2]) < (2, 1):
        return part(name, True, "failed", problems=["python3 here has no torch >= 2.1"],
                    output_tail=tail(out))
    rc, out, seconds = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            os.path.join(py, "tests", "torch")], 300, env)
    figures = {"torch": version, "summary": tail(out, 1).strip()}
    status = "passed" if rc == 0 else "failed"
    return part(name, True, status, seconds=seconds, figures=figures,
                **({} if rc == 0 else {"exit_status": rc, "output_tail": tail(out)}))


# --- The report --------------------------------------------------------------

def say(p: dict) -> None:
    status = p["status"].upper()
    detail = p.get("reason") or "; ".join(p.get("problems", [])[:3]) or \
        (f"exit {p['exit_status']}" if "exit_status" in p else "")
    if "cases" in p.get("figures", {}):
        f = p["figures"]
        detail = f"{f['passed']} passed, {f['skipped']} skipped, {f['failed']} failed of " \
                 f"{f['cases']}" + (f"; {detail}" if detail else "")
    seconds = f" ({p['seconds']} s)" if "seconds" in p else ""
    print(f"gpu-check: [{status:^7}] {p['name']}{seconds}" + (f": {detail}" if detail else ""),
          flush=True)
    if p["status"] == "failed" and p.get("output_tail"):
        print("  " + p["output_tail"].replace("\n", "\n  "))


class Report:
    """The JSON report, rewritten after every part, so that a check cut
    off by its caller still leaves what it found."""

    def __init__(self, path: str, manifest: dict, machine_info: dict):
        self.path, self.start = path, time.monotonic()
        self.doc = {"result": "running", "gpu": None, "why_no_gpu": "", "seconds": 0,
                    "bundle": manifest, "machine": machine_info, "parts": []}

    def add(self, p: dict) -> None:
        self.doc["parts"].append(p)
        say(p)
        self.write()

    def write(self) -> None:
        self.doc["seconds"] = round(time.monotonic() - self.start, 1)
        with open(self.path, "w") as f:
            json.dump(self.doc, f, indent=2)

    def finish(self, gpu: bool, why: str) -> int:
        failed = [p["name"] for p in self.doc["parts"] if p["status"] == "failed"]
        result = "failed" if failed else "passed" if gpu else "skipped"
        self.doc.update(result=result, gpu=gpu, why_no_gpu="" if gpu else why)
        self.write()
        summary = {"failed": f"FAILED: {', '.join(failed)}",
                   "skipped": "the CUDA parts SKIPPED (no GPU); the rest passed",
                   "passed": "every part passed on the GPU"}[result]
        print(f"gpu-check: {summary} ({self.doc['seconds']} s); report: {self.path}")
        return {"failed": 1, "skipped": SKIP, "passed": 0}[result]


def refusal(manifest: dict, source: str | None) -> str | None:
    """Why the bundle must not run here, if it must not."""
    problem = glibc_problem(manifest)
    if problem is None and source and manifest.get("source_digest") != source_digest(source):
        problem = (f"the bundle was made from other sources than {source}'s (commit "
                   f"{manifest.get('commit', '?')[:12]}): run scripts/gpu-bundle.sh again")
    return problem


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", help="the bundle's directory")
    ap.add_argument("--source", help="the source tree the bundle must have been made from")
    ap.add_argument("--report", help="the JSON report (default: gpu-check.json in $OUT, or here)")
    ap.add_argument("--digest", metavar="DIR", help="print DIR's source digest and exit")
    args = ap.parse_args()
    if args.digest:
        print(source_digest(args.digest))
        return 0
    bundle = os.path.abspath(args.bundle)
    manifest = load_json(os.path.join(bundle, "MANIFEST.json"))
    problem = refusal(manifest, args.source)
    if problem:
        print(f"gpu-check: {problem}", file=sys.stderr)
        return 2
    DEADLINE[0] = time.monotonic() + BUDGET_S
    work = tempfile.mkdtemp(prefix="strata-gpu-check-")
    # LD_LIBRARY_PATH stays: the driver's libcuda may be found only through
    # it; the bundle's own libraries come first through their DT_RPATH.
    env = dict(os.environ, STRATA_TEST_TMPDIR=os.path.join(work, "scratch"))
    os.makedirs(os.path.join(work, "swap"))
    info = machine()
    report = Report(args.report or os.path.join(os.environ.get("OUT") or os.getcwd(),
                                                "gpu-check.json"), manifest, info)
    report.add(probe_gpu(bundle, env, manifest, info["gpu"]))
    gpu = report.doc["parts"][0]["status"] != "skipped"
    why = report.doc["parts"][0].get("reason", "")
    if not gpu:
        print(f"gpu-check: {why}: the CUDA parts are SKIPPED", flush=True)
    for p in test_parts(*test_cases(bundle, work, env), gpu) + [capi_part(bundle, env, gpu)]:
        report.add(p)
    for spec in command_parts(bundle, work):
        report.add(run_command_part(spec, work, env, gpu))
    report.add(torch_part(bundle, env, gpu))
    shutil.rmtree(work, ignore_errors=True)
    return report.finish(gpu, why)


if __name__ == "__main__":
    sys.exit(main())
