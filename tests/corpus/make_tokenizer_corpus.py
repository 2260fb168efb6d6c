#!/usr/bin/env python3
"""Writes the malformed tokenizer.json corpus and its table of expected errors.

    python3 tests/corpus/make_tokenizer_corpus.py

tests/corpus/tokenizer/*.json are each refused by mha_tokenizer_open with
the status and message substring listed in tests/corpus/tokenizer.txt
("FILE STATUS substring"); checked by tests/unit/test_tokenizer.c and
replayed by the fuzz target tests/fuzz/fuzz_tokenizer.c.  Plain python3,
no third-party modules; deterministic.
"""
import copy
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
DIR = os.path.join(HERE, 'tokenizer')
table = []


def good():
    vocab = {t: i for i, t in enumerate(['[PAD]', '[UNK]', '[CLS]', '[SEP]', '[MASK]', 'a', '##b'])}
    return {
        'version': '1.0', 'truncation': None, 'padding': None,
        'added_tokens': [{'id': i, 'content': c, 'single_word': False, 'lstrip': False,
                          'rstrip': False, 'normalized': False, 'special': True}
                         for c, i in vocab.items() if c.startswith('[')],
        'normalizer': {'type': 'BertNormalizer', 'clean_text': True, 'handle_chinese_chars': True,
                       'strip_accents': None, 'lowercase': True},
        'pre_tokenizer': {'type': 'BertPreTokenizer'},
        'post_processor': {'type': 'TemplateProcessing',
                           'single': [{'SpecialToken': {'id': '[CLS]', 'type_id': 0}},
                                      {'Sequence': {'id': 'A', 'type_id': 0}},
                                      {'SpecialToken': {'id': '[SEP]', 'type_id': 0}}],
                           'special_tokens': {'[CLS]': {'id': '[CLS]', 'ids': [2], 'tokens': ['[CLS]']},
                                              '[SEP]': {'id': '[SEP]', 'ids': [3], 'tokens': ['[SEP]']}}},
        'decoder': None,
        'model': {'type': 'WordPiece', 'unk_token': '[UNK]', 'continuing_subword_prefix': '##',
                  'max_input_chars_per_word': 100, 'vocab': vocab}}


def put(name, data, status, needle):
    if not isinstance(data, bytes):
        data = json.dumps(data).encode()
    with open(os.path.join(DIR, name), 'wb') as f:
        f.write(data)
    table.append('%s %s %s' % (name, status, needle))


def edit(fn):
    d = copy.deepcopy(good())
    fn(d)
    return d


G = json.dumps(good()).encode()
os.makedirs(DIR, exist_ok=True)
for old in os.listdir(DIR):
    os.remove(os.path.join(DIR, old))

put('empty.json', b'', 'FORMAT', 'not JSON')
put('not_json.json', b'hello, this is not JSON\n', 'FORMAT', 'not JSON')
put('truncated.json', G[:len(G) // 2], 'FORMAT', 'not JSON')
put('cut_at_end.json', G[:-1], 'FORMAT', 'not JSON')
put('trailing_text.json', G + b'\n{"again": 1}', 'FORMAT', 'text after the JSON value')
put('nul_after_value.json', G + b'\0', 'FORMAT', 'text after the JSON value')
put('array_root.json', b'[1, 2, 3]', 'FORMAT', 'not a JSON object')
put('deep_nesting.json', b'[' * 100000 + b']' * 100000, 'FORMAT', 'not JSON')
put('no_model.json', edit(lambda d: d.pop('model')), 'FORMAT', 'model is not an object')
put('model_no_type.json', edit(lambda d: d['model'].pop('type')), 'FORMAT', 'model has no "type"')
put('model_bpe.json', edit(lambda d: d['model'].update(type='BPE')), 'UNSUPPORTED',
    "model type 'BPE' is not supported")
put('model_unigram.json', edit(lambda d: d['model'].update(type='Unigram')), 'UNSUPPORTED',
    "model type 'Unigram' is not supported")
put('vocab_not_object.json', edit(lambda d: d['model'].update(vocab=['a', 'b'])), 'FORMAT',
    'model.vocab is not an object')
put('vocab_empty.json', edit(lambda d: d['model'].update(vocab={})), 'FORMAT',
    'model.vocab has 0 tokens')
put('vocab_id_string.json', edit(lambda d: d['model']['vocab'].update(a='5')), 'FORMAT',
    "token 'a' has no id in 0..6")
put('vocab_id_negative.json', edit(lambda d: d['model']['vocab'].update(a=-1)), 'FORMAT',
    "token 'a' has no id")
put('vocab_id_fraction.json', edit(lambda d: d['model']['vocab'].update(a=5.5)), 'FORMAT',
    "token 'a' has no id")
put('vocab_id_past_end.json', edit(lambda d: d['model']['vocab'].update(a=7)), 'FORMAT',
    "token 'a' has no id in 0..6")
put('vocab_id_huge.json', G.replace(b'"a": 5', b'"a": 1e400'), 'FORMAT', "token 'a' has no id")
put('vocab_id_twice.json', edit(lambda d: d['model']['vocab'].update(a=4)), 'FORMAT',
    'id 4 is given twice')
put('vocab_duplicate_token.json', G.replace(b'"##b": 6', b'"a": 6'), 'FORMAT',
    "duplicate token 'a'")
put('unk_not_in_vocab.json', edit(lambda d: d['model'].update(unk_token='<unk>')), 'FORMAT',
    "unk_token '<unk>' is not in the vocab")
put('unk_not_string.json', edit(lambda d: d['model'].update(unk_token=1)), 'FORMAT',
    'unk_token is not a string')
put('prefix_not_string.json', edit(lambda d: d['model'].update(continuing_subword_prefix=2)),
    'FORMAT', 'continuing_subword_prefix is not a string')
put('prefix_too_long.json', edit(lambda d: d['model'].update(continuing_subword_prefix='#' * 65)),
    'FORMAT', 'continuing_subword_prefix is not a string of at most 64')
put('max_chars_negative.json', edit(lambda d: d['model'].update(max_input_chars_per_word=-1)),
    'FORMAT', 'max_input_chars_per_word is not a count')
put('normalizer_nfkc.json', edit(lambda d: d.update(normalizer={'type': 'NFKC'})), 'UNSUPPORTED',
    "normalizer 'NFKC' is not supported")
put('normalizer_sequence.json',
    edit(lambda d: d.update(normalizer={'type': 'Sequence', 'normalizers': [d['normalizer']]})),
    'UNSUPPORTED', "normalizer 'Sequence' is not supported")
put('normalizer_not_object.json', edit(lambda d: d.update(normalizer=5)), 'FORMAT',
    'normalizer is not an object')
put('normalizer_lowercase_string.json', edit(lambda d: d['normalizer'].update(lowercase='yes')),
    'FORMAT', 'normalizer.lowercase is not true or false')
put('pre_tokenizer_metaspace.json', edit(lambda d: d.update(pre_tokenizer={'type': 'Metaspace'})),
    'UNSUPPORTED', "pre_tokenizer 'Metaspace' is not supported")
put('pre_tokenizer_no_type.json', edit(lambda d: d.update(pre_tokenizer={})), 'FORMAT',
    'pre_tokenizer has no "type"')
put('post_roberta.json', edit(lambda d: d.update(post_processor={'type': 'RobertaProcessing'})),
    'UNSUPPORTED', "post_processor 'RobertaProcessing' is not supported")
put('template_single_missing.json', edit(lambda d: d['post_processor'].pop('single')), 'FORMAT',
    'post_processor.single is not an array')
put('template_no_sequence.json', edit(lambda d: d['post_processor']['single'].pop(1)), 'FORMAT',
    'must hold one Sequence A')
put('template_two_sequences.json',
    edit(lambda d: d['post_processor']['single'].insert(1, {'Sequence': {'id': 'A', 'type_id': 0}})),
    'FORMAT', 'must hold one Sequence A')
put('template_sequence_b.json',
    edit(lambda d: d['post_processor']['single'][1]['Sequence'].update(id='B')), 'FORMAT',
    'must hold one Sequence A')
put('template_unknown_special.json',
    edit(lambda d: d['post_processor']['special_tokens'].pop('[SEP]')), 'FORMAT',
    "special token '[SEP]' is not in special_tokens")
put('template_bad_item.json', edit(lambda d: d['post_processor']['single'].append(7)), 'FORMAT',
    'neither Sequence nor SpecialToken')
put('template_id_outside.json',
    edit(lambda d: d['post_processor']['special_tokens']['[CLS]'].update(ids=[70])), 'FORMAT',
    '[CLS] has no id in the vocab')
put('template_too_many.json',
    edit(lambda d: d['post_processor']['special_tokens']['[CLS]'].update(ids=[2] * 17)),
    'UNSUPPORTED', 'adds more than 16 tokens')
put('bert_processing_bad.json',
    edit(lambda d: d.update(post_processor={'type': 'BertProcessing', 'cls': '[CLS]', 'sep': ['[SEP]', 3]})),
    'FORMAT', 'cls and sep must be [token, id]')
put('bert_processing_id_outside.json',
    edit(lambda d: d.update(post_processor={'type': 'BertProcessing', 'cls': ['[CLS]', 2], 'sep': ['[SEP]', 99]})),
    'FORMAT', 'sep has no id in the vocab')
put('added_not_array.json', edit(lambda d: d.update(added_tokens={'id': 0})), 'FORMAT',
    'added_tokens is not an array')
put('added_no_content.json', edit(lambda d: d['added_tokens'][0].pop('content')), 'FORMAT',
    'an entry has no content string')
put('added_empty_content.json', edit(lambda d: d['added_tokens'][0].update(content='')), 'FORMAT',
    'an entry has no content string')
put('added_id_outside.json', edit(lambda d: d['added_tokens'][0].update(id=30522)), 'UNSUPPORTED',
    "added token '[PAD]' has no id inside the WordPiece vocab")
put('added_normalized.json', edit(lambda d: d['added_tokens'][1].update(normalized=True)),
    'UNSUPPORTED', "added token '[UNK]': normalized true is not supported")
put('added_lstrip.json', edit(lambda d: d['added_tokens'][2].update(lstrip=True)), 'UNSUPPORTED',
    'lstrip true is not supported')
put('added_flag_not_bool.json', edit(lambda d: d['added_tokens'][2].update(rstrip=0)), 'FORMAT',
    'added_tokens[].rstrip is not true or false')

with open(os.path.join(HERE, 'tokenizer.txt'), 'w') as f:
    f.write('# FILE STATUS message-substring   (written by make_tokenizer_corpus.py)\n')
    f.write('\n'.join(table) + '\n')
print('%d files in tests/corpus/tokenizer' % len(table))
