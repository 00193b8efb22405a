"""`python -m tinyspec bench kernels`: the tree-attention kernel against PyTorch, on a CUDA GPU.

For every prefix length L and tree size T it times, with `triton.testing.do_bench` (warm-up,
then the median of many runs, the L2 cache flushed between them):

- `triton`: our kernel (kernels/tree_attention.py), the packed mask made once per tree;
- `sdpa`: `F.scaled_dot_product_attention` with a dense (T, L + T) boolean mask (the backend that
  ran is named: with a mask it cannot be flash attention), and `sdpa_nomask`, the same call with
  no mask at all, which flash attention runs: a floor for any masked kernel;
- `flex`: FlexAttention (torch >= 2.5) with the same tree as a compiled block mask;

and reports microseconds, our speedup over each, and the bandwidth we achieve: the bytes of K
and V read, over the time, as a fraction of the device-to-device copy bandwidth measured in
the same run (the practical peak of HBM; the data sheet's number is never reached). Those
times include launching from Python, which at short prefixes is most of a call; `triton_graph`
and `sdpa_graph` replay each call from a CUDA graph (`do_bench_cudagraph`): the device's time
alone, what a decoding step recorded as a graph pays.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

from ..commands.cli import ArgumentParser, HelpFormatter, die, examples
from ..speed.timing import copy_bandwidth, median_seconds


def random_tree_mask(T: int, generator: torch.Generator) -> torch.Tensor:
    """(T, T) ancestor mask of a random tree (each node's parent drawn among earlier nodes)."""
    mask = torch.eye(T, dtype=torch.bool)
    for i in range(1, T):
        parent = int(torch.randint(-1, i, (1,), generator=generator))
        if parent >= 0:
            mask[i] |= mask[parent]
    return mask


def build_parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(prog="python -m tinyspec bench kernels", description=__doc__.split("\n\n")[0],
                        formatter_class=HelpFormatter,
                        epilog=examples("python -m tinyspec bench kernels",
                                        "python -m tinyspec bench kernels --lengths 16384 --trees 64 --json"))
    ap.add_argument("--lengths", default="128,1024,4096,16384,32768", help="prefix lengths L")
    ap.add_argument("--trees", default="16,64", help="tree sizes T")
    ap.add_argument("--heads", type=int, default=8, help="attention heads H")
    ap.add_argument("--head-dim", type=int, default=64, help="head dimension D")
    ap.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16", help="input dtype")
    ap.add_argument("--no-flex", action="store_true", help="skip FlexAttention (it compiles once per shape)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    return ap


def _timer(device: torch.device):
    """Milliseconds of a call: triton's do_bench on a GPU (warm-up, L2 flushed, median of many
    runs), our median_seconds elsewhere (the interpreter: correctness of the code path only)."""
    if device.type == "cuda":
        from triton.testing import do_bench
        return lambda fn: do_bench(fn, return_mode="median")
    return lambda fn: 1e3 * median_seconds(fn, device, repeats=3, warmup=1)


def _flex(device):
    """FlexAttention compiled for fixed shapes, or None where it does not run (no CUDA, old torch).
    Each (T, L) compiles once; the recompile limit is raised so that none falls back to eager."""
    if device.type != "cuda":
        return None
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:
        return None
    import torch._dynamo
    for name in ("recompile_limit", "cache_size_limit"):  # its name changed across torch versions
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, 256)
    return torch.compile(flex_attention, dynamic=False), create_block_mask


def kernel_rows(device: torch.device, dtype: torch.dtype, lengths, trees, H: int = 8, D: int = 64,
                flex: bool = True, progress=None, num_splits: int | None = None,
                deadline: float | None = None) -> tuple[list[dict], float]:
    """One row per (T, L): microseconds of our kernel, of SDPA with the dense mask (and the
    backend that ran it), of SDPA with no mask at all (flash attention: a floor no masked kernel
    beats), of FlexAttention; ratios; and the K+V bytes over our time as a fraction of the
    measured copy bandwidth. Every output is checked against the PyTorch reference first.
    num_splits: the kernel's prefix splits (default: its own choice); deadline: a time.time()
    after which no further row is started (the rows so far are returned)."""
    from ..kernels.tree_attention import pack_tree_mask, tree_attention, tree_attention_reference

    timed = _timer(device)
    flex_parts = _flex(device) if flex else None
    peak = copy_bandwidth(device)
    g = torch.Generator().manual_seed(0)
    rows = []
    for T in trees:
        tree = random_tree_mask(T, g).to(device)
        bits = pack_tree_mask(tree)
        for L in lengths:
            if deadline is not None and time.time() > deadline:
                return rows, peak
            q = torch.randn(1, H, T, D, device=device, dtype=dtype)
            k, v = (torch.randn(1, H, L + T, D, device=device, dtype=dtype) for _ in range(2))
            dense = torch.cat([torch.ones(T, L, dtype=torch.bool, device=device), tree], dim=1)  # (T, L + T)
            reference = tree_attention_reference(q, k, v, tree)
            tol = dict(atol=2e-2, rtol=2e-2) if dtype != torch.float32 else dict(atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(tree_attention(q, k, v, bits, num_splits=num_splits), reference, **tol)
            ours = lambda: tree_attention(q, k, v, bits, num_splits=num_splits)
            sdpa = lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=dense)
            times = {"triton": timed(ours), "sdpa": timed(sdpa),
                     "sdpa_nomask": timed(lambda: F.scaled_dot_product_attention(q, k, v))}
            if device.type == "cuda":  # device time alone: replayed from a CUDA graph, no Python launch
                from triton.testing import do_bench_cudagraph
                times |= {"triton_graph": do_bench_cudagraph(ours, return_mode="median"),
                          "sdpa_graph": do_bench_cudagraph(sdpa, return_mode="median")}
            if flex_parts is not None:
                flex_attention, create_block_mask = flex_parts

                def tree_mask_mod(b, h, q_idx, kv_idx):  # indices clamped: partial blocks may pass padded ones
                    return (kv_idx < L) | tree[q_idx.clamp(max=T - 1), (kv_idx - L).clamp(0, T - 1)]
                block_mask = create_block_mask(tree_mask_mod, 1, 1, T, L + T, device=device)
                torch.testing.assert_close(flex_attention(q, k, v, block_mask=block_mask), reference, **tol)
                times["flex"] = timed(lambda: flex_attention(q, k, v, block_mask=block_mask))
            kv_bytes = 2 * H * (L + T) * D * q.element_size()
            row = {"L": L, "T": T, "H": H, "D": D, "flex_us": None, **{f"{name}_us": round(ms * 1e3, 1) for name, ms in times.items()},
                   "sdpa_backend": sdpa_backend(q, k, v, dense),
                   "bandwidth_fraction": round(kv_bytes / (times["triton"] * 1e-3) / peak, 3)}
            if "triton_graph" in times:
                row["speedup_vs_sdpa_graph"] = round(times["sdpa_graph"] / times["triton_graph"], 2)
                row["bandwidth_fraction_graph"] = round(kv_bytes / (times["triton_graph"] * 1e-3) / peak, 3)
            for name in ("sdpa", "flex"):
                if name in times:  # flex_us stays None where FlexAttention does not run
                    row[f"speedup_vs_{name}"] = round(times[name] / times["triton"], 2)
            rows.append(row)
            if progress:
                progress(row)
    return rows, peak


def sdpa_backend(q, k, v, mask) -> str:
    """Which of SDPA's kernels runs with a boolean mask: PyTorch's own choice where it tells
    (a private function), else the first that accepts the call."""
    if q.device.type != "cuda":
        return "math (cpu)"
    from torch.nn.attention import SDPBackend, sdpa_kernel
    try:
        return SDPBackend(torch._fused_sdp_choice(q, k, v, mask)).name.lower()
    except (AttributeError, RuntimeError, TypeError, ValueError):
        pass
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                    SDPBackend.MATH):
        try:
            with sdpa_kernel(backend):
                F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            return backend.name.lower()
        except RuntimeError:
            continue
    return "unknown"


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    if not torch.cuda.is_available():
        die("the kernel benchmark needs a CUDA GPU (the CPU interpreter runs the kernel for correctness only)")
    device, dtype = torch.device("cuda"), getattr(torch, args.dtype)
    H, D = args.heads, args.head_dim
    try:
        lengths, trees = [int(n) for n in args.lengths.split(",")], [int(t) for t in args.trees.split(",")]
    except ValueError:
        die("--lengths and --trees take comma-separated integers")
    rows, peak = kernel_rows(device, dtype, lengths, trees, H, D, flex=not args.no_flex)
    name = torch.cuda.get_device_name(device)
    if args.json:
        print(json.dumps({"device": name, "copy_bandwidth_GBps": round(peak / 1e9), "dtype": args.dtype, "H": H, "D": D,
                          "rows": rows}, indent=1))
        return
    print(f"{name}, {args.dtype}, H={H}, D={D}; copy bandwidth {peak / 1e9:.0f} GB/s (the peak below)")
    print(f"{'L':>6} {'T':>3} {'triton us':>10} {'sdpa us':>8} {'flex us':>8} {'vs sdpa':>8} {'vs flex':>8} {'of peak':>8}"
          f" {'graph: triton us':>17} {'sdpa us':>8} {'vs sdpa':>8}")
    for r in rows:
        print(f"{r['L']:>6} {r['T']:>3} {r['triton_us']:>10} {r['sdpa_us']:>8} {r['flex_us'] or '-':>8} "
              f"{r['speedup_vs_sdpa']:>8} {r.get('speedup_vs_flex', '-'):>8} {r['bandwidth_fraction']:>8.0%}"
              f" {r['triton_graph_us']:>17} {r['sdpa_graph_us']:>8} {r['speedup_vs_sdpa_graph']:>8}")
