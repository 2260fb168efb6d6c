#!/bin/sh
# mha_gemm.sh - whole MHA forward against nn.MultiheadAttention, per GEMM path.
#
#   bench/mha_gemm.sh [threads] [reps]    (defaults 2, 3; MHA_BUILD picks the build dir)
#
# E = 512, H = 8 (d = 64), need_weights off; B = 1, 2; L = 1024, 2048, 4096;
# causal and not.  Per case, interleaved in one run: mha with its automatic
# GEMM path, mha with MHA_GEMM=blas, PyTorch 1.13 (Debian, its sgemm is the
# same OpenBLAS), and both again with OPENBLAS_CORETYPE=Haswell (set here for
# the comparison only).  Prints JSON lines tagged "cfg", then a table of medians
# and ratios torch_ms / mha_ms.
set -eu
T=${1:-2}
R=${2:-3}
B=${MHA_BUILD:-build}
DIR=$(dirname "$0")
PY=/usr/bin/python3
export OPENBLAS_NUM_THREADS="$T" OMP_NUM_THREADS="$T"
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
tag() { sed "s/^{/{\"cfg\": \"$1\", /"; }
for b in 1 2; do for l in 1024 2048 4096; do for c in 0 1; do
    f="--batch $b --heads 8 --seq $l --head-dim 64 --threads $T --mha"
    [ "$c" = 1 ] && f="$f --causal"
    # shellcheck disable=SC2086
    {
        "$B/mha" bench $f --json --reps "$R" | tag auto
        MHA_GEMM=blas "$B/mha" bench $f --json --reps "$R" | tag blas
        "$PY" "$DIR/compare_torch.py" $f --reps "$R" | tag torch
        OPENBLAS_CORETYPE=Haswell MHA_GEMM=blas "$B/mha" bench $f --json --reps "$R" | tag blas_hsw
        OPENBLAS_CORETYPE=Haswell "$PY" "$DIR/compare_torch.py" $f --reps "$R" | tag torch_hsw
    } | grep -E '"op": ?"mha"' | tee -a "$OUT"
done; done; done
echo
"$PY" - "$OUT" <<'PYEOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
cases = {}
for r in rows:
    cases.setdefault((r["B"], r["L"], r["causal"]), {})[r["cfg"]] = r["ms"]
print(f"{'B':>2} {'L':>5} {'causal':6} {'auto':>8} {'blas':>8} {'torch':>8} {'torch/auto':>10} "
      f"{'torch/blas':>10} | {'blas_hsw':>8} {'torch_hsw':>9} {'t_hsw/auto':>10} {'t_hsw/b_hsw':>11}")
for (b, l, c), m in sorted(cases.items()):
    g = lambda k: m.get(k, float("nan"))
    print(f"{b:>2} {l:>5} {str(c):6} {g('auto'):8.1f} {g('blas'):8.1f} {g('torch'):8.1f} "
          f"{g('torch')/g('auto'):9.2f}x {g('torch')/g('blas'):9.2f}x | {g('blas_hsw'):8.1f} "
          f"{g('torch_hsw'):9.1f} {g('torch_hsw')/g('auto'):9.2f}x {g('torch_hsw')/g('blas_hsw'):10.2f}x")
PYEOF
