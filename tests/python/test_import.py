"""`import openmla` first, in a fresh interpreter, must leave the process as it found it.

On a GPU image `python3 -c "import openmla"` once died (SIGSEGV) in ml_dtypes' float4_e2m1fn
finfo, which formats a number through libstdc++, when the extension had been loaded first: the
extension exported its C++ symbols (with a statically linked libstdc++, GNU_UNIQUE ones bind
process-wide) and the next C++ extension used its copies. Now the extension exports only
PyInit__C, `import openmla` imports no optional package it does not need, and nothing changes
the floating-point environment. Each check runs in a fresh interpreter (a crash there is an exit
code here, not a dead test run). Also run by tools/device_check.sh on the GPU image.
"""

import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap

import pytest


def run_fresh(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ))


def assert_ok(proc: subprocess.CompletedProcess, what: str) -> None:
    assert proc.returncode == 0, (f"{what}: exit {proc.returncode}\nstdout:\n{proc.stdout}\n"
                                  f"stderr:\n{proc.stderr}")


def test_import_openmla_first():
    assert_ok(run_fresh("import openmla; print(openmla.__version__)"), "import openmla")


def test_import_imports_no_ml_dtypes():
    proc = run_fresh("""
        import sys, openmla
        assert "ml_dtypes" not in sys.modules, "import openmla imported ml_dtypes"
    """)
    assert_ok(proc, "import openmla (ml_dtypes stays unimported)")


@pytest.mark.skipif(importlib.util.find_spec("ml_dtypes") is None, reason="ml_dtypes not installed")
def test_ml_dtypes_after_openmla():
    """The crash's exact path: ml_dtypes' finfo tables (float4_e2m1fn formats with libstdc++)
    after the extension, then a bf16 numpy call through openmla."""
    proc = run_fresh("""
        import openmla
        import numpy as np, ml_dtypes
        for name in ("float4_e2m1fn", "float8_e4m3fn", "float8_e8m0fnu", "bfloat16"):
            if hasattr(ml_dtypes, name):
                str(ml_dtypes.finfo(getattr(ml_dtypes, name)))
        assert str(ml_dtypes.float4_e2m1fn(6.0)) == "6"
        x = np.random.randn(4, 512).astype(np.float32)
        data = openmla.quantize(x, "fp8_mx")
        back = openmla.dequantize(data, out_dtype="bf16")
        assert back.dtype == ml_dtypes.bfloat16 and back.shape == (4, 512)
    """)
    assert_ok(proc, "import openmla, then ml_dtypes")


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
def test_torch_after_openmla():
    assert_ok(run_fresh("import openmla, torch; torch.zeros(2).sum().item()"),
              "import openmla, then torch")


def test_floating_point_environment_unchanged():
    """No flush-to-zero / denormals-are-zero (crtfastmath.o of -ffast-math) after the import."""
    proc = run_fresh("""
        import numpy as np
        import openmla
        tiny = float.fromhex("0x1p-1022")
        half = tiny / 2
        assert half > 0.0, "float64 subnormals flushed to zero"
        f32 = np.array([np.finfo(np.float32).tiny], np.float32) / np.float32(4)
        assert f32[0] > 0, "float32 subnormals flushed to zero"
    """)
    assert_ok(proc, "floating-point environment")


@pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("nm") is None,
                    reason="needs Linux and nm")
def test_extension_exports_only_its_entry_point():
    """The root cause: the extension must not export C++ (libstdc++, nanobind, openmla) symbols
    that another extension in the process could bind to."""
    spec = importlib.util.find_spec("openmla._C")
    assert spec is not None and spec.origin
    proc = subprocess.run(["nm", "-D", "--defined-only", spec.origin], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    names = [line.split()[-1] for line in proc.stdout.splitlines() if line.strip()]
    assert names == ["PyInit__C"], (f"{spec.origin} exports {len(names)} symbols, e.g. "
                                    f"{names[:8]}; expected only PyInit__C")
