"""What the first GPU report (report.json) raised, measured on the same GPU: SDPA's backends for
a masked call as decoding makes them (a new prefix length each call), the kernel against SDPA
replayed from CUDA graphs (the device's time, no Python launch), the step ledger of eager and
graph decoding, and bf16 decoding with and without cuDNN's attention. Writes $OUT/followup.json
(docs/gpu/followup.json is its output).

    PYTHONPATH=. OUT=DIR python docs/gpu/followup.py
"""
import json, os, subprocess, sys, time, traceback
import torch
import torch.nn.functional as F

OUT = os.environ.get("OUT", "runs/followup")
os.makedirs(OUT, exist_ok=True)
T0 = time.time()
END = T0 + float(os.environ.get("BUDGET", "250"))
res = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", "torch": torch.__version__}
cuda = torch.cuda.is_available()
dev = "cuda" if cuda else "cpu"


def save():
    res["seconds"] = round(time.time() - T0, 1)
    with open(f"{OUT}/followup.json", "w") as f:
        json.dump(res, f, indent=1)


def part(name, fn):
    print(f"[{time.time() - T0:5.0f} s] {name}", flush=True)
    try:
        res[name] = fn()
    except Exception as e:
        res[name] = {"error": f"{type(e).__name__}: {e}"[:400], "tb": traceback.format_exc().splitlines()[-8:]}
    save()
    print(json.dumps(res[name])[:1500], flush=True)


def sh(argv, timeout):
    timeout = max(5, min(timeout, END - time.time()))
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                           env=dict(os.environ, PYTHONPATH=".", PYTHONUNBUFFERED="1"))
        return {"rc": p.returncode, "tail": (p.stdout + p.stderr).strip().splitlines()[-6:]}
    except subprocess.TimeoutExpired:
        return {"timed_out": timeout}


def tests():
    return sh([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "slow or not slow",
               "tests/test_tree_attention.py", "-k", "writes_the_same_tokens"], 90)


def sdpa_backends():
    """µs per masked SDPA call as decoding makes them: T = 17 tree tokens, L growing by one per
    call (a new shape each call), and at a fixed L; default backend choice vs each forced one."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    out = {}
    for dtype in ([torch.bfloat16, torch.float32] if cuda else [torch.float32]):
        for name, backends in [("default", None), ("efficient", [SDPBackend.EFFICIENT_ATTENTION]),
                               ("cudnn", [SDPBackend.CUDNN_ATTENTION]), ("math", [SDPBackend.MATH])]:
            for growing in (True, False):
                def call(L):
                    q = torch.randn(1, 4, 17, 64, device=dev, dtype=dtype)
                    k = torch.randn(1, 4, L + 17, 64, device=dev, dtype=dtype)
                    mask = torch.ones(17, L + 17, dtype=torch.bool, device=dev).tril(L)
                    return F.scaled_dot_product_attention(q, k, k, attn_mask=mask)
                try:
                    ctx = sdpa_kernel(backends) if backends else torch.enable_grad()
                    with ctx:
                        call(99)
                        if cuda: torch.cuda.synchronize()
                        t = time.perf_counter()
                        for i in range(200):
                            call(100 + i if growing else 200)
                        if cuda: torch.cuda.synchronize()
                        out[f"{str(dtype)[6:]} {name} {'growing' if growing else 'fixed'}"] = round((time.perf_counter() - t) / 200 * 1e6, 1)
                except Exception as e:
                    out[f"{str(dtype)[6:]} {name}"] = f"{type(e).__name__}: {str(e)[:80]}"
    return out


def kernel_graph():
    """Triton tree attention vs SDPA + mask: do_bench (host launch included) and
    do_bench_cudagraph (device time only), bf16."""
    if not cuda:
        return {"skipped": "cpu"}
    from triton.testing import do_bench, do_bench_cudagraph
    from tinyspec.bench.kernels import random_tree_mask
    from tinyspec.kernels.tree_attention import pack_tree_mask, tree_attention
    g = torch.Generator().manual_seed(0)
    rows = []
    for H, L, T in [(4, 256, 9), (4, 479, 9), (4, 256, 17), (4, 479, 17), (4, 256, 33), (4, 479, 33),
                    (8, 1024, 16), (8, 4096, 16), (8, 1024, 64), (8, 4096, 64), (8, 16384, 64), (8, 32768, 64)]:
        if time.time() > END - 120:
            break
        tree = random_tree_mask(T, g).to(dev)
        bits = pack_tree_mask(tree)
        q = torch.randn(1, H, T, 64, device=dev, dtype=torch.bfloat16)
        k, v = (torch.randn(1, H, L + T, 64, device=dev, dtype=torch.bfloat16) for _ in range(2))
        dense = torch.cat([torch.ones(T, L, dtype=torch.bool, device=dev), tree], dim=1)
        fns = {"triton": lambda: tree_attention(q, k, v, bits),
               "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=dense)}
        row = {"H": H, "L": L, "T": T}
        for name, fn in fns.items():
            row[f"{name}_us"] = round(1e3 * do_bench(fn, return_mode="median"), 1)
            row[f"{name}_graph_us"] = round(1e3 * do_bench_cudagraph(fn, return_mode="median"), 1)
        rows.append(row)
    return rows


def bench(name, argv, cudnn=True, timeout=100):
    code = ("import torch, sys; torch.backends.cuda.enable_cudnn_sdp(%s); from tinyspec.commands import bench; "
            "bench.main(sys.argv[1:])" % cudnn)
    save_to = f"{OUT}/{name}.json"
    r = sh([sys.executable, "-c", code, *argv, "--no-hf", "--temperatures", "0", "--categories", "code",
            "--prompts-per-category", "4", "--max-new-tokens", "96", "--repeats", "2", "--save", save_to], timeout)
    if os.path.exists(save_to):
        rep = json.load(open(save_to))
        r["report"] = rep
    return r


part("tests", tests)
part("sdpa_backends", sdpa_backends)
part("kernel_graph", kernel_graph)
quick = [] if cuda else ["--max-new-tokens", "8"]
part("profile_fp32", lambda: bench("profile_fp32", ["--methods", "ar,medusa:32,eagle,lookup", "--profile", "--dtype", "float32"]))
part("graph_profile_fp32", lambda: bench("graph_profile_fp32", ["--methods", "ar,medusa:32", "--cuda-graph", "--profile", "--dtype", "float32"] if cuda else ["--methods", "ar"], timeout=60))
part("bf16_no_cudnn", lambda: bench("bf16_no_cudnn", ["--methods", "ar,medusa:16,eagle,rest", "--dtype", "bfloat16"], cudnn=False))
part("bf16_default", lambda: bench("bf16_default", ["--methods", "ar,medusa:16,eagle,rest", "--dtype", "bfloat16"]))
print(json.dumps({k: v for k, v in res.items()}, indent=None)[-6000:])
