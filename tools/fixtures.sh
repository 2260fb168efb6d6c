#!/bin/sh
# fixtures.sh - `make fixtures`: runs every generator of the committed test
# fixtures, each with the Python it needs.  The tests never run them (the
# outputs are committed); run this after changing a generator and commit the
# diff.  A generator whose modules are missing is reported and skipped; one
# that fails fails the run.
#   sh tools/fixtures.sh          run them all
#   sh tools/fixtures.sh --list   only say what each needs
# Debian's Python (/usr/bin/python3) has torch 1.13 and numpy from apt
# (python3-torch python3-numpy); the ONNX converter needs pip's `onnx` in
# the python3 first on PATH.
DEBIAN=/usr/bin/python3
list=0; [ "${1:-}" = --list ] && list=1
status=0
# generator | python | modules it imports | what it writes
gens="tests/fixtures/gen_fixtures.py|$DEBIAN|torch numpy|tests/fixtures/mha, sdpa (parity)
tests/fixtures/gen_layer_fixtures.py|$DEBIAN|torch numpy|tests/fixtures/layers
tests/fixtures/gen_grad_fixtures.py|$DEBIAN|torch numpy|tests/fixtures/grad_mha, grad_sdpa
tests/fixtures/gen_layer_grad_fixtures.py|$DEBIAN|torch numpy|tests/fixtures/adamw, layer_grad
tests/fixtures/gen_cli_fixtures.py|$DEBIAN|torch numpy|tests/fixtures/cli
tests/fixtures/io/gen_io_fixtures.py|$DEBIAN|numpy|tests/fixtures/io (NumPy-written .npy)
tests/corpus/make_corpus.py|$DEBIAN||tests/corpus (malformed files, expected.txt)
tests/onnx/convert_onnx_cases.py tests/onnx/cases --seed 0|python3|onnx numpy|tests/onnx/cases (ONNX backend cases, seed 0)"
printf '%s\n' "$gens" | {
while IFS='|' read -r cmd py mods what; do
    need="${mods:-standard library only}"
    if [ "$list" = 1 ]; then
        printf 'fixtures: %-58s %s (%s) -> %s\n' "$cmd" "$py" "$need" "$what"
        continue
    fi
    missing=""
    for m in $mods; do "$py" -c "import $m" 2>/dev/null || missing="$missing $m"; done
    if [ -n "$missing" ]; then
        echo "fixtures: SKIPPED $cmd: $py lacks$missing"
        continue
    fi
    echo "fixtures: $py $cmd"
    # shellcheck disable=SC2086
    if ! "$py" $cmd >/dev/null; then echo "fixtures: FAILED $cmd"; status=1; fi
done
exit $status
}
