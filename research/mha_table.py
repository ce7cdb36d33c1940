"""mha.json (bench/mha_prefill_vs_torch.py) and bwd.json (bench/mha_prefill_backward_vs_torch.py)
rows -> the markdown tables of bench/RESULTS.md.   python3 research/mha_table.py mha.json bwd.json"""
import json, math, sys


def geo(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


for path in sys.argv[1:]:
    rows = json.load(open(path))
    if not rows:
        continue
    m = rows[0]
    print(f"\n{path}: {m['device']}, torch {m['torch']}, same-run bf16 GEMM {m['gemm_tflops']:.0f} "
          f"TFLOP/s, copy {m['copy_gbs']:.0f} GB/s")
    fwd = "s" in m
    print("| seqlen × batch | h | d_qk/d_v | causal | OpenMLA TFLOP/s | torch best | torch TFLOP/s | "
          "OpenMLA / torch | of same-run GEMM |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        s, b = (r["s"], r["b"]) if fwd else (r["seqlen"], r["batch"])
        best = r.get("torch_best" if fwd else "torch_backend", "-")
        ttf = r.get("torch_best_tflops" if fwd else "torch_tflops", float("nan"))
        sp = r.get("speedup", float("nan"))
        print(f"| {s} × {b} | {r['h']} | {r['d_qk']}/{r['d_v']} | {'yes' if r['causal'] else 'no'} | "
              f"{r['openmla_tflops']:.0f} | {best} | {ttf:.0f} | {sp:.2f}× | "
              f"{r['openmla_tflops'] / m['gemm_tflops']:.2f} |")
    sps = [r["speedup"] for r in rows if "speedup" in r]
    print(f"\ngeometric mean OpenMLA / torch's best: {geo(sps):.2f}× ({len(sps)} rows, "
          f"{min(sps):.2f}–{max(sps):.2f})")
