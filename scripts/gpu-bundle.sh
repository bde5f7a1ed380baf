#!/usr/bin/env bash
# Prepares the GPU check's bundle (docs/gpu-check.md): the CUDA build's
# test programs, store_bench, strata-sim and pcie_bench, with every shared
# library they load beyond glibc (libstdc++, TBB, liburing, the CUDA
# runtime, ...), run paths set to $ORIGIN (DT_RPATH, so that a machine's
# LD_LIBRARY_PATH cannot put other copies first), debug info stripped, plus
# gpu-check.sh, gpu_check.py and MANIFEST.json (commit, source digest, CUDA
# runtime, the glibc it needs). It runs on a machine that has none of our
# packages and no package registry.
#
#   scripts/gpu-bundle.sh [--build DIR] [--out DIR] [--no-build]
#
# Defaults: --build build (the default preset, configured and built first
# unless --no-build), --out gpu-bundle (git-ignored; the device tool carries
# it with carry: ["gpu-bundle"]). --out must not exist or be an earlier
# bundle: it is replaced.
#
# Why a bundle built here rather than our Debian packages' files unpacked
# for a build there: a GPU machine starts bare on every lease and its time
# is scarce (30 minutes a session), so a build there would spend minutes of
# it on every fresh machine, against seconds to start a bundle; nvcc is
# here, so the CUDA code is compiled and linked once, by the same compiler
# and flags as CI's. The cost: the GPU machine's glibc must be at least the
# one the bundle needs and its driver must run the bundle's CUDA runtime
# (gpu_check.py checks both first and says what to do).
#
# Fails (exit 1) when a library would come from outside the bundle or the
# bundle passes 64 MiB; exits 77 when the build has no CUDA.
set -euo pipefail
build=build out=gpu-bundle do_build=1
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --no-build) do_build=0; shift ;;
    *) echo "usage: scripts/gpu-bundle.sh [--build DIR] [--out DIR] [--no-build]" >&2; exit 2 ;;
  esac
done
build=$(realpath -m "$build") out=$(realpath -m "$out")
cd "$(dirname "$0")/.."
programs=(device_test pinned_pool_test sim_busy_test capi_lifecycle_test store_bench
  strata-sim pcie_bench)
limit=$((64 << 20))
glibc_libs='linux-vdso\.so|ld-linux-x86-64\.so|libc\.so|libm\.so|libmvec\.so|libpthread\.so|libdl\.so|librt\.so|libresolv\.so|libutil\.so|libanl\.so|libnss_|libthread_db\.so|libBrokenLocale\.so'

if [ "$do_build" = 1 ]; then
  source scripts/setup.sh
  strata_install_deps
  strata_torch_venv
  if [ ! -f "$build/CMakeCache.txt" ]; then
    if [ "$build" != "$PWD/build" ]; then
      echo "gpu-bundle: $build is not configured: configure it first, or use --build build" >&2
      exit 2
    fi
    cmake --preset default >/dev/null
  fi
  cmake --build "$build" -j"$(nproc)" --target "${programs[@]}" strata >/dev/null
fi
if [ ! -x "$build/bin/pcie_bench" ]; then
  echo "gpu-bundle: $build has no CUDA (no bin/pcie_bench): nvcc was not found when it" \
    "was configured; install the CUDA toolkit (/usr/local/cuda) and configure again" >&2
  exit 77
fi
if [ -e "$out" ] && [ ! -f "$out/MANIFEST.json" ]; then
  echo "gpu-bundle: $out exists and is not a bundle: name another --out" >&2
  exit 2
fi

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
for p in "${programs[@]}"; do cp "$build/bin/$p" "$out/bin/"; done
# Every library the programs load, found as they find it now, under its
# soname; glibc's own stay with the machine.
for f in "${programs[@]/#/$build/bin/}" "$build/lib/libstrata.so"; do
  ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r soname path; do
  [[ "$soname" =~ ^($glibc_libs) ]] || cp -L "$path" "$out/lib/$soname"
done
cp -L "$build/lib/libstrata.so" "$out/lib/libstrata.so"  # for strata.torch's tests
strip --strip-debug "$out"/bin/* "$out"/lib/*
for f in "$out"/bin/*; do patchelf --force-rpath --set-rpath '$ORIGIN/../lib' "$f"; done
for f in "$out"/lib/*; do patchelf --force-rpath --set-rpath '$ORIGIN' "$f"; done
cp scripts/gpu-check.sh scripts/gpu_check.py "$out/"
# strata.torch's tests on the GPU: libstrata, the Python package, its
# tests and the GPT they train, and pytest (pure Python) from the torch
# environment, since the GPU machine has no package registry.
mkdir -p "$out/python" "$out/pylib"
cp -r python/strata python/tests examples "$out/python/"
site=$("${STRATA_TORCH_VENV:-/var/cache/strata/torch-venv}/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
for m in pytest _pytest pluggy iniconfig packaging pygments py.py; do cp -r "$site/$m" "$out/pylib/"; done
find "$out/python" "$out/pylib" -name __pycache__ -type d -print0 | xargs -0 rm -rf

# Proof that it stands alone: with no LD_LIBRARY_PATH, every library
# resolves inside the bundle or is glibc's.
bad=$(for f in "$out"/bin/* "$out"/lib/*; do
  env -u LD_LIBRARY_PATH ldd "$f" | awk -v f="${f#"$out"/}" '$2 == "=>" {print f": "$1" => "$3}'
done | grep -v -E "=> $out/" | grep -v -E ": ($glibc_libs)" || true)
if [ -n "$bad" ]; then
  echo "gpu-bundle: libraries from outside the bundle:" >&2
  echo "$bad" >&2
  exit 1
fi

glibc_needed=$(objdump -T "$out"/bin/* "$out"/lib/* | grep -o 'GLIBC_[0-9.]*' |
  sed 's/GLIBC_//' | sort -V | tail -1)
nvcc=$(grep -m1 '^STRATA_NVCC:' "$build/CMakeCache.txt" | cut -d= -f2)
cuda_runtime=$("$nvcc" --version | grep -o 'release [0-9.]*' | cut -d' ' -f2)
digest=$(python3 scripts/gpu_check.py --digest .)
python3 - "$out" "$glibc_needed" "$cuda_runtime" "$digest" <<'PY'
import json, os, shutil, subprocess, sys, time
out, glibc_needed, cuda_runtime, digest = sys.argv[1:]
def git(*args):
    if not shutil.which("git"):
        return ""
    return subprocess.run(["git", *args], capture_output=True, text=True).stdout.strip()
files = {os.path.relpath(os.path.join(d, f), out): os.path.getsize(os.path.join(d, f))
         for d, _, fs in os.walk(out) for f in fs}
manifest = {"commit": git("rev-parse", "HEAD") or "unknown (no git)",
            "dirty": bool(git("status", "--porcelain")), "source_digest": digest,
            "made": time.strftime("%Y-%m-%d %H:%M:%S %z"), "cuda_runtime": cuda_runtime,
            "glibc_built_on": os.confstr("CS_GNU_LIBC_VERSION"), "glibc_needed": glibc_needed,
            "bytes": sum(files.values()), "files": files}
with open(os.path.join(out, "MANIFEST.json"), "w") as f:
    json.dump(manifest, f, indent=2)
PY
bytes=$(du -sb "$out" | cut -f1)
echo "gpu-bundle: $out: $(ls "$out"/bin | wc -l) programs, $(ls "$out"/lib | wc -l) libraries," \
  "$((bytes >> 20)) MiB of the 64 MiB a device run carries; needs glibc >= $glibc_needed and" \
  "a driver that runs CUDA $cuda_runtime"
if [ "$bytes" -gt "$limit" ]; then
  echo "gpu-bundle: $out is over 64 MiB: the device tool would refuse it" >&2
  exit 1
fi
