#!/usr/bin/env bash
# Packs the Python test dependencies the GPU device image lacks (transformers and the packages it
# imports; torch, numpy and pytest are on the image) for its CPython 3.12 into
# .pydeps/tf-site-py312.tar.xz. tools/device_check.sh unpacks it onto PYTHONPATH, so the
# transformers integration tests run on the GPU; pass `.pydeps` in the device tool's `carry`.
# Only transformers' DeepSeek models are kept (the archive must travel in 64 MiB with the rest).
# Needs network (PyPI); run it on the development machine, not on the device.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSION="${TRANSFORMERS_VERSION:-5.25.0}"  # the pin of tools/test.sh
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m pip install --quiet --target "$tmp/site" --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 --only-binary=:all: "transformers==$VERSION"
# What the device image already has must come from the image, not from here.
rm -rf "$tmp"/site/{torch,numpy,nvidia,triton}* "$tmp"/site/bin
find "$tmp/site/transformers/models" -mindepth 1 -maxdepth 1 -type d \
  ! -name auto ! -name deepseek_v3 ! -name deepseek_v32 ! -name deepseek_v4 -exec rm -rf {} +
find "$tmp/site" -name __pycache__ -type d -exec rm -rf {} +
mkdir -p "$ROOT/.pydeps"
tar cJf "$ROOT/.pydeps/tf-site-py312.tar.xz" -C "$tmp" site
ls -la "$ROOT/.pydeps/tf-site-py312.tar.xz"
