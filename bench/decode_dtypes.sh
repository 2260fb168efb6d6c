#!/bin/sh
# decode_dtypes.sh - the decode step over a float32, bf16 and fp16 cache in
# one run: ratios of the float32 step's time to each, and the fraction of
# the read bandwidth each reaches.
#
#   bench/decode_dtypes.sh [rounds [S,S,... [threads [mha ...]]]]
#
# Defaults: 5 rounds, S 4096,16384,32768, 2 threads, build/mha (MHA_BUILD
# picks the build dir); a second binary after the first compares builds
# (an A/B of the same cases, interleaved).  Each round runs `mha bench
# --decode --reps 9 --json` once per binary, S and dtype, in a random order
# (a shared host's load drifts; interleaving spreads it over every
# variant).  Prints per binary, S and dtype: the median over the rounds of
# ms, the fastest ms_min, f32 ms / this, the median bw_frac and read GB/s.
# Each step runs cold, after a read pass (docs/onnx.md, "Decode
# benchmark").  H 32, Hkv 8, d 128: mha bench --decode's default shape.
set -eu
R=${1:-5}
SS=${2:-4096,16384,32768}
T=${3:-2}
if [ $# -ge 4 ]; then shift 3; else set -- "${MHA_BUILD:-build}/mha"; fi
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
r=0
while [ "$r" -lt "$R" ]; do
    for run in $(for m in "$@"; do for S in $(echo "$SS" | tr , ' '); do
        for dt in f32 bf16 f16; do echo "$m|$S|$dt"; done; done; done | shuf); do
        m=${run%%|*} rest=${run#*|}
        printf '%s ' "$m" >>"$OUT"
        "$m" bench --decode --kv-seq "${rest%|*}" --threads "$T" --reps 9 \
            --dtype "${rest#*|}" --json >>"$OUT"
    done
    r=$((r + 1))
done
/usr/bin/python3 - "$OUT" <<'PY'
import json, statistics as st, sys
runs = {}
for line in open(sys.argv[1]):
    binary, js = line.split(" ", 1)
    j = json.loads(js)
    runs.setdefault((binary, j["S"], j["dtype"]), []).append(j)
print("%-28s %6s %-4s %8s %8s %8s %7s %6s" % ("binary", "S", "dtype", "ms", "ms_min",
                                              "f32/this", "bw_frac", "read"))
for (binary, S, dt) in sorted(runs, key=lambda k: (k[0], k[1], ["f32", "bf16", "f16"].index(k[2]))):
    r = runs[(binary, S, dt)]
    ms = st.median(x["ms"] for x in r)
    f32 = st.median(x["ms"] for x in runs.get((binary, S, "f32"), r))
    print("%-28s %6d %-4s %8.3f %8.3f %8.2f %7.2f %6.1f" % (
        binary[-28:], S, dt, ms, min(x["ms_min"] for x in r), f32 / ms,
        st.median(x["bw_frac"] for x in r), st.median(x["read_gbps"] for x in r)))
PY
