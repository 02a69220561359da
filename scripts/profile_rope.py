"""Kernels to profile with Nsight Compute (GPU only), in this order, three times: the 2-D kernel at
TransformerEngine's default shape (bshd 4096 x 16 x 32 x 128, bf16), thd with 16384 short
sequences (the pre-pass, then the main kernel; then the same with the binary search), and q+k from
a cos/sin cache (4096 x 16 tokens, 32 q and 8 k heads). Notebook 07 reads the recorded result,
figures/ncu_rope.csv (the last round of launches):

    ncu --clock-control none --kernel-name-base demangled -k regex:"rope|thd_positions" --csv \\
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,\\
dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed \\
        python scripts/profile_rope.py > figures/ncu_rope.csv

A device-to-device copy is a cudaMemcpy, not a kernel, so ncu does not profile it: the ceiling to
compare with is the copy bandwidth the benchmark measures (figures/provenance.json).
"""

import torch

import rope_kernels as rk
from rope_kernels.bench import Problem, QKProblem


def main():
    default = Problem("bshd", "bf16")
    thd = Problem("thd", "bf16", n_seqs=16384)
    qk = QKProblem("bf16")
    for _ in range(3):
        rk.rope_2d(default.t, default.freqs, "bshd")
        rk.rope_2d(thd.t, thd.freqs, "thd", cu_seqlens=thd.cu_seqlens)  # pre-pass + main
        rk.rope_2d(thd.t, thd.freqs, "thd", cu_seqlens=thd.cu_seqlens,
                   config=dict(token_rows=False))  # binary search in every tile
        rk.apply_rope_with_cos_sin_cache(qk.positions, qk.tokens(qk.q), qk.tokens(qk.k),
                                         qk.head_dim, qk.cache, validate=False)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
