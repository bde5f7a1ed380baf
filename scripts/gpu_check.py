#!/usr/bin/env python3
"""The GPU check: everything strata runs on a CUDA GPU, in one command, over
the bundle that scripts/gpu-bundle.sh made (no build and no package on the
GPU machine; Python's standard library only). scripts/gpu-check.sh runs it.

Parts, each passed, failed or skipped, with its figures and seconds:
- the CUDA test cases of the bundled test programs (a case whose name says
  Cuda, cuda or Gpu, but not WithoutCuda): none may skip on a GPU machine;
  and every other case of those programs;
- pcie_bench: strata's host<->device copies against cudaMemcpy of the same
  bytes on the same pinned buffers, after a byte round trip;
- store_bench on the CUDA device, every byte verified, and the same run on
  the host-emulated device beside it;
- strata-sim on the CUDA device with a model whose compute copy is twice
  the device budget (overlap and after_backward against a resident run),
  and a small strata-sim on the host-emulated device.
Without a GPU the CUDA parts are reported as skipped, with the reason, and
the rest still runs.

Writes one JSON report (--report; default $OUT/gpu-check.json when OUT is
set, else ./gpu-check.json): the bundle's manifest, the machine (CPU, GPU,
driver and CUDA versions) and every part. Exit status: 0 when everything
passed on a GPU; 77 when there is no GPU (CUDA parts skipped, the rest
passed); 1 when a part failed; 2 when the bundle cannot run here.
"""

from __future__ import annotations

import argparse
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


def run(cmd: list[str], timeout: float, env: dict | None = None) -> tuple[int, str, float]:
    """Runs cmd; returns its exit status, its output and its seconds."""
    start = time.monotonic()
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


# --- The machine ----------------------------------------------------------

def glibc_problem(manifest: dict) -> str | None:
    """Why this machine's C library cannot run the bundle, if it cannot."""
    need = manifest.get("glibc_needed", "0")
    have = (os.confstr("CS_GNU_LIBC_VERSION") or "glibc 0").split()[-1]
    if tuple(map(int, have.split("."))) < tuple(map(int, need.split("."))):
        return (f"the bundle needs glibc {need} and this machine has {have}: build the "
                f"bundle on a system with glibc {have} or older")
    return None


def machine() -> dict:
    info = {"nproc": os.cpu_count(), "kernel": platform.release(),
            "glibc": os.confstr("CS_GNU_LIBC_VERSION")}
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next((line.split(":", 1)[1].strip() for line in f
                                if line.startswith("model name")), "?")
    except OSError:
        info["cpu"] = "?"
    if shutil.which("nvidia-smi"):
        rc, out, _ = run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,"
                          "pcie.link.gen.max,pcie.link.width.max", "--format=csv,noheader"], 30)
        if rc == 0 and out.strip():
            keys = ["name", "driver", "memory", "pcie_gen", "pcie_width"]
            info["gpu"] = dict(zip(keys, (v.strip() for v in out.splitlines()[0].split(","))))
    return info


def probe_gpu(bundle: str, env: dict) -> dict:
    """A part that says whether a CUDA GPU runs the bundle's CUDA code:
    passed (a GPU), skipped (none, with the reason) or failed."""
    name = "GPU probe (pcie_bench, 1 MiB)"
    pcie = os.path.join(bundle, "bin", "pcie_bench")
    if not os.path.exists(pcie):
        return part(name, True, "skipped",
                    reason="the bundle was built without CUDA (no nvcc at configure)")
    rc, out, seconds = run([pcie, "--sizes", "1M", "--repeat", "1"], 120, env)
    if rc == SKIP:
        return part(name, True, "skipped", seconds=seconds,
                    reason="no GPU here: " + tail(out, 1).replace("pcie_bench: skipped: ", ""))
    if rc != 0:
        return part(name, True, "failed", seconds=seconds, exit_status=rc, output_tail=tail(out))
    return part(name, True, "passed", seconds=seconds)


# --- The parts ------------------------------------------------------------

def is_cuda_case(name: str) -> bool:
    return re.search(r"Cuda|cuda|Gpu", name) is not None and "WithoutCuda" not in name


def test_cases(bundle: str, work: str, env: dict) -> tuple[list[dict], list[str]]:
    """Every case of the test programs: name, result, skip message; and the
    programs that did not finish."""
    cases, broken = [], []
    for program in TEST_PROGRAMS:
        xml = os.path.join(work, program + ".xml")
        rc, out, _ = run([os.path.join(bundle, "bin", program), f"--gtest_output=xml:{xml}"],
                         180, env)
        if not os.path.exists(xml):
            broken.append(f"{program} (exit {rc}): {tail(out, 10)}")
            continue
        for case in ET.parse(xml).getroot().iter("testcase"):
            failure, skipped = case.find("failure"), case.find("skipped")
            node = failure if failure is not None else skipped
            cases.append({
                "name": f"{program}: {case.get('classname')}.{case.get('name')}",
                "result": "failed" if failure is not None else
                          "skipped" if skipped is not None else "passed",
                "message": node.get("message", "") if node is not None else ""})
    return cases, broken


def test_parts(cases: list[dict], broken: list[str], gpu: bool) -> list[dict]:
    parts = []
    for cuda in (True, False):
        mine = [c for c in cases if is_cuda_case(c["name"]) == cuda]
        failed = [c for c in mine if c["result"] == "failed"]
        skipped = [c for c in mine if c["result"] == "skipped"]
        figures = {"cases": len(mine), "failed": len(failed), "skipped": len(skipped),
                   "passed": len(mine) - len(failed) - len(skipped)}
        name = "CUDA test cases" if cuda else "other test cases of those programs"
        problems = [f"{c['name']}: {c['message'][:300]}" for c in failed] + broken
        if cuda and gpu:
            problems += [f"{c['name']} skipped on a GPU machine: {c['message']}" for c in skipped]
        if problems:
            parts.append(part(name, cuda, "failed", figures=figures, problems=problems))
        elif cuda and not gpu:
            parts.append(part(name, cuda, "skipped", figures=figures, reason=NO_GPU,
                              skipped_cases=[c["name"] for c in skipped]))
        else:
            parts.append(part(name, cuda, "passed", figures=figures,
                              skipped_cases=[f"{c['name']}: {c['message']}" for c in skipped]))
    return parts


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


def load_json(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


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


# --- The report -----------------------------------------------------------

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


def default_report() -> str:
    return os.path.join(os.environ["OUT"] if os.environ.get("OUT") else os.getcwd(),
                        "gpu-check.json")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", required=True, help="the bundle's directory")
    ap.add_argument("--report", default=default_report(), help="the JSON report to write")
    args = ap.parse_args()
    bundle = os.path.abspath(args.bundle)
    manifest = load_json(os.path.join(bundle, "MANIFEST.json"))
    problem = glibc_problem(manifest)
    if problem:
        print(f"gpu-check: {problem}", file=sys.stderr)
        return 2
    work = tempfile.mkdtemp(prefix="strata-gpu-check-")
    env = dict(os.environ, STRATA_TEST_TMPDIR=os.path.join(work, "scratch"))
    os.makedirs(os.path.join(work, "swap"))
    start = time.monotonic()
    parts = [probe_gpu(bundle, env)]
    say(parts[0])
    gpu, why = parts[0]["status"] != "skipped", parts[0].get("reason", "")
    if not gpu:
        print(f"gpu-check: {why}: the CUDA parts are SKIPPED", flush=True)
    parts += test_parts(*test_cases(bundle, work, env), gpu)
    for p in parts[1:]:
        say(p)
    for spec in command_parts(bundle, work):
        parts.append(run_command_part(spec, work, env, gpu))
        say(parts[-1])
    shutil.rmtree(work, ignore_errors=True)
    failed = [p["name"] for p in parts if p["status"] == "failed"]
    result = "failed" if failed else "passed" if gpu else "skipped"
    report = {"result": result, "gpu": gpu, "why_no_gpu": why if not gpu else "",
              "seconds": round(time.monotonic() - start, 1), "bundle": manifest,
              "machine": machine(), "parts": parts}
    with open(args.report, "w") as f:
        json.dump(report, f, indent=2)
    summary = {"failed": f"FAILED: {', '.join(failed)}",
               "skipped": "the CUDA parts SKIPPED (no GPU); the rest passed",
               "passed": "every part passed on the GPU"}[result]
    print(f"gpu-check: {summary} ({report['seconds']} s); report: {args.report}")
    return {"failed": 1, "skipped": SKIP, "passed": 0}[result]


if __name__ == "__main__":
    sys.exit(main())
