#!/usr/bin/env bash
# Wheels for a GPU machine that cannot reach the package registries: what benchmarks/gpu_check.sh
# needs beyond what such a machine's CUDA image holds (torch, numba, transformers, pytest), for
# its Python (default 3.12) on x86-64 Linux, downloaded into .whl/ (ignored by git). Copy .whl/
# with the working tree; gpu_check.sh installs what it finds there without an index.
#     bash benchmarks/gpu_wheels.sh [PYTHON_VERSION]     # CUDA_MAJOR=12 for a CUDA 12 build of torch
# nvmath-python binds cuSOLVER's batched eigensolver (core/eigen.py); it loads the cuSOLVER that
# torch's CUDA build already ships, so none of the CUDA libraries travel; its Python dependencies
# do, in the versions nvmath-python 1.0 needs (cuda-bindings for CUDA 13, as torch's cu13 builds).
set -eu
cd "$(dirname "$0")/.."
version=${1:-3.12}
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$version" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl \
  "nvmath-python>=1.0,<2" "cuda-core>=0.5,<2" "cuda-pathfinder>=1.5.1,<2" "cuda-bindings==${CUDA_MAJOR:-13}.*"
ls -l .whl
