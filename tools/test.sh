#!/usr/bin/env bash
# Runs every test that can run on this machine: the C++ CPU tier (ctest, then again under ASan +
# UBSan), the C++ examples built against the installed library, the fuzz targets (tools/fuzz.sh),
# the models of the sparse kernel's seesaw and ring synchronisation and of the FP8 prefill's V^T
# (tests/models/) and the Python package's tests (pytest, CPU backend). On a machine with nvcc the CUDA kernels are
# compiled once, by the Python package's build (`pip install .`), and a register spill or a
# serialised wgmma pipeline in any kernel fails here; the host checks of the kernels' tile layouts
# (tests/cuda_host) are compiled and run too. The C++ tier itself is built without CUDA: no kernel
# runs on a machine without a GPU. GPU tests run on a Hopper GPU via tools/device_check.sh.
# OPENMLA_SKIP_SANITIZE=1, OPENMLA_SKIP_FUZZ=1 and OPENMLA_SKIP_PYTHON=1 leave those steps out.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
build=${OPENMLA_BUILD_DIR:-build}

echo "== C++: configure and build, CPU backend ($build, $jobs jobs)"
mkdir -p "$build"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DOPENMLA_CUDA=OFF >"$build/configure.log" 2>&1 ||
  { cat "$build/configure.log"; exit 1; }
grep -E "OpenMLA CUDA backend" "$build/configure.log" || true
cmake --build "$build" -j "$jobs" >"$build/build.log" 2>&1 ||
  { tail -n 60 "$build/build.log"; exit 1; }

echo "== C++: tests"
OMP_NUM_THREADS=${OMP_NUM_THREADS:-$jobs} ctest --test-dir "$build" --output-on-failure

if [ "${OPENMLA_SKIP_SANITIZE:-0}" != 1 ]; then
  # The CPU tier again, built with ASan + UBSan (host code only: no CUDA, no benchmarks), at -O1
  # with line tables only (-g1): 2.4x faster to build on 2 cores than -O2 -g, the tests 15% slower.
  echo "== C++: the CPU tests under ASan + UBSan ($build-asan)"
  {
    cmake -S . -B "$build-asan" -DOPENMLA_CUDA=OFF -DOPENMLA_BUILD_BENCH=OFF \
      -DOPENMLA_INSTALL=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
      "-DCMAKE_CXX_FLAGS=-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer" &&
      cmake --build "$build-asan" -j "$jobs" --target openmla_cpu_tests
  } >"$build/asan_build.log" 2>&1 || { tail -n 40 "$build/asan_build.log"; exit 1; }
  OMP_NUM_THREADS=$jobs "$build-asan/tests/openmla_cpu_tests" --gtest_brief=1
fi

echo "== C++: install, then build and run the C++ examples against it (examples/cpp)"
prefix="$(cd "$build" && pwd)/install"
rm -rf "$prefix" "$build/examples-cpp"
{
  cmake --install "$build" --prefix "$prefix" &&
    cmake -S examples/cpp -B "$build/examples-cpp" -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_BUILD_TYPE=Release &&
    cmake --build "$build/examples-cpp" -j "$jobs"
} >"$build/examples-cpp.log" 2>&1 || { cat "$build/examples-cpp.log"; exit 1; }
"$build/examples-cpp/openmla_dense_decode_check"
"$build/examples-cpp/openmla_decode_step" --device cpu --layers 2 --batch 4 --seqlen 512 --steps 2

if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
  # The CuTe tile layouts the kernels rely on, checked on the host: one CUDA translation unit
  # (no kernel of the library), so only that target of a CUDA-configured tree is built.
  echo "== CUDA: the kernels' tile layouts on the host (tests/cuda_host, $build-cuda-host)"
  {
    cmake -S . -B "$build-cuda-host" -DCMAKE_BUILD_TYPE=Release -DOPENMLA_CUDA=ON \
      -DOPENMLA_BUILD_BENCH=OFF -DOPENMLA_INSTALL=OFF &&
      cmake --build "$build-cuda-host" -j "$jobs" --target openmla_tile_layout_tests
  } >"$build/cuda_host.log" 2>&1 || { tail -n 60 "$build/cuda_host.log"; exit 1; }
  "$build-cuda-host/tests/openmla_tile_layout_tests" --gtest_brief=1
fi

if [ "${OPENMLA_SKIP_FUZZ:-0}" != 1 ]; then
  echo "== C++: fuzz the validators and the CPU backend (tools/fuzz.sh, ASan + UBSan)"
  bash tools/fuzz.sh
fi

# The seesaw orders' and the ring fill's synchronisation (sparse_decode/kernel.cuh) as models under
# random interleavings: no deadlock, no buffer race; and each deliberate bug of a self-test is found.
echo "== the seesaw synchronisation model (tests/models/seesaw_sync_model.py)"
python3 tests/models/seesaw_sync_model.py --schedules 300 | tail -n 1
python3 tests/models/seesaw_sync_model.py --self-test --schedules 300
echo "== the ring fill's synchronisation model (tests/models/ring_sync_model.py)"
python3 tests/models/ring_sync_model.py --schedules 300 | tail -n 1
python3 tests/models/ring_sync_model.py --self-test --schedules 300
echo "== the dense MHA prefill forward's synchronisation model (tests/models/mha_fwd_sync_model.py)"
python3 tests/models/mha_fwd_sync_model.py --schedules 300 | tail -n 1
python3 tests/models/mha_fwd_sync_model.py --self-test --schedules 300
echo "== the dense MHA prefill forward's index and softmax math (tests/models/mha_fwd_math_model.py)"
python3 tests/models/mha_fwd_math_model.py
python3 tests/models/mha_fwd_math_model.py --self-test
# (the slots in a CTA pair)
# The FP8 prefill kernel's V^T build and P's fragment order, byte by byte (fp8_kernel.cuh).
echo "== the FP8 prefill's V^T transpose model (tests/models/fp8_vt_model.py)"
python3 tests/models/fp8_vt_model.py
python3 tests/models/fp8_vt_model.py --self-test

if [ -f pyproject.toml ] && [ "${OPENMLA_SKIP_PYTHON:-0}" != 1 ]; then
  echo "== Python: install the package into a fresh venv and run pytest"
  venv="$build/venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  # The README's install command, verbose so that ptxas's report of every kernel reaches the
  # log: with nvcc this is where the CUDA kernels are compiled (once a run), with the library's
  # ptxas flags (-warn-spills -Werror: a spill fails the build; cmake/cuda_kernels.cmake).
  # build-py/ keeps the build for the next run.
  start=$SECONDS
  log="$build/pip_install.log"
  "$venv/bin/pip" install -v . >"$log" 2>&1 || {
    grep -E "ptxas (error|fatal)|error:|FAILED:" "$log" | head -n 40
    tail -n 30 "$log"
    echo "pip install . failed (log: $log)"
    exit 1
  }
  echo "pip install . took $((SECONDS - start)) s (log: $log)"
  if grep -q "OpenMLA CUDA backend: ON" "$log"; then
    kernels=$(grep -cE "ptxas info +: Used [0-9]+ registers" "$log" || true)
    if [ "$kernels" -eq 0 ]; then
      echo "the CUDA backend was built but $log holds no ptxas report: the spill check saw nothing"
      exit 1
    fi
    # ptxas -warn-spills -Werror fails the build on a spill; this catches one should the flags go.
    if grep "bytes spill" "$log" | grep -qv " 0 bytes spill stores, 0 bytes spill loads"; then
      grep -B3 -E "[1-9][0-9]* bytes spill" "$log"
      echo "a kernel spills registers (above)"
      exit 1
    fi
    # ptxas serializing a kernel's wgmmas (C7510/C7513: a register of an in-flight wgmma touched
    # in its pipeline stage; C7517: a wait injected) slowed dense decode 1.7x once without any
    # error.
    if grep -E "Potential Performance Loss: wgmma|\(C7517\)" "$log"; then
      echo "ptxas serialized wgmma instructions (above): a kernel change broke its wgmma pipeline"
      exit 1
    fi
    echo "ptxas: $kernels kernel functions compiled, no spill, no serialised wgmma"
  fi
  # torch (CPU use) and transformers for the transformers integration tests. PyPI's torch for
  # x86-64 Linux is its CUDA build: with its requirements ~6 GB, and a CI run once ran out of disk
  # here with pip's cache beside it. So: no cache, pip's temporary files on the build's disk,
  # torch's requirements one at a time (the peak is one wheel, not all of them) and without
  # triton, its GPU compiler, which nothing here loads (1 GB); the torch wheel itself last.
  tmp="$(cd "$build" && pwd)/pip-tmp"
  rm -rf "$tmp" && mkdir -p "$tmp"
  df -h "$build" | tail -n 1 | awk '{print "free disk before the test requirements: " $4}'
  pip_install() { TMPDIR="$tmp" "$venv/bin/python" -m pip install -q --no-cache-dir "$@"; }
  pip_install pytest numpy ml_dtypes transformers==5.25.0
  TMPDIR="$tmp" "$venv/bin/python" -m pip download -q --no-cache-dir --no-deps -d "$tmp/wheel" \
    torch==2.15.0
  torch_wheel=$(ls "$tmp"/wheel/torch-*.whl)
  reqs=$("$venv/bin/python" tools/torch_requirements.py "$torch_wheel" --without triton)
  mapfile -t reqs <<<"$reqs"
  for req in "${reqs[@]}"; do
    if [[ -n "$req" ]]; then pip_install "$req"; fi
  done
  pip_install --no-deps "$torch_wheel"
  rm -rf "$tmp"
  "$venv/bin/python" -m pytest -q tests/python -m "not gpu"
fi
echo "== all tests passed ($((SECONDS / 60)) min $((SECONDS % 60)) s)"
