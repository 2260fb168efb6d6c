#!/usr/bin/env python3
"""Writes the malformed-file corpus and its table of expected errors.

    python3 tests/corpus/make_corpus.py

tests/corpus/npy/*.npy and tests/corpus/safetensors/*.safetensors are each
rejected by mha with the status and message substring listed in
tests/corpus/expected.txt ("DIR/FILE STATUS substring").  Checked by
tests/unit/test_io_corpus.c and, through the command line, by
tests/cli/test_cli_io.sh; replayed by the fuzz targets.  Plain python3,
no third-party modules; deterministic.
"""
import json
import os
import shutil
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
table = []


def put(sub, name, data, status, needle):
    d = os.path.join(HERE, sub)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), 'wb') as f:
        f.write(data)
    table.append('%s/%s %s %s' % (sub, name, status, needle))


# ---- .npy ------------------------------------------------------------------

def npy(header, data=b'', version=(1, 0), hlen=None):
    """A .npy with the given header text (padded as numpy does)."""
    h = header.encode('latin1')
    pre = 10 if version[0] == 1 else 12
    pad = 64 - (pre + len(h) + 1) % 64
    h = h + b' ' * pad + b'\n'
    n = len(h) if hlen is None else hlen
    size = struct.pack('<H', n) if version[0] == 1 else struct.pack('<I', n)
    return b'\x93NUMPY' + bytes(version) + size + h + data


def hdr(descr="'<f4'", fortran='False', shape='(3, 4)'):
    return "{'descr': %s, 'fortran_order': %s, 'shape': %s, }" % (descr, fortran, shape)


F48 = struct.pack('<12f', *range(12))
good = npy(hdr(), F48)

put('npy', 'empty.npy', b'', 'FORMAT', 'too short')
put('npy', 'magic_only.npy', b'\x93NUMPY', 'FORMAT', 'too short')
put('npy', 'bad_magic.npy', b'\x93NUMPZ' + good[6:], 'FORMAT', 'bad magic')
put('npy', 'text_file.npy', b'hello, this is not numpy data at all\n', 'FORMAT', 'bad magic')
put('npy', 'version_4_0.npy', good[:6] + b'\x04\x00' + good[8:], 'FORMAT', 'version 4.0')
put('npy', 'version_1_1.npy', good[:6] + b'\x01\x01' + good[8:], 'FORMAT', 'version 1.1')
put('npy', 'version_0_0.npy', good[:6] + b'\x00\x00' + good[8:], 'FORMAT', 'version 0.0')
put('npy', 'hlen_huge_v2.npy', b'\x93NUMPY\x02\x00' + struct.pack('<I', 0xFFFFFFFF) + b'{}',
    'FORMAT', 'exceeds')
put('npy', 'hlen_past_eof.npy', good[:8] + struct.pack('<H', 60000) + good[10:], 'FORMAT',
    'truncated')
put('npy', 'hlen_zero.npy', good[:8] + b'\x00\x00' + good[10:], 'FORMAT', "start with '{'")
put('npy', 'hlen_v2_cut.npy', b'\x93NUMPY\x02\x00\x10\x00\x00', 'FORMAT', 'truncated')
put('npy', 'truncated_prefix.npy', good[:9], 'FORMAT', 'too short')
put('npy', 'truncated_header.npy', good[:40], 'FORMAT', 'truncated')
put('npy', 'truncated_data.npy', good[:-7], 'FORMAT', 'truncated')
put('npy', 'truncated_no_data.npy', good[:128], 'FORMAT', 'truncated')
put('npy', 'trailing_bytes.npy', good + b'\0' * 5, 'FORMAT', 'trailing bytes')
put('npy', 'header_list.npy', npy('[1, 2, 3]'), 'FORMAT', "start with '{'")
put('npy', 'missing_shape.npy', npy("{'descr': '<f4', 'fortran_order': False}"), 'FORMAT',
    'missing key shape')
put('npy', 'extra_key.npy', npy(hdr()[:-1] + "'x': 1, }", F48), 'FORMAT', "unknown key 'x'")
put('npy', 'duplicate_key.npy', npy(hdr()[:-1] + "'descr': '<f4', }", F48), 'FORMAT',
    'duplicate key descr')
put('npy', 'fortran_not_bool.npy', npy(hdr(fortran='0'), F48), 'FORMAT', 'fortran_order')
put('npy', 'shape_list.npy', npy(hdr(shape='[3, 4]'), F48), 'FORMAT', 'not a tuple')
put('npy', 'shape_not_tuple.npy', npy(hdr(shape='(12)'), F48), 'FORMAT', 'not a tuple')
put('npy', 'shape_negative.npy', npy(hdr(shape='(-3, 4)'), F48), 'FORMAT', 'negative')
put('npy', 'shape_float.npy', npy(hdr(shape='(3.0, 4)'), F48), 'FORMAT', "expected ','")
put('npy', 'shape_name.npy', npy(hdr(shape='(n, 4)'), F48), 'FORMAT', 'is not a size')
put('npy', 'shape_huge_digits.npy', npy(hdr(shape='(99999999999999999999,)')), 'OVERFLOW',
    '64 bits')
put('npy', 'shape_product_overflow.npy', npy(hdr(shape='(4294967296, 4294967296)')),
    'OVERFLOW', 'overflows')
put('npy', 'shape_bytes_overflow.npy', npy(hdr(shape='(3037000499, 3037000499)')),
    'OVERFLOW', 'overflows')
put('npy', 'shape_absurd.npy', npy(hdr(shape='(1000000000000,)'), F48), 'FORMAT',
    'truncated: shape needs')
put('npy', 'too_many_dims.npy', npy(hdr(shape='(1, 1, 1, 1, 12)'), F48), 'UNSUPPORTED',
    'more than 4')
put('npy', 'big_endian.npy', npy(hdr(descr="'>f4'"), F48), 'UNSUPPORTED', 'big-endian')
put('npy', 'object_pickle.npy', npy(hdr(descr="'|O'"), b'\x80\x04N.'), 'UNSUPPORTED', 'object')
put('npy', 'structured.npy', npy(hdr(descr="[('a', '<f4')]"), F48), 'UNSUPPORTED',
    'structured')
put('npy', 'complex.npy', npy(hdr(descr="'<c8'", shape='(6,)'), F48), 'UNSUPPORTED',
    "'<c8' is not supported")
put('npy', 'unterminated_dict.npy', npy("{'descr': '<f4', 'fortran_order': False"), 'FORMAT',
    "expected ',' or '}'")
put('npy', 'unterminated_string.npy', npy("{'descr: '<f4'}"), 'FORMAT', "expected ':'")
put('npy', 'text_after_dict.npy', npy(hdr() + ' x', F48), 'FORMAT', 'text after the dict')
put('npy', 'nul_in_header.npy', npy(hdr(descr="'<f\x004'"), F48), 'FORMAT',
    'unsupported character')
put('npy', 'header_v2_short.npy', npy(hdr(), F48, version=(2, 0), hlen=20), 'FORMAT',
    'bad .npy header')

# Headers cut exactly where a parser step looks for the next character
# (no padding), and the remaining header branches (tests/unit/test_io_branches.c
# covers the accepted spellings).
def npy_raw(text):
    t = text.encode('latin1')
    return b'\x93NUMPY\x01\x00' + struct.pack('<H', len(t)) + t


put('npy', 'ws_tab_cr_missing_shape.npy',
    npy("{\t'descr':\r'<f4',\r\n'fortran_order':\tFalse}"), 'FORMAT', 'missing key shape')
put('npy', 'missing_descr.npy', npy("{'fortran_order': False, 'shape': (3, 4), }"), 'FORMAT',
    'missing key descr')
put('npy', 'missing_fortran.npy', npy("{'descr': '<f4', 'shape': (3, 4), }"), 'FORMAT',
    'missing key fortran_order')
put('npy', 'key_unquoted.npy', npy("{descr: '<f4'}"), 'FORMAT', 'expected a quoted key')
put('npy', 'key_backslash.npy', npy("{'de\\scr': '<f4'}"), 'FORMAT',
    'unsupported character in key')
put('npy', 'key_too_long.npy', npy("{'%s': 1}" % ('k' * 40)), 'FORMAT', 'key too long')
put('npy', 'descr_unquoted.npy', npy("{'descr': f4}"), 'FORMAT', 'expected a quoted descr')
put('npy', 'descr_unterminated.npy', npy_raw("{'descr': '<f4"), 'FORMAT', 'unterminated descr')
put('npy', 'duplicate_fortran.npy', npy(hdr()[:-1] + "'fortran_order': False, }", F48),
    'FORMAT', 'duplicate key fortran_order')
put('npy', 'duplicate_shape.npy', npy(hdr()[:-1] + "'shape': (3, 4), }", F48), 'FORMAT',
    'duplicate key shape')
put('npy', 'cut_after_brace.npy', npy_raw("{"), 'FORMAT', 'unterminated dict')
put('npy', 'cut_after_comma.npy', npy_raw("{'descr': '<f4',"), 'FORMAT', 'unterminated dict')
put('npy', 'cut_after_key.npy', npy_raw("{'descr'"), 'FORMAT', "expected ':' after 'descr'")
put('npy', 'cut_after_colon.npy', npy_raw("{'descr':"), 'UNSUPPORTED', 'descr')
put('npy', 'cut_after_value.npy', npy_raw("{'descr': '<f4'"), 'FORMAT',
    "expected ',' or '}' after 'descr'")
put('npy', 'junk_after_value.npy', npy("{'descr': '<f4' x}"), 'FORMAT',
    "expected ',' or '}' after 'descr'")
put('npy', 'cut_in_bool.npy', npy_raw("{'fortran_order': Tru"), 'FORMAT', 'fortran_order')
put('npy', 'cut_before_shape.npy', npy_raw("{'shape':"), 'FORMAT', 'shape is not a tuple')
put('npy', 'cut_in_shape.npy', npy_raw("{'shape': (3,"), 'FORMAT', 'unterminated shape')
put('npy', 'cut_in_digits.npy', npy_raw("{'shape': (3"), 'FORMAT', "expected ',' or ')'")
put('npy', 'shape_letter_after_digits.npy', npy(hdr(shape='(3a, 4)'), F48), 'FORMAT',
    "expected ',' or ')'")
put('npy', 'shape_plus.npy', npy(hdr(shape='(+3, 4)'), F48), 'FORMAT', "'+' is not a size")
put('npy', 'shape_2_pow_63.npy', npy(hdr(shape='(9223372036854775808,)')), 'OVERFLOW',
    '64 bits')

# ---- safetensors --------------------------------------------------------------


def st_raw(header_bytes, data=b'', hlen=None):
    n = len(header_bytes) if hlen is None else hlen
    return struct.pack('<Q', n) + header_bytes + data


def st(header, data=b''):
    return st_raw(json.dumps(header, separators=(',', ':')).encode(), data)


def ent(dtype='F32', shape=(2, 3), off=(0, 24)):
    return {'dtype': dtype, 'shape': list(shape), 'data_offsets': list(off)}


D24 = struct.pack('<6f', *range(6))
D48 = D24 + D24
S = 'safetensors'
good_st = st({'a': ent()}, D24)

put(S, 'empty.safetensors', b'', 'FORMAT', 'shorter than the 8-byte')
put(S, 'five_bytes.safetensors', b'\x10\0\0\0\0', 'FORMAT', 'shorter than the 8-byte')
put(S, 'hlen_huge.safetensors', struct.pack('<Q', 1 << 63) + b'{}', 'FORMAT', '100,000,000')
put(S, 'hlen_just_over_cap.safetensors', struct.pack('<Q', 100000001) + b'{}', 'FORMAT',
    '100,000,000')
put(S, 'hlen_past_eof.safetensors', st_raw(b'{"a":{}}', hlen=1000), 'FORMAT', 'truncated')
put(S, 'hlen_zero.safetensors', st_raw(b'', hlen=0), 'FORMAT', 'too small')
put(S, 'hlen_one.safetensors', st_raw(b'{'), 'FORMAT', 'too small')
put(S, 'truncated_header.safetensors', good_st[:30], 'FORMAT', 'truncated')
put(S, 'truncated_data.safetensors', good_st[:-4], 'FORMAT', 'past the data section')
put(S, 'not_json.safetensors', st_raw(b'garbage!'), 'FORMAT', 'bad safetensors header JSON')
put(S, 'header_array.safetensors', st_raw(b'[1,2,3] '), 'FORMAT', "expected '{'")
put(S, 'json_cut.safetensors', st_raw(b'{"a":{"dtype":"F32",'), 'FORMAT',
    'bad safetensors header JSON')
put(S, 'text_after.safetensors', st_raw(b'{} {}'), 'FORMAT', 'text after the closing')
put(S, 'offsets_past_end.safetensors', st({'a': ent(off=(0, 24))}, D24[:16]), 'FORMAT',
    'past the data section')
put(S, 'offsets_reversed.safetensors', st({'a': ent(shape=(0,), off=(24, 0))}, D24), 'FORMAT',
    'end before they begin')
put(S, 'overlap.safetensors', st({'a': ent(), 'b': ent()}, D24), 'FORMAT', 'overlapping')
put(S, 'overlap_partial.safetensors',
    st({'a': ent(), 'b': ent(off=(16, 40)), 'c': ent(shape=(2,), off=(40, 48))}, D48),
    'FORMAT', 'overlapping')
put(S, 'hole.safetensors', st({'a': ent(), 'b': ent(off=(28, 52))}, D48 + b'\0' * 4), 'FORMAT',
    'hole')
put(S, 'first_not_zero.safetensors', st({'a': ent(off=(8, 32))}, b'\0' * 8 + D24), 'FORMAT',
    'hole')
put(S, 'trailing_bytes.safetensors', st({'a': ent()}, D24 + b'\0' * 8), 'FORMAT',
    'trailing bytes')
put(S, 'unindexed_data.safetensors', st({}, D24), 'FORMAT', 'not indexed')
put(S, 'shape_bytes_mismatch.safetensors', st({'a': ent(shape=(2, 2))}, D24), 'FORMAT',
    'needs 16')
put(S, 'dtype_bytes_mismatch.safetensors', st({'a': ent(dtype='F16')}, D24), 'FORMAT',
    'needs 12')
put(S, 'unknown_dtype.safetensors', st({'a': ent(dtype='F7')}, D24), 'FORMAT',
    "unknown dtype 'F7'")
put(S, 'dtype_number.safetensors', st({'a': {'dtype': 4, 'shape': [6], 'data_offsets': [0, 24]}},
                                      D24), 'FORMAT', 'expected a string for dtype')
put(S, 'duplicate_name.safetensors',
    st_raw(b'{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},'
           b'"a":{"dtype":"F32","shape":[3],"data_offsets":[12,24]}}', D24),
    'FORMAT', "duplicate tensor name 'a'")
put(S, 'duplicate_field.safetensors',
    st_raw(b'{"a":{"dtype":"F32","dtype":"F16","shape":[6],"data_offsets":[0,24]}}', D24),
    'FORMAT', "duplicate key 'dtype'")
put(S, 'duplicate_metadata.safetensors',
    st_raw(b'{"__metadata__":{},"__metadata__":{}}'), 'FORMAT', 'duplicate __metadata__')
put(S, 'duplicate_metadata_key.safetensors',
    st_raw(b'{"__metadata__":{"k":"1","k":"2"}}'), 'FORMAT', "duplicate key 'k'")
put(S, 'missing_offsets.safetensors', st({'a': {'dtype': 'F32', 'shape': [6]}}, D24), 'FORMAT',
    'missing data_offsets')
put(S, 'missing_dtype.safetensors', st({'a': {'shape': [6], 'data_offsets': [0, 24]}}, D24),
    'FORMAT', 'missing dtype')
put(S, 'empty_entry.safetensors', st({'a': {}}), 'FORMAT', 'empty tensor entry')
put(S, 'entry_not_object.safetensors', st({'a': 5}), 'FORMAT', "expected '{'")
put(S, 'unknown_field.safetensors',
    st({'a': dict(ent(shape=(6,)), extra=1)}, D24), 'FORMAT', "unknown key 'extra'")
put(S, 'shape_negative.safetensors', st({'a': ent(shape=(-6,))}, D24), 'FORMAT', 'negative')
put(S, 'shape_float.safetensors', st_raw(b'{"a":{"dtype":"F32","shape":[6.0],'
                                         b'"data_offsets":[0,24]}}', D24), 'FORMAT',
    'not an integer')
put(S, 'offset_exponent.safetensors', st_raw(b'{"a":{"dtype":"F32","shape":[6],'
                                             b'"data_offsets":[0,2.4e1]}}', D24), 'FORMAT',
    'not an integer')
put(S, 'offset_leading_zero.safetensors', st_raw(b'{"a":{"dtype":"F32","shape":[6],'
                                                 b'"data_offsets":[00,24]}}', D24), 'FORMAT',
    'leading zero')
put(S, 'offset_huge.safetensors', st_raw(b'{"a":{"dtype":"F32","shape":[6],'
                                         b'"data_offsets":[0,99999999999999999999]}}', D24),
    'OVERFLOW', '63 bits')
put(S, 'offset_negative.safetensors', st({'a': ent(off=(-24, 0))}, D24), 'FORMAT', 'negative')
put(S, 'offsets_three.safetensors', st({'a': ent(off=(0, 12, 24))}, D24), 'FORMAT',
    'more than 2')
put(S, 'offsets_one.safetensors', st({'a': ent(off=(24,))}, D24), 'FORMAT', 'needs 2 integers')
put(S, 'shape_product_overflow.safetensors',
    st({'a': ent(shape=(1 << 32, 1 << 32, 1 << 32))}, D24), 'OVERFLOW', 'overflows')
put(S, 'shape_bytes_overflow.safetensors',
    st({'a': ent(dtype='F64', shape=(1 << 31, 1 << 31, 4))}, D24), 'OVERFLOW', 'overflows')
put(S, 'shape_zero_wrap.safetensors',
    st({'a': ent(shape=(1 << 62, 4))}, D24), 'OVERFLOW', 'overflows')
put(S, 'too_many_dims.safetensors', st({'a': ent(shape=(1,) * 9)}, D24), 'FORMAT',
    'more than 8')
put(S, 'metadata_number.safetensors', st({'__metadata__': {'k': 1}}), 'FORMAT',
    'is not a string')
put(S, 'metadata_nested.safetensors', st({'__metadata__': {'k': [[[[[]]]]]}}), 'FORMAT',
    'is not a string')
put(S, 'bad_utf8_name.safetensors', st_raw(b'{"a\xff":{"dtype":"F32","shape":[6],'
                                           b'"data_offsets":[0,24]}}', D24), 'FORMAT', 'UTF-8')
put(S, 'overlong_utf8.safetensors', st_raw(b'{"\xc0\xaf":{}}'), 'FORMAT', 'UTF-8')
put(S, 'bad_escape.safetensors', st_raw(b'{"a\\x":{}}'), 'FORMAT', 'bad escape')
put(S, 'lone_surrogate.safetensors', st_raw(b'{"\\ud800":{}}'), 'FORMAT', 'surrogate')
put(S, 'nul_escape.safetensors', st_raw(b'{"a\\u0000":{}}'), 'FORMAT', 'NUL')
put(S, 'control_char.safetensors', st_raw(b'{"a\n":{}}'), 'FORMAT', 'control character')
put(S, 'unterminated_string.safetensors', st_raw(b'{"abc'), 'FORMAT', 'unterminated string')

# Headers cut where the JSON parser looks for its next token, and the
# remaining string, escape, UTF-8 and integer branches.
E6 = b'"dtype":"F32","shape":[6],"data_offsets":[0,24]'
put(S, 'ws_tab_cr_nl.safetensors', st_raw(b'{\t"a"\r:\n{' + E6 + b'}\t,\r\n"a":{' + E6 + b'}}',
                                          D24), 'FORMAT', "duplicate tensor name 'a'")
put(S, 'cut_after_name.safetensors', st_raw(b'{"a":  '), 'FORMAT', "expected '{' to open")
put(S, 'cut_header_spaces.safetensors', st_raw(b'{  '), 'FORMAT', 'expected a string')
put(S, 'name_no_colon.safetensors', st_raw(b'{"a" x}'), 'FORMAT', "expected ':' after a tensor")
put(S, 'cut_after_entry.safetensors', st_raw(b'{"a":{' + E6 + b'}'), 'FORMAT',
    "expected ',' or '}' after an entry")
put(S, 'junk_after_entry.safetensors', st_raw(b'{"a":{' + E6 + b'} x}'), 'FORMAT',
    "expected ',' or '}' after an entry")
put(S, 'cut_in_entry.safetensors', st_raw(b'{"a":{'), 'FORMAT', 'expected a string')
put(S, 'field_no_colon.safetensors', st_raw(b'{"a":{"dtype" x}}'), 'FORMAT',
    "expected ':' after a tensor key")
put(S, 'cut_after_field.safetensors', st_raw(b'{"a":{"dtype":"F32"'), 'FORMAT',
    "expected ',' or '}'")
put(S, 'junk_after_field.safetensors', st_raw(b'{"a":{"dtype":"F32" x}}'), 'FORMAT',
    "expected ',' or '}'")
put(S, 'missing_shape.safetensors', st({'a': {'dtype': 'F32', 'data_offsets': [0, 24]}}, D24),
    'FORMAT', 'missing shape')
put(S, 'shape_not_array.safetensors', st({'a': {'dtype': 'F32', 'shape': 6,
                                                'data_offsets': [0, 24]}}, D24),
    'FORMAT', "expected '[' shape")
put(S, 'offsets_empty.safetensors', st({'a': ent(shape=(6,), off=())}, D24), 'FORMAT',
    'needs 2 integers')
put(S, 'cut_in_array.safetensors', st_raw(b'{"a":{"shape":['), 'FORMAT',
    'negative or missing')
put(S, 'cut_in_integer.safetensors', st_raw(b'{"a":{"shape":[12'), 'FORMAT',
    "expected ',' or ']'")
put(S, 'cut_after_zero.safetensors', st_raw(b'{"a":{"shape":[0'), 'FORMAT',
    "expected ',' or ']'")
put(S, 'junk_in_array.safetensors', st_raw(b'{"a":{"shape":[1 x]}}'), 'FORMAT',
    "expected ',' or ']'")
put(S, 'shape_plus.safetensors', st_raw(b'{"a":{"shape":[+1]}}'), 'FORMAT', 'not an integer')
put(S, 'shape_letter.safetensors', st_raw(b'{"a":{"shape":[a]}}'), 'FORMAT', 'not an integer')
put(S, 'offset_exponent_e.safetensors', st_raw(b'{"a":{"shape":[1e2]}}'), 'FORMAT',
    'not an integer')
put(S, 'offset_exponent_E.safetensors', st_raw(b'{"a":{"shape":[1E2]}}'), 'FORMAT',
    'not an integer')
put(S, 'offset_2_pow_63.safetensors', st_raw(b'{"a":{"shape":[9223372036854775808]}}'),
    'OVERFLOW', '63 bits')
put(S, 'metadata_not_object.safetensors', st_raw(b'{"__metadata__":5}'), 'FORMAT',
    "expected '{' to open __metadata__")
put(S, 'metadata_cut.safetensors', st_raw(b'{"__metadata__":{'), 'FORMAT',
    'expected a string for a __metadata__ key')
put(S, 'metadata_key_number.safetensors', st_raw(b'{"__metadata__":{5:"x"}}'), 'FORMAT',
    'expected a string for a __metadata__ key')
put(S, 'metadata_no_colon.safetensors', st_raw(b'{"__metadata__":{"k" "x"}}'), 'FORMAT',
    "expected ':' after a __metadata__ key")
put(S, 'metadata_cut_value.safetensors', st_raw(b'{"__metadata__":{"k":'), 'FORMAT',
    'is not a string')
put(S, 'metadata_value_cut.safetensors', st_raw(b'{"__metadata__":{"k":"abc'), 'FORMAT',
    'unterminated string in a __metadata__ value')
put(S, 'metadata_cut_after.safetensors', st_raw(b'{"__metadata__":{"k":"v"'), 'FORMAT',
    "__metadata__: bad JSON")
put(S, 'metadata_junk_after.safetensors', st_raw(b'{"__metadata__":{"k":"v" x}}'), 'FORMAT',
    "__metadata__: bad JSON")
put(S, 'escape_cut.safetensors', st_raw(b'{"a\\'), 'FORMAT', 'truncated escape')
put(S, 'escape_nul.safetensors', st_raw(b'{"a\\\0":{}}'), 'FORMAT', 'bad escape')
put(S, 'escape_u_cut.safetensors', st_raw(b'{"\\u12'), 'FORMAT', 'truncated \\u escape')
put(S, 'escape_u_bad_hex.safetensors', st_raw(b'{"\\u00g0":{}}'), 'FORMAT', 'bad \\u escape')
put(S, 'escape_u_bad_hex_punct.safetensors', st_raw(b'{"\\u00:0":{}}'), 'FORMAT',
    'bad \\u escape')
put(S, 'escape_u_bad_hex_upper.safetensors', st_raw(b'{"\\u00G0":{}}'), 'FORMAT',
    'bad \\u escape')
put(S, 'surrogate_low_first.safetensors', st_raw(b'{"\\udc00\\udc00":{}}'), 'FORMAT',
    'surrogate')
put(S, 'surrogate_cut.safetensors', st_raw(b'{"\\ud800'), 'FORMAT', 'surrogate')
put(S, 'surrogate_then_other_escape.safetensors', st_raw(b'{"\\ud800\\n":{}}'), 'FORMAT',
    'surrogate')
put(S, 'surrogate_then_bmp.safetensors', st_raw(b'{"\\ud800\\u0041":{}}'), 'FORMAT',
    'surrogate')
put(S, 'surrogate_then_high.safetensors', st_raw(b'{"\\ud800\\ud800":{}}'), 'FORMAT',
    'surrogate')
put(S, 'surrogate_then_e000.safetensors', st_raw(b'{"\\ud800\\ue000":{}}'), 'FORMAT',
    'surrogate')
put(S, 'utf8_cut_at_end.safetensors', st_raw(b'{"\xf0\x9f'), 'FORMAT', 'UTF-8')
put(S, 'utf8_bad_continuation.safetensors', st_raw(b'{"\xe2\x28\xa1":{}}'), 'FORMAT', 'UTF-8')
put(S, 'utf8_overlong_3.safetensors', st_raw(b'{"\xe0\x80\xaf":{}}'), 'FORMAT', 'UTF-8')
put(S, 'utf8_surrogate.safetensors', st_raw(b'{"\xed\xa0\x80":{}}'), 'FORMAT', 'UTF-8')
put(S, 'utf8_above_10ffff.safetensors', st_raw(b'{"\xf4\x90\x80\x80":{}}'), 'FORMAT', 'UTF-8')
put(S, 'utf8_overlong_4.safetensors', st_raw(b'{"\xf0\x80\x80\xaf":{}}'), 'FORMAT', 'UTF-8')
put(S, 'shape_bytes_overflow_only.safetensors',
    st({'a': ent(dtype='F64', shape=(1 << 61,))}, D24), 'OVERFLOW', 'overflows')
put(S, 'duplicate_name_of_three.safetensors',
    st_raw(b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
           b'"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},'
           b'"b":{"dtype":"F32","shape":[2],"data_offsets":[16,24]}}', D24),
    'FORMAT', "duplicate tensor name 'a'")

with open(os.path.join(HERE, 'expected.txt'), 'w') as f:
    f.write('# FILE STATUS message-substring   (written by make_corpus.py)\n')
    f.write('\n'.join(table) + '\n')

if __name__ == '__main__':
    print('%d malformed files' % len(table))
