#!/bin/sh
# run.sh - mha against PyTorch on the same shapes and threads, in one run.
#
#   bench/run.sh [threads]        (default 2; MHA_BUILD picks the build dir)
#
# For each case runs `mha bench --json` (fused kernel, validated) and
# bench/compare_torch.py, then prints the ratios torch_ms / mha_ms
# (> 1: mha is faster).  Both sides use the same OpenBLAS settings:
# OPENBLAS_NUM_THREADS = threads (mha's projections call OpenBLAS outside
# mha's own parallel regions, so its pool never nests inside them).
# OPENBLAS_CORETYPE is passed through when set (OpenBLAS 0.3.21 may not
# recognise the CPU of a VM and fall back to a generic SSE3 kernel).
set -eu
T=${1:-2}
B=${MHA_BUILD:-build}
MHA="$B/mha"
PY=/usr/bin/python3
DIR=$(dirname "$0")
export OPENBLAS_NUM_THREADS="$T" OMP_NUM_THREADS="$T"
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT

# B H L d causal mha  (MHA_BENCH_CASES replaces the list, same format)
CASES=${MHA_BENCH_CASES:-"1 8 1024 64 0 0
1 8 1024 64 1 0
1 8 2048 64 0 0
1 8 2048 128 0 0
1 8 4096 64 0 0
1 8 4096 64 1 0
1 8 1024 64 0 1
1 8 2048 64 0 1
1 8 2048 64 1 1"}

echo "$CASES" | while read -r b h l d c m; do
    flags="--batch $b --heads $h --seq $l --head-dim $d --threads $T"
    [ "$c" = 1 ] && flags="$flags --causal"
    [ "$m" = 1 ] && flags="$flags --mha"
    "$MHA" bench $flags --json --reps 3 >>"$OUT"
    # shellcheck disable=SC2086
    "$PY" "$DIR/compare_torch.py" $flags --reps 3 >>"$OUT"
done

cat "$OUT"
echo
"$PY" - "$OUT" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
key = lambda r: (r["op"], r["B"], r["H"], r["L"], r["d"], r["causal"])
ours = {key(r): r for r in rows if r["kernel"] in ("avx2", "scalar")}
print(f"{'op':9} {'B':>2} {'H':>3} {'L':>6} {'d':>4} {'causal':6} {'mha ms':>9} "
      f"{'%peak':>6} {'baseline':14} {'base ms':>9} {'ratio':>6}")
for r in rows:
    o = ours.get(key(r))
    if r["kernel"].startswith("torch") and o:
        print(f"{r['op']:9} {r['B']:>2} {r['H']:>3} {r['L']:>6} {r['d']:>4} "
              f"{str(r['causal']):6} {o['ms']:9.2f} {100*o['gflops']/o['peak_gflops']:6.1f} "
              f"{r['kernel']:14} {r['ms']:9.2f} {r['ms']/o['ms']:6.2f}x")
full = {key(r)[:-1]: r for r in ours.values() if not r["causal"]}
for k, r in ours.items():
    if r["causal"] and k[:-1] in full:
        print(f"causal/non-causal time {k[0]} L={k[3]} d={k[4]}: "
              f"{r['ms']/full[k[:-1]]['ms']:.2f}")
PYEOF
