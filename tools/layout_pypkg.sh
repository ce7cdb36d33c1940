#!/usr/bin/env bash
# Lays out the Python package as pip would, from a build tree's extension, into <build dir>/pypkg
# (the Python modules plus _C*.so), for device runs that import it with PYTHONPATH=<that dir>.
# Used by tools/device_check.sh and by the GPU scripts in research/. Exits 1 when the extension
# is not built.
#   tools/layout_pypkg.sh <build dir>
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:?build dir}"
shopt -s nullglob
ext=("$build"/python/_C*.so)
shopt -u nullglob
[[ ${#ext[@]} -gt 0 ]] || { echo "no $build/python/_C*.so (extension not built)" >&2; exit 1; }
pkg="$build/pypkg"
rm -rf "$pkg" && mkdir -p "$pkg/openmla/integrations"
cp "$ROOT"/python/openmla/*.py "$pkg/openmla/" && cp "${ext[0]}" "$pkg/openmla/"
cp "$ROOT"/python/openmla/integrations/*.py "$pkg/openmla/integrations/"
