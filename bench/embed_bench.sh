#!/bin/sh
# embed_bench.sh - `mha embed` against sentence-transformers and ONNX Runtime
# on 1,000 English sentences of 5-60 words (bench/gen_sentences.py), all on
# THREADS (default 2) threads in one run; docs/models.md has the figures.
#
#   sh bench/embed_bench.sh [PYTHON]   (PYTHON: one with sentence-transformers,
#                                       onnxruntime, onnx; default /work/venv/st/bin/python)
#
# Measures, in this order (validated first: mha's vectors against
# sentence-transformers' with npycmp, 2e-5):
#   peers      bench/embed_peer.py: encode (batch 32, model loaded) and ORT
#              (exported BertModel, ORT's BERT fusions, same batches/pooling)
#   mha        the whole process `mha embed -o` (model load included) on the
#              texts; while this branch has no tokenizer, on the tokenizer's
#              ids (`--ids`, tokenisation excluded; said in the output)
#   load       `mha embed` of one short text, whole process: median of 5
#   memory     peak RSS of the mha run (/usr/bin/time -v) vs model.safetensors
# Prints "bench NAME key value ..." lines and the ratios.
set -u
cd "$(dirname "$0")/.." || exit 1
PY=${1:-/work/venv/st/bin/python}
THREADS=${THREADS:-2}
B=${MHA_BUILD:-build}
MODEL=${MHA_MODEL_DIR:-models/all-MiniLM-L6-v2}
W=$B/bench-embed
mkdir -p "$W"
[ -x "$B/mha" ] && [ -x "$B/npycmp" ] || make -j2 cli "$B/npycmp" >/dev/null || exit 1
[ -s "$MODEL/model.safetensors" ] || sh tools/get_model.sh || exit 1
/usr/bin/python3 bench/gen_sentences.py "$W/sentences.txt" || exit 1

"$PY" bench/embed_peer.py "$MODEL" "$W/sentences.txt" "$W" "$THREADS" 2>"$W/peer.err" | tee "$W/peer.out"
grep -q "peer onnxruntime" "$W/peer.out" || { tail -n 5 "$W/peer.err"; exit 1; }

mode=text; input=$W/sentences.txt; flag=
if "$B/mha" embed --model "$MODEL" "probe" 2>&1 | grep -q "tokenizer not built"; then
    mode=ids; input=$W/ids.txt; flag=--ids
    echo "bench note: this build has no tokenizer: mha embeds the tokenizer's ids (--ids)"
fi
/usr/bin/time -v "$B/mha" embed --model "$MODEL" $flag --threads "$THREADS" -o "$W/mha.npy" \
    <"$input" 2>"$W/time.txt" >/dev/null || { cat "$W/time.txt"; exit 1; }
"$B/npycmp" "$W/mha.npy" "$W/st.npy" 2e-5 || { echo "bench: mha disagrees with sentence-transformers"; exit 1; }
wall=$(sed -n 's/.*Elapsed (wall clock) time (h:mm:ss or m:ss): //p' "$W/time.txt" |
       awk -F: '{ s = 0; for (i = 1; i <= NF; i++) s = s * 60 + $i; print s }')
rss=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$W/time.txt")
n=$(wc -l <"$input" | tr -d ' ')
echo "bench mha-embed mode $mode sentences_per_s $(awk -v n="$n" -v t="$wall" 'BEGIN{printf "%.1f", n/t}') seconds $wall"

one=$( [ "$mode" = ids ] && echo "101 7592 2088 102" || echo "hello world" )
for i in 1 2 3 4 5; do
    /usr/bin/time -f "%e" "$B/mha" embed --model "$MODEL" $flag --threads "$THREADS" "$one" \
        -o "$W/one.npy" 2>&1 >/dev/null | tail -n 1
done | sort -n | sed -n 3p | awk '{printf "bench load+first-embedding ms %.0f (median of 5, whole process)\n", $1 * 1000}'

msize=$(stat -c %s "$MODEL/model.safetensors")
echo "bench memory peak_rss_mb $(awk -v k="$rss" 'BEGIN{printf "%.1f", k/1024}') model_file_mb $(awk -v b="$msize" 'BEGIN{printf "%.1f", b/1048576}') ratio $(awk -v k="$rss" -v b="$msize" 'BEGIN{printf "%.2f", k*1024/b}')"
st=$(sed -n 's/^peer sentence-transformers sentences_per_s \([0-9.]*\).*/\1/p' "$W/peer.out")
ort=$(sed -n 's/^peer onnxruntime sentences_per_s \([0-9.]*\).*/\1/p' "$W/peer.out")
awk -v n="$n" -v t="$wall" -v st="$st" -v ort="$ort" 'BEGIN{m = n / t;
    printf "bench ratio mha/sentence-transformers %.2f (target >= 2)\n", m / st;
    printf "bench ratio mha/onnxruntime %.2f (target >= 1.3)\n", m / ort}'
