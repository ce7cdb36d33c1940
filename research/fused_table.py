"""fused.json rows of bench/fused_vs_unfused.py -> the markdown table of bench/RESULTS.md."""
import json, math, sys
rows = []
for path in sys.argv[1:]:
    rows += json.load(open(path))
print("| op | caches | h_q | tokens | topk | fused µs | unfused µs | plain µs | fused vs unfused | plain / fused |")
print("|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    shape = f"{r['b']}×{r['s_q']}" if r['kind'] == 'decode' else f"{r['tokens']} (s_kv {r.get('s_kv', '')})"
    caches = f"{r.get('main', 'bf16')} + {r.get('extra', '')}" if r['kind'] == 'decode' else 'bf16 kv'
    topk = f"{r['topk']} + {r['extra_topk']}" if r['kind'] == 'decode' else f"{r['topk']}"
    print(f"| {r['kind']} | {caches} | {r['h_q']} | {shape} | {topk} | {r['fused_us']:.1f} | "
          f"{r['unfused_us']:.1f} | {r['plain_us']:.1f} | {r['speedup']:.2f}× | {1 / r['fused_vs_plain']:.2f}× |")
for kind in ('decode', 'prefill'):
    k = [r for r in rows if r['kind'] == kind]
    if not k:
        continue
    g = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs))
    print(f"\n{kind}: {len(k)} rows, fused vs unfused geomean {g([r['speedup'] for r in k]):.2f}× "
          f"({min(r['speedup'] for r in k):.2f}–{max(r['speedup'] for r in k):.2f}), plain / fused "
          f"geomean {g([1 / r['fused_vs_plain'] for r in k]):.2f}× "
          f"({min(1 / r['fused_vs_plain'] for r in k):.2f}–{max(1 / r['fused_vs_plain'] for r in k):.2f})")
