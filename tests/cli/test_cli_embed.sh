#!/bin/sh
# `mha embed`, `mha search`, `mha viz --model` on the real all-MiniLM-L6-v2:
# exit codes, messages, embeddings against sentence-transformers
# (tests/fixtures/bert/), bits independent of --threads and --batch-size,
# model files that are wrong (copies in a temporary directory).  Without the
# model (`make model`) everything is skipped; the text-input cases skip when
# this build has no tokenizer.  Prints "cli-embed: N passed, N failed".
B=${MHA_BUILD:-build}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
MHA="$ROOT/$B/mha"
CMP="$ROOT/$B/npycmp"
FIX="$ROOT/tests/fixtures/bert"
MODEL=${MHA_MODEL_DIR:-$ROOT/models/all-MiniLM-L6-v2}
pass=0; fail=0
ok() { pass=$((pass + 1)); echo "ok $1"; }
no() { fail=$((fail + 1)); echo "FAIL $1"; }
check() { name=$1; shift; if "$@"; then ok "$name"; else no "$name"; fi; }
skipped=0
skip() { skipped=$((skipped + 1)); echo "skip $1"; }
if [ ! -s "$MODEL/model.safetensors" ]; then
    skip "cli-embed: no model at $MODEL (make model)"
    echo "cli-embed: 0 passed, 0 failed, $skipped skipped"
    exit 0
fi
if "$MHA" embed --model "$MODEL" --ids "101 102" 2>&1 >/dev/null | grep -q "no libcjson"; then
    skip "cli-embed: this build has no libcjson (the model's config.json reader)"
    echo "cli-embed: 0 passed, 0 failed, $skipped skipped"
    exit 0
fi
T=$(mktemp -d "${TMPDIR:-/tmp}/mha-embed.XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT INT TERM
unset MHA_MODEL_DIR
# run ARGS...: mha in $T/cwd (no models/ there); sets rc, out, err
mkdir "$T/cwd"
run() { (cd "$T/cwd" && "$MHA" "$@" >"$T/out" 2>"$T/err"); rc=$?; out=$(cat "$T/out"); err=$(cat "$T/err"); }
has() { printf '%s' "$1" | grep -q -- "$2"; }

IDS="$FIX/ids.txt" # the fixture's ids, one text per line (mha embed --ids)

# 1. help, and the model directory rules
run embed --help
check "embed --help: exit 0, documents --batch-size" sh -c '[ $0 -eq 0 ] && printf "%s" "$1" | grep -q -- --batch-size' "$rc" "$out"
run embed --model "$T/nowhere" --ids "101 102"
check "missing --model dir: exit 2" [ "$rc" -eq 2 ]
check "missing --model dir: says make model" has "$err" "make model"
(cd "$T/cwd" && MHA_MODEL_DIR="$T/nowhere" "$MHA" embed --ids "101 102" >"$T/out" 2>"$T/err"); rc=$?
check "missing MHA_MODEL_DIR: exit 2 naming it" sh -c '[ $0 -eq 2 ] && grep -q MHA_MODEL_DIR "$1"' "$rc" "$T/err"
run embed --ids "101 7592 2088 102"
check "found beside the executable (no flag, no env, other cwd): exit 0" [ "$rc" -eq 0 ]
check "summary: shape and unit norm" sh -c 'printf "%s" "$1" | grep -q "(1, 384)" && printf "%s" "$1" | grep -q "|x| 1.000000"' _ "$out"
run embed --model "$MODEL" --ids "101 999999 102"
check "id outside the vocabulary: exit 2" sh -c '[ $0 -eq 2 ] && printf "%s" "$1" | grep -q vocabulary' "$rc" "$err"
run embed --model "$MODEL" --ids "101 abc"
check "--ids not numbers: exit 2" [ "$rc" -eq 2 ]
run embed --bogus
check "unknown option: exit 2" [ "$rc" -eq 2 ]

# 2. embeddings from the fixture's ids equal sentence-transformers'
run embed --model "$MODEL" --ids -o "$T/e.npy" < "$IDS"
check "--ids stdin -o: exit 0" [ "$rc" -eq 0 ]
check "--ids: equal to sentence-transformers (2e-5)" "$CMP" "$T/e.npy" "$FIX/embeddings.npy" 2e-5
# 3. bits independent of threads and batch size
for cfg in "1 64" "2 1" "3 64"; do
    set -- $cfg
    run embed --model "$MODEL" --ids --threads "$1" --batch-size "$2" -o "$T/e_$1_$2.npy" < "$IDS"
    check "--threads $1 --batch-size $2: identical bytes" cmp -s "$T/e.npy" "$T/e_$1_$2.npy"
done

# 4. model files that are wrong: exit 2 with a message
bad() { # NAME: a copy of the model dir with symlinks, NAME's files replaced by the caller
    d="$T/$1"; mkdir -p "$d/1_Pooling"
    for f in config.json model.safetensors modules.json sentence_bert_config.json tokenizer.json 1_Pooling/config.json; do
        ln -s "$MODEL/$f" "$d/$f"
    done
}
bad notjson; rm "$T/notjson/config.json"; printf '{"hidden_size": 384,' >"$T/notjson/config.json"
run embed --model "$T/notjson" --ids "101 102"
check "config.json not JSON: exit 2 naming it" sh -c '[ $0 -eq 2 ] && printf "%s" "$1" | grep -q "config.json: not JSON"' "$rc" "$err"
bad trunc; rm "$T/trunc/model.safetensors"; head -c 1000000 "$MODEL/model.safetensors" >"$T/trunc/model.safetensors"
run embed --model "$T/trunc" --ids "101 102"
check "truncated model.safetensors: exit 2 with a message" sh -c '[ $0 -eq 2 ] && printf "%s" "$1" | grep -q "safetensors"' "$rc" "$err"
bad disagree; rm "$T/disagree/config.json"; sed 's/"intermediate_size": 1536/"intermediate_size": 1024/' "$MODEL/config.json" >"$T/disagree/config.json"
run embed --model "$T/disagree" --ids "101 102"
check "config disagreeing with the tensors: exit 2 naming the tensor" sh -c '[ $0 -eq 2 ] && printf "%s" "$1" | grep -q "intermediate.dense.weight.*config.json says"' "$rc" "$err"
bad noweights; rm "$T/noweights/model.safetensors"
run embed --model "$T/noweights" --ids "101 102"
check "model.safetensors missing: exit 2" sh -c '[ $0 -eq 2 ] && printf "%s" "$1" | grep -q "model.safetensors"' "$rc" "$err"

# 5. text input (needs the tokenizer)
run embed --model "$MODEL" "hello world"
if printf "%s" "$err" | grep -Eq "tokenizer not built|utf8proc|libcjson"; then
    check "no tokenizer: exit 2 saying so" [ "$rc" -eq 2 ]
    skip "text input, search, viz --model: this build has no tokenizer"
else
    run embed --model "$MODEL" -o "$T/t.npy" < "$FIX/texts.txt"
    check "texts from stdin -o: exit 0" [ "$rc" -eq 0 ]
    check "texts: equal to sentence-transformers (2e-5)" "$CMP" "$T/t.npy" "$FIX/embeddings.npy" 2e-5
    printf 'The cat sleeps on the sofa.\nStock markets fell sharply.\n\nA man is playing a guitar.\n' >"$T/lines.txt"
    run search --model "$MODEL" --top 2 "a kitten napping on a couch" "$T/lines.txt"
    check "search: exit 0, 2 lines" sh -c '[ $0 -eq 0 ] && [ $(printf "%s\n" "$1" | wc -l) -eq 2 ]' "$rc" "$out"
    check "search: the cat line first" sh -c 'printf "%s\n" "$1" | head -n 1 | grep -q "cat sleeps"' _ "$out"
    run viz --model "$MODEL" --text "the cat sat" --layer 1 --svg "$T/v.svg"
    check "viz --model: exit 0 and SVG with tokens" sh -c '[ $0 -eq 0 ] && grep -q ">cat<" "$1"' "$rc" "$T/v.svg"
    check "viz --model: 12 heads + average x 5 x 5 cells" [ "$(grep -o '<rect class="cell"' "$T/v.svg" | wc -l)" -eq 325 ]
    run viz --model "$MODEL" --text "x" --layer 6 --svg "$T/w.svg"
    check "viz --model --layer past the last: exit 2" [ "$rc" -eq 2 ]
fi
run search --model "$MODEL" "query"
check "search without FILE: exit 2" [ "$rc" -eq 2 ]
run search --model "$MODEL" "query" "$T/none.txt"
check "search of a missing file: exit 2" [ "$rc" -eq 2 ]

echo "cli-embed: $pass passed, $fail failed, $skipped skipped"
[ "$fail" -eq 0 ]
