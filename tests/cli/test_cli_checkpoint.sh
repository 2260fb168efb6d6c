#!/bin/sh
# test_cli_checkpoint.sh - `mha train` checkpoints as one unit, resume rules,
# and outputs that survive a failed write (issue 12, defects 1, 2, 6):
#   * loss.tsv keeps its history: 30 steps then --resume to 40 gives 40 rows,
#     and --resume with --steps 10 (nothing to train) keeps all 30;
#   * the run's flags are stored: a --task sort run resumed without --task
#     trains on sort (said on stderr); --task reverse on resume is refused
#     naming both values;
#   * a model at step 40 beside the optimizer of step 20, a pair from two
#     runs, and a missing optimizer file are refused, naming both files;
#   * --save-every writes consistent checkpoints on the way: resuming the
#     step-20 checkpoint of a 40-step run gives the straight run's files
#     (equal but for the random run id);
#   * a write that fails (file size limit: EFBIG, no device needed) leaves
#     the previous checkpoint, loss.tsv and a forward --out .npy
#     byte-identical, and no temporary (FIFO targets: test_safe_write.c).
# Prints "cli-checkpoint: N passed, N failed".
. tests/cli/lib/common.sh
check() { if eval "$1"; then ok; else ko "$2"; fi; }
OPENBLAS_NUM_THREADS=1; export OPENBLAS_NUM_THREADS
SMALL="--dim 16 --heads 2 --ffn 16 --layers 1 --batch 4 --eval 8 --min-len 2 --max-len 4 --quiet"
# Two checkpoint files equal but for their run ids (random per fresh run).
same_but_run_id() {
    LC_ALL=C sed 's/"run_id":"[0-9a-f]*"/"run_id":""/' "$1" >"$T/cmp.a"
    LC_ALL=C sed 's/"run_id":"[0-9a-f]*"/"run_id":""/' "$2" >"$T/cmp.b"
    cmp -s "$T/cmp.a" "$T/cmp.b"
}
rows() { wc -l <"$1" | tr -d ' '; }

# ---- loss history across resumes ---------------------------------------------------------
"$MHA" train $SMALL --task sort --steps 30 --out "$T/h" >"$T/stdout" 2>"$T/e" || ko "train 30: $(cat "$T/e")"
check '[ "$(rows "$T/h/loss.tsv")" = 30 ]' "30 steps: loss.tsv has $(rows "$T/h/loss.tsv") rows"
cp "$T/h/loss.tsv" "$T/loss30"
"$MHA" train $SMALL --task sort --resume "$T/h" --out "$T/h" --steps 10 >"$T/stdout" 2>"$T/e"
check '[ $? -eq 0 ] && cmp -s "$T/h/loss.tsv" "$T/loss30"' \
    "resume --steps 10 of a 30-step run: loss.tsv has $(rows "$T/h/loss.tsv") rows, want the 30"
check 'grep -q "nothing to train" "$T/e"' "resume --steps 10: no note on stderr"
"$MHA" train --resume "$T/h" --out "$T/h" --steps 40 >"$T/stdout" 2>"$T/e" || ko "resume 40: $(cat "$T/e")"
check '[ "$(rows "$T/h/loss.tsv")" = 40 ] && head -n 30 "$T/h/loss.tsv" | cmp -s - "$T/loss30"' \
    "resume to 40: loss.tsv has $(rows "$T/h/loss.tsv") rows, want 30 old + 10 new"
check 'grep -q "checkpoint.s --task sort" "$T/e"' "resume without --task: stored task not announced"
check 'tail -n 1 "$T/h/loss.tsv" | grep -q "^40	"' "resume to 40: last row is not step 40"

# ---- conflicting flags -------------------------------------------------------------------
"$MHA" train --resume "$T/h" --out "$T/h" --steps 50 --task reverse >"$T/stdout" 2>"$T/e"; rc=$?
check '[ $rc -eq 2 ] && grep -q -- "--task reverse conflicts with the checkpoint.s --task sort" "$T/e"' \
    "conflicting --task: exit $rc, $(cat "$T/e")"
"$MHA" train --resume "$T/h" --out "$T/h" --steps 50 --batch 8 >"$T/stdout" 2>"$T/e"; rc=$?
check '[ $rc -eq 2 ] && grep -q -- "--batch 8 conflicts with the checkpoint.s --batch 4" "$T/e"' \
    "conflicting --batch: exit $rc, $(cat "$T/e")"
"$MHA" train --resume "$T/h" --out "$T/h" --steps 40 --task sort --batch 4 >"$T/stdout" 2>"$T/e"
check '[ $? -eq 0 ]' "agreeing flags on resume refused: $(cat "$T/e")"

# ---- a mismatched pair -------------------------------------------------------------------
"$MHA" train $SMALL --steps 20 --out "$T/a20" >"$T/stdout" 2>&1
"$MHA" train $SMALL --resume "$T/a20" --out "$T/a40" --steps 40 >"$T/stdout" 2>&1
cp "$T/a20/optimizer.safetensors" "$T/a40/optimizer.safetensors"
"$MHA" train $SMALL --resume "$T/a40" --out "$T/x" --steps 50 >"$T/stdout" 2>"$T/e"; rc=$?
check '[ $rc -ne 0 ] && grep -q "a40/model.safetensors (step 40" "$T/e" && grep -q "a40/optimizer.safetensors (step 20" "$T/e"' \
    "model 40 + optimizer 20: exit $rc, $(cat "$T/e")"
"$MHA" train $SMALL --steps 20 --seed 2 --out "$T/b20" >"$T/stdout" 2>&1
cp "$T/b20/optimizer.safetensors" "$T/a20/optimizer.safetensors"
"$MHA" train $SMALL --resume "$T/a20" --out "$T/x" --steps 50 >"$T/stdout" 2>"$T/e"; rc=$?
check '[ $rc -ne 0 ] && grep -q "not one checkpoint" "$T/e" && [ "$(grep -o "run [0-9a-f]*" "$T/e" | sort -u | wc -l)" = 2 ]' \
    "optimizer of another run: exit $rc, $(cat "$T/e")"
rm "$T/a20/optimizer.safetensors"
"$MHA" train --resume "$T/a20" --out "$T/x" --steps 50 >"$T/stdout" 2>"$T/e"; rc=$?
check '[ $rc -ne 0 ] && grep -q "a20/model.safetensors has no usable optimiser state" "$T/e"' \
    "missing optimizer: exit $rc, $(cat "$T/e")"

# ---- --save-every: consistent checkpoints on the way ------------------------------------------
"$MHA" train $SMALL --steps 40 --out "$T/straight" >"$T/stdout" 2>&1
"$MHA" train $SMALL --steps 40 --save-every 20 --out "$T/periodic" >"$T/stdout" 2>&1
for f in model optimizer; do
    check 'same_but_run_id "$T/straight/$f.safetensors" "$T/periodic/$f.safetensors"' \
        "--save-every 20 changes the final $f file"
done
# a run that stops after its step-20 save (its sample output path is a
# directory, so the run fails before the final save): the directory holds
# the step-20 checkpoint, and resuming it gives the straight run's files
mkdir -p "$T/cut/sample_tokens.npy"
"$MHA" train $SMALL --steps 40 --save-every 20 --out "$T/cut" >"$T/stdout" 2>"$T/e"; rc=$?
check '[ $rc -ne 0 ] && [ "$(rows "$T/cut/loss.tsv")" = 20 ] && [ -d "$T/cut/sample_tokens.npy" ]' \
    "the cut run: exit $rc, loss.tsv $(rows "$T/cut/loss.tsv") rows ($(cat "$T/e"))"
"$MHA" train --resume "$T/cut" --out "$T/resumed" --steps 40 >"$T/stdout" 2>"$T/e" || ko "resume cut: $(cat "$T/e")"
for f in model optimizer; do
    check 'same_but_run_id "$T/straight/$f.safetensors" "$T/resumed/$f.safetensors"' \
        "step-20 --save-every checkpoint + resume 20 != 40 straight ($f)"
done
check 'cmp -s "$T/straight/loss.tsv" "$T/resumed/loss.tsv"' "resumed loss.tsv differs from the straight run's"

# ---- failed writes change nothing --------------------------------------------------------
cp "$T/h/model.safetensors" "$T/model.before"; cp "$T/h/optimizer.safetensors" "$T/opt.before"
cp "$T/h/loss.tsv" "$T/loss.before"
# a 16 KB file size limit: the checkpoint write fails with EFBIG (SIGXFSZ ignored; no device)
(ulimit -f 16; trap '' XFSZ; exec "$MHA" train $SMALL --task sort --resume "$T/h" --out "$T/h" --steps 45) >"$T/stdout" 2>"$T/e"; rc=$?
check '[ $rc -ne 0 ] && grep -q "File too large" "$T/e"' "full disk during resume: exit $rc, $(cat "$T/e")"
for f in model.safetensors:model.before optimizer.safetensors:opt.before loss.tsv:loss.before; do
    check 'cmp -s "$T/h/${f%%:*}" "$T/${f#*:}"' "full disk during resume changed ${f%%:*}"
done
check '[ -z "$(ls -a "$T/h" | grep mha-tmp)" ]' "failed checkpoint left a temporary: $(ls -a "$T/h")"
"$MHA" train --resume "$T/h" --out "$T/h" --steps 40 >"$T/stdout" 2>"$T/e"
check '[ $? -eq 0 ]' "the checkpoint kept after a failed write does not resume: $(cat "$T/e")"

# mha forward --out over a good y.npy with the disk full: y.npy is kept
d=tests/fixtures/cli/fwd_f16_query
(cd "$d" && "$MHA" $(cat args) --out "$T/y.npy") 2>"$T/e" || ko "forward: $(cat "$T/e")"
cp "$T/y.npy" "$T/y.before"
(cd "$d" && ulimit -f 0 && trap '' XFSZ && exec "$MHA" $(cat args) --out "$T/y.npy") 2>"$T/e"; rc=$?
check '[ $rc -ne 0 ] && cmp -s "$T/y.npy" "$T/y.before" && [ -z "$(ls -a "$T" | grep mha-tmp)" ]' \
    "forward --out over y.npy with a full disk: exit $rc, y.npy changed or a temporary left"

echo "cli-checkpoint: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
