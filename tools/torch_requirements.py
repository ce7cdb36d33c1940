"""Prints a wheel's requirements that apply to this machine, one a line.

tools/test.sh downloads PyPI's torch wheel, installs these one at a time (pip's peak disk use is
then one wheel, not all of them) leaving out the names given by --without (triton: torch's GPU
compiler, which a CPU-only test run never loads), and installs the wheel itself last.
Uses pip's own copy of `packaging`, so the venv needs nothing beyond pip.
"""
import argparse
import email.parser
import zipfile

from pip._vendor.packaging.requirements import Requirement


def wheel_requirements(path: str) -> list[str]:
    with zipfile.ZipFile(path) as wheel:
        name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = email.parser.BytesParser().parsebytes(wheel.read(name))
    return metadata.get_all("Requires-Dist") or []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("wheel", help="path of a .whl file")
    parser.add_argument("--without", nargs="*", default=[], help="requirement names to leave out")
    args = parser.parse_args()
    without = {name.lower() for name in args.without}
    for text in wheel_requirements(args.wheel):
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # an extra's requirement, or another platform's
        if req.name.lower() in without:
            continue
        req.marker = None
        print(req)


if __name__ == "__main__":
    main()
