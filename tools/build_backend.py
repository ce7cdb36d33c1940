"""The PEP 517 build backend of `pip install .`: scikit-build-core, plus the pinned CUTLASS
headers when the build will compile the CUDA kernels.

pip builds in an isolated environment, where `tools/fetch_cutlass.py` cannot run pip. So the
pinned `nvidia-cutlass` wheel (it carries the CUTLASS/CuTe headers under
cutlass_library/source/include) is a build requirement instead, added only when CUDA is wanted
(OPENMLA_CUDA, from the environment or -Ccmake.define.OPENMLA_CUDA=..., is not OFF), a CUDA
compiler is there, and the headers are not already at hand (CUTLASS_DIR or .deps/);
cmake/cutlass.cmake then finds them in the build environment. The pin is VERSION in
tools/fetch_cutlass.py, the one source of truth.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import sys

from scikit_build_core import build as _backend
from scikit_build_core.build import *  # noqa: F401,F403  (every PEP 517 hook)

_ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(_ROOT / "tools"))
from fetch_cutlass import VERSION as CUTLASS_VERSION  # noqa: E402

sys.path.pop(0)


def _cuda_setting(config_settings) -> str:
    value = None
    for key, setting in (config_settings or {}).items():
        if key in ("cmake.define.OPENMLA_CUDA", "skbuild.cmake.define.OPENMLA_CUDA"):
            value = setting
    if value is None:
        value = os.environ.get("OPENMLA_CUDA", "AUTO")
    return str(value).upper()


def _has_nvcc() -> bool:
    cudacxx = os.environ.get("CUDACXX")
    if cudacxx:
        return os.path.exists(cudacxx) or shutil.which(cudacxx) is not None
    return shutil.which("nvcc") is not None or os.path.exists("/usr/local/cuda/bin/nvcc")


def _headers_at_hand() -> bool:
    cutlass_dir = os.environ.get("CUTLASS_DIR")
    if cutlass_dir and (pathlib.Path(cutlass_dir) / "include/cute/tensor.hpp").exists():
        return True
    return (_ROOT / f".deps/cutlass-{CUTLASS_VERSION}/include/cute/tensor.hpp").exists()


def cutlass_requirements(config_settings=None) -> list:
    setting = _cuda_setting(config_settings)
    if setting in ("OFF", "0", "FALSE", "NO") or _headers_at_hand():
        return []
    if setting == "AUTO" and not _has_nvcc():
        return []
    return [f"nvidia-cutlass=={CUTLASS_VERSION}"]


def get_requires_for_build_wheel(config_settings=None):
    return _backend.get_requires_for_build_wheel(config_settings) + \
        cutlass_requirements(config_settings)


def get_requires_for_build_editable(config_settings=None):
    return _backend.get_requires_for_build_editable(config_settings) + \
        cutlass_requirements(config_settings)
