#!/usr/bin/env bash
# What a GPU run of this project checks, in one place (used for the recorded runs; each part can
# be run alone). From the project root on a machine with a CUDA GPU:
#   bash scripts/gpu_run.sh tests|te|latency|bench|packs|notebooks [OUT_DIR]
# tests:     the test suite with compiled kernels (8 pytest-xdist workers: more run an H200 out of
#            memory on the > 2**31-element tests; tests/test_te_matrix.py alone passes with 10, but
#            with 14 dozens of its cases failed in two sessions, cause not found)
# te:        TransformerEngine's own tests/pytorch/test_fused_rope.py against this package
#            (needs ../shared/te from the study-group workspace): all but the QKV tests on 6
#            workers, then the QKV tests on fewer, as the card's memory allows: at 6 workers 338
#            of them failed on an H200 (2026-11-23) and all 2016 passed at 4; at 4 without the
#            allocator setting exported below, 151 failed with CUDA out of memory; on an H100
#            (80 GB, 2026-11-25) 409 failed with CUDA out of memory at 4 and all passed at 2.
#            Extra pytest arguments (after OUT_DIR) make it one run with them instead, as before.
# latency:   scripts/launch_latency.py
# bench:     python -m rope_kernels.bench --mode full (set ROPE_PEER_DIR for flash-attn's rotary)
# packs:     scripts/thd_uniform_packs.py, uniform thd packs beside flash-attn (ROPE_PEER_DIR too)
# notebooks: strict nbval of every notebook, benchmarks measured live (over 4 minutes on an H200)
set -uo pipefail
part=${1:?tests|te|latency|bench|packs|notebooks}
out=${2:-/tmp/rope-gpu}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
case "$part" in
  tests) python3 -m pytest tests -q -p no:cacheprovider -o addopts="" -n 8 --tb=short "${@:3}" 2>&1 | tee "$out/tests.log" | tail -40 ;;
  te) if [ $# -gt 2 ]; then  # pytest arguments given (a -k of theirs would replace the split's): one run
        bash ../shared/te/run.sh "${@:3}" 2>&1 | tee "$out/te.log" | tail -15
      else
        qkv_workers=$(python3 -c "import torch; print(4 if torch.cuda.get_device_properties(0).total_memory > 100e9 else 2)")
        { bash ../shared/te/run.sh -k "not qkv"
          bash ../shared/te/run.sh -k qkv -n "$qkv_workers"; } 2>&1 | tee "$out/te.log" | grep -E "passed|failed|error"
      fi ;;
  latency) python3 scripts/launch_latency.py --out "$out/launch_latency.json" 2>&1 | tee "$out/latency.log" ;;
  bench) python3 -m rope_kernels.bench --mode full --out "$out" --no-progress "${@:3}" 2>&1 | tee "$out/bench.log" | tail -60 ;;
  packs) python3 scripts/thd_uniform_packs.py --out "$out/thd_uniform_packs.json" 2>&1 | tee "$out/packs.log" ;;
  notebooks) python3 -m pytest --nbval --nbval-current-env notebooks -q -p no:cacheprovider -o addopts="" "${@:3}" 2>&1 | tee "$out/notebooks.log" | tail -20 ;;
  *) echo "unknown part $part"; exit 2 ;;
esac
