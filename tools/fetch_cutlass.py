#!/usr/bin/env python3
"""Fetches the pinned CUTLASS/CuTe headers (the `nvidia-cutlass` wheel from PyPI) into .deps/.

The wheel carries the C++ headers under cutlass_library/source/include; only that folder is
kept. The build calls this when neither CUTLASS_DIR nor .deps/cutlass-<version> exists.
"""
import pathlib
import subprocess
import sys
import tempfile
import zipfile

VERSION = "4.2.0"  # the one pin; cmake/cutlass.cmake reads it from here


def main() -> int:
    root = pathlib.Path(__file__).resolve().parent.parent
    dest = root / ".deps" / f"cutlass-{VERSION}"
    if (dest / "include" / "cute" / "tensor.hpp").exists():
        print(dest / "include")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                        "--only-binary=:all:", "-d", tmp, f"nvidia-cutlass=={VERSION}"],
                       check=True)
        wheel = next(pathlib.Path(tmp).glob("nvidia_cutlass-*.whl"))
        prefix = "cutlass_library/source/include/"
        with zipfile.ZipFile(wheel) as zf:
            for name in zf.namelist():
                if name.startswith(prefix) and not name.endswith("/"):
                    out = dest / "include" / name[len(prefix):]
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_bytes(zf.read(name))
    print(dest / "include")
    return 0


if __name__ == "__main__":
    sys.exit(main())
