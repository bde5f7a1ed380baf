# Sourced by scripts/main.sh and scripts/test.sh: installs the Debian
# packages strata needs (apt-get update runs once, and only if something is
# missing), then configures and builds a CMake preset. CUDA is used when
# nvcc is found (STRATA_WITH_CUDA=AUTO); nothing here installs it.

# Everything the build, tests, benchmarks, tools and scripts use. The test
# install.DependenciesComeFromSetup (tests/install/deps_check.py) fails when
# they use a file of a package this list does not install: add what it
# names here and run this script; never install anything by hand.
STRATA_PACKAGES=(
  build-essential cmake pkg-config
  liburing-dev libnuma-dev libtbb-dev libxxhash-dev
  libcli11-dev nlohmann-json3-dev libfmt-dev libdlpack-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  fio            # strata-nvme-bench --vs-fio (scripts/main.sh) and its test
  python3        # the Python tests and bench scripts run /usr/bin/python3
  python3-numpy  # the C ABI's DLPack round trip test (tests/capi)
  python3-pytest # the Python package's tests (python/tests, run by CTest)
  python3-torch  # torch parity test and bench/cpu_adam_vs_torch.py (comparison only)
  patchelf       # scripts/gpu-bundle.sh: $ORIGIN run paths in the GPU bundle
  git            # python/tests/test_binding.py: py.typed is not git-ignored
  libaio-dev python3-venv python3-dev  # bench/ds_aio_compare.py: DeepSpeed's venv and aio op
)

strata_install_deps() {
  local missing=() pkg
  for pkg in "${STRATA_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' ||
      missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  echo "strata: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

strata_build() {
  cmake --preset "$1" >/dev/null
  cmake --build --preset "$1" -j"$(nproc)"
}

# The Python environment of the PyTorch adapter's tests, main job and
# benchmark: torch 2.x and friends from the Python package index, in a
# virtual environment outside the clone (once per machine, so a fresh clone
# does not download torch again). Debian's torch 1.13 stays for the tests
# that use it today. STRATA_TORCH_VENV moves it.
export STRATA_TORCH_VENV="${STRATA_TORCH_VENV:-/var/cache/strata/torch-venv}"
STRATA_TORCH_PIP=(
  torch==2.11.0 numpy pytest tqdm matplotlib psutil
  transformers   # GPT-2 and Llama from a config in the adapter's tests
  safetensors    # strata.torch's save_16bit_model to *.safetensors
  ml_dtypes      # bf16 arrays of strata.View.numpy (python/tests/test_exports.py)
  scikit-build-core  # pip install . (pyproject.toml)
)
strata_torch_venv() {
  local stamp
  stamp="$STRATA_TORCH_VENV/.strata-$(echo "${STRATA_TORCH_PIP[*]}" | md5sum | cut -c1-12)"
  [ -f "$stamp" ] && return 0
  echo "strata: creating $STRATA_TORCH_VENV (torch from the package index; once per machine)"
  local start=$SECONDS
  /usr/bin/python3 -m venv "$STRATA_TORCH_VENV"
  "$STRATA_TORCH_VENV/bin/python" -m pip install -q "${STRATA_TORCH_PIP[@]}"
  rm -f "$STRATA_TORCH_VENV"/.strata-*
  touch "$stamp"
  echo "strata: $STRATA_TORCH_VENV ready in $((SECONDS - start)) s"
}
