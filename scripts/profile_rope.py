"""Kernels to profile with Nsight Compute (GPU only): a device copy (the ceiling), the 2-D kernel at
TransformerEngine's default shape, thd with many short sequences (pre-pass + main kernel, and the
search variant), and q+k from a cos/sin cache. Each runs a few times; profile the last launch of
each kernel. Notebook 07 reads the recorded result, figures/ncu_rope.csv:

    ncu --clock-control none --launch-skip 2 --launch-count 40 --csv \\
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,\\
dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed \\
        python scripts/profile_rope.py > figures/ncu_rope.csv
"""

import torch

import rope_kernels as rk
from rope_kernels.bench import Problem, QKProblem


def main():
    src = torch.empty(2**28, dtype=torch.float32, device="cuda").uniform_()  # 1 GiB
    dst = torch.empty_like(src)
    default = Problem("bshd", "bf16")
    thd = Problem("thd", "bf16", n_seqs=16384)
    qk = QKProblem("bf16")
    for _ in range(3):
        torch.cuda.nvtx.range_push("copy")
        dst.copy_(src)
        torch.cuda.nvtx.range_pop()
        rk.rope_2d(default.t, default.freqs, "bshd")
        rk.rope_2d(thd.t, thd.freqs, "thd", cu_seqlens=thd.cu_seqlens)  # pre-pass + main
        rk.rope_2d(thd.t, thd.freqs, "thd", cu_seqlens=thd.cu_seqlens,
                   config=dict(token_rows=False))  # binary search in every tile
        rk.apply_rope_with_cos_sin_cache(qk.positions, qk.tokens(qk.q), qk.tokens(qk.k),
                                         qk.head_dim, qk.cache, validate=False)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
