#!/usr/bin/env bash
# GPU check of the spectra engine: one run on a CUDA machine, about 8 minutes at most.
# Needs python3 with a CUDA build of torch, numpy and pytest. What else it can use (numba,
# nvmath-python for cuSOLVER's batched eigensolver, transformers for the whole-model cases, which
# are skipped without it) it installs from wheels in .whl/ (benchmarks/gpu_wheels.sh fetches them,
# for a machine without network) or else from the registries. From the repository root:
#     bash benchmarks/gpu_check.sh        # logs in $OUT when set, else ./gpu_check_logs
# Two files: summary.txt (versions, each step's exit, the targets beside their figures) and
# steps.log (every step's output). Steps, each under its own time limit (a step that runs out is
# reported, the next runs), the targets first:
#   0. install what is missing (pip, time-limited), and say whether cuSOLVER's batched solver loads
#   1. the gpu-marked tests: CUDA results equal to the CPU's within the accuracy bound, cuSOLVER's
#      batched eigenvalues and the CUDA kernel's (core/cuda_eigen_kernel.py) equal to torch's
#      and LAPACK's (a layer-sized batch too), the Gramian route within
#      the "ess" contract, an analysis on the GPU verified and equal to the CPU's
#   2. a Mamba-130m-shaped layer (1536 channels, N = 16, L = 1024, all cuts, both variants),
#      under both accuracy contracts, then what its memory holds at the peak, by the engine's line
#      that allocated it (benchmarks/gpu_memory.py)
#   3. whole models through analyze (bench_engine.MODEL_CASES["gpu"]: Mamba-130m at L = 2048 and
#      GPT-2-small at 1024 and 2048 first), each case stopped after 55 s
#   4. where the time of one Mamba-130m layer pair at L = 2048 and one GPT-2 layer at L = 1024 goes
#      (cProfile, benchmarks/profile_model.py)
#   5. eigenvalues of batches of Grams, n = 16 ... 1024: torch against core/eigen.py, and the
#      16 x 16 ones (a Mamba layer's) by cuSOLVER at several limits of the batch one call takes
#      and by the CUDA kernel
#   6. dense batched vs per-cut (GPT-2 heads, L = 1024), on the GPU and on the same machine's CPU
#      cores (cuSOLVER's eigvalsh loops over the batch, so the host's cores may be the faster place)
# (the factored scan against the sweep: bench_engine.py --device cuda --full --only factored)
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
LOGS="${OUT:-$PWD/gpu_check_logs}"
STEPS=$(mktemp -d)  # one log per step, for the summary's grep; all of them go to $LOGS/steps.log
mkdir -p "$LOGS"
PY="${PYTHON:-python3}"
start=$(date +%s)
say() { echo "[$(( $(date +%s) - start )) s] $*" | tee -a "$LOGS/summary.txt"; }
step() {  # step NAME SECONDS COMMAND...: run under a limit, log it, echo the log
  local name=$1 limit=$2; shift 2
  say "$name (limit ${limit} s)"
  timeout "$limit" "$@" > "$STEPS/$name.log" 2>&1
  local rc=$?
  { echo "===== $name"; cat "$STEPS/$name.log"; } | tee -a "$LOGS/steps.log"
  say "$name: exit $rc$( [ $rc = 124 ] && echo ' (time limit)')"
}

date -u | tee -a "$LOGS/summary.txt"
say "torch: $($PY -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "NO CUDA")' 2>&1)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >> "$LOGS/summary.txt" 2>&1 || true

# What the machine lacks: from wheels carried in .whl/ (benchmarks/gpu_wheels.sh: a GPU machine may
# reach no registry), installed without an index ahead of its own packages; else from the registries,
# without retries (no network then costs seconds, not the step's minute).
if ls .whl/*.whl >/dev/null 2>&1; then
  step install 30 $PY -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/ess_gpu_site .whl/*.whl
  export PYTHONPATH="/tmp/ess_gpu_site:$PYTHONPATH"
  # nvmath needs cuda-core and cuda-pathfinder: the machine's own unless they are too old
  if ! $PY -c "from nvmath.bindings import cusolverDn" >/dev/null 2>&1 && ls .whl/fallback/*.whl >/dev/null 2>&1; then
    step install_cuda_core 20 $PY -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/ess_gpu_site .whl/fallback/*.whl
  fi
else
  missing=""
  for pkg in numba "nvmath-python>=1.0,<2:nvmath" "transformers<6:transformers" tqdm; do
    $PY -c "import ${pkg##*:}" 2>/dev/null || missing="$missing ${pkg%%:*}"
  done
  [ -n "$missing" ] && step install 60 $PY -m pip install -q --retries 0 --timeout 10 $missing
fi
say "versions: $($PY -c '
import importlib.metadata as m
def version(name):
    try:
        return m.version(name)
    except m.PackageNotFoundError:
        return "missing"
names = "torch", "transformers", "huggingface_hub", "numba", "numba-cuda", "nvmath-python", "cuda-bindings", "cuda-core", "cuda-pathfinder"
print(", ".join(f"{name} {version(name)}" for name in names))' 2>&1 | tail -1)"
say "cuSOLVER's batched eigensolver: $($PY -c 'from ess_explorer.core.eigen import cusolver_batched_available as a; print("available" if a() else "missing (torch loops over batches of n > 32)")' 2>&1 | tail -1)"
$PY -c "from nvmath.bindings import cusolverDn" 2>&1 | tail -2 | tee -a "$LOGS/summary.txt"

step gpu_tests 70 $PY -m pytest -q -m gpu tests/test_engine_paths.py tests/test_dplr.py tests/test_precision.py tests/test_gramian_blocked.py tests/test_verification.py tests/test_cuda_eigen_kernel.py -p no:cacheprovider
step layer 45 $PY benchmarks/bench_engine.py --device cuda --full --only layer
step memory 35 $PY benchmarks/gpu_memory.py
if $PY -c "import transformers" 2>/dev/null; then
  step models 140 $PY benchmarks/bench_engine.py --device cuda --models-only --case-timeout 55
  step profile_mamba 30 $PY benchmarks/profile_model.py mamba 2048 --device cuda --layers 2 --top 25
  step profile_gpt2 20 $PY benchmarks/profile_model.py gpt2 1024 --device cuda --layers 1 --top 25
else
  say "models: skipped (transformers is not installed)"
fi
step eigen 40 $PY benchmarks/gpu_eigen.py
step dense 30 $PY benchmarks/bench_engine.py --device cuda --full --only dense --case-timeout 30
step dense_host 15 $PY benchmarks/bench_engine.py --device cpu --full --only dense --case-timeout 12

# the four GPU targets beside what this run measured for them (README "Performance")
say "targets: Mamba layer <= 0.3 s | whole Mamba-130m, L = 2048 <= 20 s | 144 GPT-2 heads, L = 1024 <= 5 s (whole model below) | whole GPT-2-small, L = 2048 <= 60 s"
grep -h -E "^  precision (ess|exact)|^  target|^    routes|Mamba-130m, L = 2048|GPT-2-small, L = (1024|2048)" "$STEPS/layer.log" "$STEPS/models.log" 2>/dev/null \
  | tee -a "$LOGS/summary.txt"
say "eigenproblems by size, cuSOLVER against the CUDA kernels, and what the engine chose:"
grep -h -E "^  n = |^  the engine chose" "$STEPS/eigen.log" 2>/dev/null | tee -a "$LOGS/summary.txt"
say "the Mamba layer's memory at its peak (budget 8 GB):"
grep -h -E "estimate|max_memory_allocated| GB in |choices" "$STEPS/memory.log" 2>/dev/null | head -30 | tee -a "$LOGS/summary.txt"
say "done; logs in $LOGS"
