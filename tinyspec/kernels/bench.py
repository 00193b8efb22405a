"""`python -m tinyspec.bench kernels`: the tree-attention kernel against PyTorch, on a CUDA GPU.

For every prefix length L and tree size T it times, with `triton.testing.do_bench` (warm-up,
then the median of many runs, the L2 cache flushed between them):

- `triton`: our kernel (kernels/tree_attention.py), the packed mask made once per tree;
- `sdpa`: `F.scaled_dot_product_attention` with a dense (T, L + T) boolean mask;
- `flex`: FlexAttention (torch >= 2.5) with the same tree as a compiled block mask;

and reports microseconds, our speedup over each, and the bandwidth we achieve: the bytes of K
and V read, over the time, as a fraction of the device-to-device copy bandwidth measured in
the same run (the practical peak of HBM; the data sheet's number is never reached).
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

from ..cli import ArgumentParser, die
from ..timing import copy_bandwidth


def random_tree_mask(T: int, generator: torch.Generator) -> torch.Tensor:
    """(T, T) ancestor mask of a random tree (each node's parent drawn among earlier nodes)."""
    mask = torch.eye(T, dtype=torch.bool)
    for i in range(1, T):
        parent = int(torch.randint(-1, i, (1,), generator=generator))
        if parent >= 0:
            mask[i] |= mask[parent]
    return mask


def build_parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(prog="python -m tinyspec.bench kernels", description=__doc__.split("\n\n")[0],
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--lengths", default="128,1024,4096,16384,32768", help="prefix lengths L")
    ap.add_argument("--trees", default="16,64", help="tree sizes T")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    ap.add_argument("--json", action="store_true")
    return ap


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    if not torch.cuda.is_available():
        die("the kernel benchmark needs a CUDA GPU (the CPU interpreter runs the kernel for correctness only)")
    from triton.testing import do_bench

    from .tree_attention import pack_tree_mask, tree_attention, tree_attention_reference

    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        flex = torch.compile(flex_attention)
    except ImportError:
        flex = None
    device, dtype = torch.device("cuda"), getattr(torch, args.dtype)
    H, D = args.heads, args.head_dim
    peak = copy_bandwidth(device)
    g = torch.Generator().manual_seed(0)
    rows = []
    for T in (int(t) for t in args.trees.split(",")):
        tree = random_tree_mask(T, g).to(device)
        bits = pack_tree_mask(tree)
        for L in (int(n) for n in args.lengths.split(",")):
            q = torch.randn(1, H, T, D, device=device, dtype=dtype)
            k, v = (torch.randn(1, H, L + T, D, device=device, dtype=dtype) for _ in range(2))
            dense = torch.cat([torch.ones(T, L, dtype=torch.bool, device=device), tree], dim=1)  # (T, L + T)
            ours = tree_attention(q, k, v, bits)
            torch.testing.assert_close(ours, tree_attention_reference(q, k, v, tree), atol=2e-2, rtol=2e-2)
            times = {"triton": do_bench(lambda: tree_attention(q, k, v, bits)),
                     "sdpa": do_bench(lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=dense))}
            if flex is not None:
                def tree_mask_mod(b, h, q_idx, kv_idx):  # indices clamped: partial blocks may pass padded ones
                    return (kv_idx < L) | tree[q_idx.clamp(max=T - 1), (kv_idx - L).clamp(0, T - 1)]
                block_mask = create_block_mask(tree_mask_mod, 1, 1, T, L + T, device=device)
                flex(q, k, v, block_mask=block_mask)  # compile before timing
                times["flex"] = do_bench(lambda: flex(q, k, v, block_mask=block_mask))
            kv_bytes = 2 * H * (L + T) * D * q.element_size()
            row = {"L": L, "T": T, **{f"{name}_us": round(ms * 1e3, 1) for name, ms in times.items()},
                   "bandwidth_fraction": round(kv_bytes / (times["triton"] * 1e-3) / peak, 3)}
            for name in ("sdpa", "flex"):
                if name in times:
                    row[f"speedup_vs_{name}"] = round(times[name] / times["triton"], 2)
            rows.append(row)
    name = torch.cuda.get_device_name(device)
    if args.json:
        print(json.dumps({"device": name, "copy_bandwidth_GBps": round(peak / 1e9), "dtype": args.dtype, "H": H, "D": D,
                          "rows": rows}, indent=1))
        return
    print(f"{name}, {args.dtype}, H={H}, D={D}; copy bandwidth {peak / 1e9:.0f} GB/s (the peak below)")
    print(f"{'L':>6} {'T':>3} {'triton us':>10} {'sdpa us':>8} {'flex us':>8} {'vs sdpa':>8} {'vs flex':>8} {'of peak':>8}")
    for r in rows:
        print(f"{r['L']:>6} {r['T']:>3} {r['triton_us']:>10} {r['sdpa_us']:>8} {r.get('flex_us', '-'):>8} "
              f"{r['speedup_vs_sdpa']:>8} {r.get('speedup_vs_flex', '-'):>8} {r['bandwidth_fraction']:>8.0%}")
