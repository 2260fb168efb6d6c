#!/bin/sh
# test_cli_tokenize.sh - `mha tokenize` on the hand-made tokenizer
# (tests/fixtures/tokenizer/tiny): ids of arguments and of standard input
# (NUL bytes and invalid UTF-8 inside lines), --tokens, truncation from
# sentence_bert_config.json and --max-length, the model directory search
# (--model, MHA_MODEL_DIR, missing: exit 2 saying `make model`), malformed
# tokenizer.json files (exit 2 and the message), argument errors.  With the
# real model (make model) the ids of three texts as tokenizers gives them.
# Prints "cli-tokenize: N passed, N failed".
. tests/cli/lib/common.sh
TINY=$PWD/tests/fixtures/tokenizer/tiny

# same WANT CMD... : exit 0 and stdout exactly WANT
same() {
    want=$1
    shift
    got=$("$@" 2>"$T/stderr")
    rc=$?
    if [ "$rc" -eq 0 ] && [ "$got" = "$want" ]; then ok
    else ko "$* -> exit $rc, stdout '$got', stderr '$(head -c 300 "$T/stderr")' (want '$want')"; fi
}

if ! "$MHA" tokenize --model "$TINY" x >/dev/null 2>"$T/probe"; then
    if grep -q "no utf8proc\|no libcjson" "$T/probe"; then
        echo "skip cli-tokenize: $(cat "$T/probe")"
        echo "cli-tokenize: 0 passed, 0 failed"
        exit 0
    fi
fi

same "2 94 95 3" "$MHA" tokenize --model "$TINY" "hello world"
same "$(printf '2 94 95 3\n2 3\n2 91 4 3')" "$MHA" tokenize --model "$TINY" "hello world" "" "un[MASK]"
same "[CLS] un ##aff ##able [SEP]" "$MHA" tokenize --model "$TINY" --tokens "Unaffable"
printf 'a\000b\nc\377d\n\n \t \n' >"$T/in.txt"
same "$(printf '[CLS] ab [SEP]\n[CLS] c ##d [SEP]\n[CLS] [SEP]\n[CLS] [SEP]')" \
    sh -c "\"$MHA\" tokenize --model \"$TINY\" --tokens < \"$T/in.txt\""
same "[CLS] a b [SEP]" "$MHA" tokenize --model "$TINY" --tokens --max-length 4 "a b c d"
same "[CLS] a b c d [SEP]" "$MHA" tokenize --model "$TINY" --tokens --max-length 0 "a b c d"
same "[CLS] - - [SEP]" "$MHA" tokenize --model "$TINY" --tokens -- "--"

# truncation from the model's sentence_bert_config.json
mkdir -p "$T/m"
cp "$TINY/tokenizer.json" "$T/m/"
echo '{"max_seq_length": 3, "do_lower_case": false}' >"$T/m/sentence_bert_config.json"
same "[CLS] a [SEP]" "$MHA" tokenize --model "$T/m" --tokens "a b c d"
same "[CLS] a b c [SEP]" env MHA_MODEL_DIR="$T/m" "$MHA" tokenize --tokens --max-length 5 "a b c d"
echo '{"max_seq_length": "long"}' >"$T/m/sentence_bert_config.json"
expect 2 "max_seq_length is not a positive integer" "$MHA" tokenize --model "$T/m" x
echo '[256]' >"$T/m/sentence_bert_config.json"
expect 2 "not a JSON object" "$MHA" tokenize --model "$T/m" x

# the model directory search and missing files
expect 2 "is not a directory" "$MHA" tokenize --model "$T/none" x
expect 2 "MHA_MODEL_DIR" env MHA_MODEL_DIR="$T/none" "$MHA" tokenize x
mkdir -p "$T/empty/bin"
cp "$MHA" "$T/empty/bin/mha"
expect 2 "make model" sh -c "cd \"$T/empty\" && MHA_MODEL_DIR= ./bin/mha tokenize x"
mkdir -p "$T/empty/models/all-MiniLM-L6-v2"
cp "$TINY/tokenizer.json" "$T/empty/models/all-MiniLM-L6-v2/"
same "2 94 3" sh -c "cd / && MHA_MODEL_DIR= \"$T/empty/bin/mha\" tokenize hello"
expect 2 "tokenizer.json" "$MHA" tokenize --model "$T/empty" x
rm "$T/m/sentence_bert_config.json"
for f in not_json.json model_bpe.json vocab_id_twice.json added_normalized.json; do
    cp "tests/corpus/tokenizer/$f" "$T/m/tokenizer.json"
    needle=$(sed -n "s/^$f [A-Z]* //p" tests/corpus/tokenizer.txt)
    expect 2 "$needle" "$MHA" tokenize --model "$T/m" x
done

# arguments
expect 2 "unknown or incomplete option '--bogus'" "$MHA" tokenize --bogus
expect 2 "unknown or incomplete option '--model'" "$MHA" tokenize --model
expect 2 "--max-length: '-1'" "$MHA" tokenize --max-length -1 x
same "$("$MHA" tokenize --help | head -n 1)" sh -c "\"$MHA\" tokenize -h | head -n 1"

# the real model, when `make model` fetched it
M=${MHA_MODEL_DIR:-models/all-MiniLM-L6-v2}
if [ -f "$M/tokenizer.json" ]; then
    same "$(printf '101 7592 1010 2088 999 102\n101 29379 103 3347 102\n101 1469 30006 30021 102')" \
        "$MHA" tokenize --model "$M" "Hello, world!" "foo[MASK]bar" "한"
else
    echo "skip cli-tokenize real model: no $M/tokenizer.json (make model)"
fi
echo "cli-tokenize: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
