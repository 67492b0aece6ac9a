#!/usr/bin/env bash
# Wheels for a GPU machine that cannot reach the package registries: what benchmarks/gpu_check.sh
# needs beyond what such a machine's CUDA image holds (torch, numba, pytest, an older transformers),
# for its Python (default 3.12) on x86-64 Linux, downloaded into .whl/ (ignored by git). Copy .whl/
# with the working tree; gpu_check.sh installs what it finds there without an index.
#     bash benchmarks/gpu_wheels.sh [PYTHON_VERSION]
# - nvmath-python binds cuSOLVER's batched eigensolver (core/eigen.py); it loads the cuSOLVER that
#   torch's CUDA build already ships, so no CUDA library travels. Its cuda-core and
#   cuda-pathfinder go to .whl/fallback/, installed only where the machine's own are too old.
# - transformers in this package's tested range (pyproject.toml), with the dependencies that
#   range added since the 5.1x releases a CUDA image may hold (huggingface_hub 2 and its httpx2,
#   kernels, a newer regex).
set -eu
cd "$(dirname "$0")/.."
version=${1:-3.12}
download() {  # download FOLDER REQUIREMENT...
  local folder=$1; shift
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$version" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$folder" "$@"
}
download .whl "nvmath-python>=1.0,<2" "transformers>=5.24,<5.26" "huggingface_hub>=2.4,<3" "httpx2>=2,<3" \
  "httpcore2>=2,<3" "truststore>=0.10" "kernels>=0.19.1,<0.20" "tomlkit>=0.13.3" "regex>=2025.10.22" "idna>=3.18" \
  "anyio>=4.10" "h11>=0.16" "typing_extensions>=4.16"
download .whl/fallback "cuda-core>=0.5,<2" "cuda-pathfinder>=1.5.1,<2"
ls -l .whl .whl/fallback
