#!/bin/sh
# test_cli_train.sh - `mha train`.
#   * THE ACCURACY CHECKS: fixed seeded runs (seed 1, default model, 1
#     thread; 150 steps bidirectional, 300 steps --causal decoder-only) must
#     reach exact-token accuracy >= 0.95 on the 500 held-out sequences; only
#     the accuracy is checked, never the time.
#   * resumption: 40 steps straight and 20 + --resume 20 give byte-identical
#     checkpoints (model and optimizer files) but for their random run ids;
#   * the checkpoint loads with a STRICT load_state_dict into the matching
#     PyTorch module and reproduces mha's logits (train_pytorch.py; skipped
#     when /usr/bin/python3 lacks torch);
#   * the loss curve SVG, --help and argument errors.
# Prints "cli-train: N passed, N failed".
. tests/cli/lib/common.sh
# small GEMMs: OpenBLAS's own threads only add overhead here
OPENBLAS_NUM_THREADS=1; export OPENBLAS_NUM_THREADS

# ---- the accuracy check (fixed steps and seed) ------------------------------------------
if "$MHA" train --steps 150 --seed 1 --threads 1 --eval 500 --quiet --out "$T/acc" >"$T/acc.out" 2>"$T/acc.err"; then
    acc=$(sed -n 's/^accuracy: //p' "$T/acc.out")
    if awk -v a="$acc" 'BEGIN { exit !(a >= 0.95) }'; then ok
    else ko "mha train --steps 150 --seed 1: accuracy '$acc' < 0.95"; fi
    echo "ok train accuracy $acc after 150 steps"
else
    ko "mha train --steps 150: exit $? $(tail -c 300 "$T/acc.err")"
fi
# the decoder-only form (--causal: next-token prediction of "digits SEP answer"):
# seed 1, 300 steps, accuracy >= 0.95 on the answers (teacher forced)
if "$MHA" train --causal --steps 300 --seed 1 --threads 1 --eval 500 --quiet --out "$T/causal" >"$T/c.out" 2>"$T/c.err"; then
    acc=$(sed -n 's/^accuracy: //p' "$T/c.out")
    if awk -v a="$acc" 'BEGIN { exit !(a >= 0.95) }'; then ok
    else ko "mha train --causal --steps 300 --seed 1: accuracy '$acc' < 0.95"; fi
    echo "ok train --causal accuracy $acc after 300 steps"
else
    ko "mha train --causal --steps 300: exit $? $(tail -c 300 "$T/c.err")"
fi
for f in model.safetensors optimizer.safetensors loss.svg loss.tsv sample_tokens.npy sample_logits.npy; do
    if [ -s "$T/acc/$f" ]; then ok; else ko "missing $T/acc/$f"; fi
done
if grep -q "<polyline" "$T/acc/loss.svg" && [ "$(wc -l < "$T/acc/loss.tsv")" -eq 150 ]; then ok
else ko "loss curve: svg polyline and 150 loss lines"; fi
if grep -q "loss.png" "$T/acc.out"; then   # builds with libpng
    if [ "$(head -c 4 "$T/acc/loss.png" | od -An -c | tr -d ' ')" = "211PNG" ]; then ok
    else ko "loss.png is not a PNG"; fi
else
    echo "cli-train: loss.png check skipped (built without libpng)"
fi

# Two checkpoint files equal but for their run ids (random per fresh run).
same_but_run_id() {
    LC_ALL=C sed 's/"run_id":"[0-9a-f]*"/"run_id":""/' "$1" >"$T/cmp.a"
    LC_ALL=C sed 's/"run_id":"[0-9a-f]*"/"run_id":""/' "$2" >"$T/cmp.b"
    cmp -s "$T/cmp.a" "$T/cmp.b"
}

# ---- bit-identical resumption (with dropout, a causal stack and clipping) ------------------
common="--seed 7 --threads 1 --eval 50 --quiet --dim 24 --ffn 40 --heads 3 --dropout 0.1 --causal"
"$MHA" train --steps 40 $common --out "$T/straight" >/dev/null 2>"$T/r.err" || ko "straight run: $(cat "$T/r.err")"
"$MHA" train --steps 20 $common --out "$T/half" >/dev/null 2>"$T/r.err" || ko "half run: $(cat "$T/r.err")"
"$MHA" train --steps 40 $common --resume "$T/half" --out "$T/resumed" >/dev/null 2>"$T/r.err" || ko "resumed run: $(cat "$T/r.err")"
for f in model.safetensors optimizer.safetensors loss.tsv; do
    if same_but_run_id "$T/straight/$f" "$T/resumed/$f"; then ok
    else ko "resume: $f differs from the straight run"; fi
done

# ---- PyTorch: strict load_state_dict and the logits ------------------------------------------
if /usr/bin/python3 -c "import torch, numpy" 2>/dev/null; then
    for d in acc straight; do
        out=$(/usr/bin/python3 tests/cli/train_pytorch.py "$T/$d" 2>&1)
        printf '%s\n' "$out" | grep '^FAIL'
        p=$(printf '%s\n' "$out" | sed -n 's/^train-pytorch: \([0-9]*\) passed.*/\1/p')
        f=$(printf '%s\n' "$out" | sed -n 's/^train-pytorch: .* \([0-9]*\) failed$/\1/p')
        if [ -n "$p" ]; then pass=$((pass + p)); fail=$((fail + f))
        else ko "train_pytorch.py gave no result: $(printf '%s' "$out" | tail -n 3)"; fi
    done
else
    echo "ok skipped: /usr/bin/python3 with torch not available"
fi

# ---- help and errors --------------------------------------------------------------------------
if "$MHA" train --help >"$T/h" 2>&1 && grep -q "usage: mha train" "$T/h"; then ok; else ko "--help"; fi
expect 2 "unknown or incomplete option" "$MHA" train --bogus
expect 2 "--steps wants an integer" "$MHA" train --steps -3
expect 2 "--task wants reverse or sort" "$MHA" train --task copy
expect 2 "heads" "$MHA" train --steps 1 --heads 5 --out "$T/bad"
expect 2 "--min-len 9 exceeds --max-len 4" "$MHA" train --min-len 9 --max-len 4
expect 2 "model.safetensors" "$MHA" train --resume "$T/nowhere" --out "$T/x"

echo "cli-train: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
