"""test_embedder.py - mha.Embedder against sentence-transformers: the
committed fixtures of all-MiniLM-L6-v2 (tests/fixtures/bert/, from
tests/fixtures/gen_embedding_fixtures.py: 50 texts incl. empty, blank,
typed [PAD], multilingual and truncated at 256 ids), encode's shapes and
options, bit-identical results for any batch size and thread, and errors.
The model is `make model`'s models/all-MiniLM-L6-v2 in the checkout (or
$MHA_MODEL_DIR); without it, or in a build without libcjson, these tests
are skipped."""
import os
import shutil

import numpy as np
import pytest

import mha
from conftest import run_in_threads

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIX = os.path.join(ROOT, "tests", "fixtures", "bert")
D = 384


def model_dir():
    return os.environ.get("MHA_MODEL_DIR") or os.path.join(ROOT, "models", "all-MiniLM-L6-v2")


@pytest.fixture(scope="module")
def embedder():
    path = model_dir()
    if not os.path.isdir(path):
        pytest.skip("no model at %s (run `make model`)" % path)
    try:
        return mha.Embedder(path)
    except NotImplementedError as e:  # a build without libcjson or utf8proc
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def fixture():
    """(texts, ids per text, embeddings (n,D)) from tests/fixtures/bert/."""
    with open(os.path.join(FIX, "texts.txt"), encoding="utf-8", newline="\n") as f:
        texts = f.read().split("\n")[:-1]
    ids, off = np.load(os.path.join(FIX, "ids.npy")), np.load(os.path.join(FIX, "offsets.npy"))
    ref = np.load(os.path.join(FIX, "embeddings.npy"))
    assert len(texts) == 50 and off.shape == (51,) and ref.shape == (50, D)
    return texts, [ids[a:b].tolist() for a, b in zip(off[:-1], off[1:])], ref


@pytest.fixture(scope="module")
def encoded(embedder, fixture):
    """encode of every fixture text in one call (the default batch_size)."""
    return embedder.encode(fixture[0])


def test_info(embedder):
    assert embedder.get_sentence_embedding_dimension() == D
    assert embedder.max_seq_length == embedder.get_max_seq_length() == 256
    assert embedder.info["pooling"] == "mean" and embedder.info["normalize"] == 1
    assert "max_seq_length=256" in repr(embedder)


def test_token_ids_equal_sentence_transformers(embedder, fixture):
    texts, ids, _ = fixture
    got = embedder.tokenize(texts)
    assert got == ids
    assert max(len(i) for i in ids) == 256  # truncated texts are in the fixture
    assert embedder.tokenize(texts[3]) == ids[3]


def test_embeddings_equal_sentence_transformers(encoded, fixture):
    ref = fixture[2]
    assert encoded.shape == (50, D) and encoded.dtype == np.float32
    diff = np.abs(encoded.astype(np.float64) - ref).max(axis=1)
    cos = (encoded.astype(np.float64) * ref).sum(1) / (
        np.linalg.norm(encoded, axis=1) * np.linalg.norm(ref, axis=1))
    assert diff.max() <= 2e-5, "worst max|diff| %.3g at text %d" % (diff.max(), diff.argmax())
    assert cos.min() >= 0.99999, "worst cosine %.9f at text %d" % (cos.min(), cos.argmin())
    np.testing.assert_allclose(np.linalg.norm(encoded, axis=1), 1.0, atol=1e-6)


def test_single_str_is_one_row(embedder, fixture, encoded):
    texts = fixture[0]
    one = embedder.encode(texts[5])
    assert one.shape == (D,) and one.dtype == np.float32
    assert one.tobytes() == encoded[5].tobytes()
    listed = embedder.encode([texts[5]])
    assert listed.shape == (1, D) and listed.tobytes() == one.tobytes()
    # any iterable, in input order
    rev = embedder.encode(reversed(texts[:7]))
    assert rev.tobytes() == encoded[:7][::-1].tobytes()


def test_batch_size_changes_no_bits(embedder, fixture, encoded):
    texts = fixture[0]
    by_one = embedder.encode(texts, batch_size=1)
    by_64 = embedder.encode(texts, batch_size=64)
    assert by_one.tobytes() == by_64.tobytes() == encoded.tobytes()


def test_options(embedder, fixture, encoded):
    texts = fixture[0][:4]
    # the model normalises itself: normalize_embeddings changes nothing
    for norm in (None, False, True):
        assert embedder.encode(texts, normalize_embeddings=norm).tobytes() == \
            encoded[:4].tobytes()
    rows = embedder.encode(texts, convert_to_numpy=False)
    assert isinstance(rows, list) and len(rows) == 4
    assert all(r.shape == (D,) and r.tobytes() == e.tobytes() for r, e in zip(rows, encoded))
    empty = embedder.encode([])
    assert empty.shape == (0, D) and empty.dtype == np.float32
    assert embedder.encode(texts, show_progress_bar=True).tobytes() == encoded[:4].tobytes()


def test_convert_to_tensor(embedder, fixture, encoded):
    torch = pytest.importorskip("torch")
    t = embedder.encode(fixture[0][:3], convert_to_tensor=True)
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.shape == (3, D)
    assert t.numpy().tobytes() == encoded[:3].tobytes()
    assert embedder.encode(fixture[0][0], convert_to_tensor=True).shape == (D,)


def test_max_seq_length_truncates(embedder, fixture, encoded):
    texts, ids, _ = fixture
    long = max(range(len(ids)), key=lambda i: len(ids[i]))
    try:
        embedder.max_seq_length = 9
        cut = embedder.tokenize(texts[long])
        assert cut == ids[long][:8] + [ids[long][-1]]  # [CLS] 7 tokens [SEP]
        row = embedder.encode(texts[long])
        assert row.shape == (D,) and not np.array_equal(row, encoded[long])
        for bad in (1, 513, 2.5, "9", True):
            with pytest.raises(ValueError, match="max_seq_length"):
                embedder.max_seq_length = bad
        assert embedder.max_seq_length == 9
    finally:
        embedder.max_seq_length = 256
    assert embedder.encode(texts[long]).tobytes() == encoded[long].tobytes()


def test_bad_arguments(embedder):
    with pytest.raises(TypeError, match=r"sentences\[1\]"):
        embedder.encode(["a", 3])
    with pytest.raises(TypeError, match="sentences"):
        embedder.encode(12)
    for bad in (0, -1, 2.0, None):
        with pytest.raises(ValueError, match="batch_size"):
            embedder.encode(["a"], batch_size=bad)
    with pytest.raises(UnicodeEncodeError):
        embedder.encode(["\ud800"])


def test_threads_equal_serial(embedder, fixture, encoded):
    texts = fixture[0]
    results = {}

    def work(t):
        order = list(range(t, len(texts), 3)) + list(range(t))
        results[t] = (order, embedder.encode([texts[i] for i in order], batch_size=1 + t))

    run_in_threads(work, 6)
    assert len(results) == 6
    for order, got in results.values():
        assert got.tobytes() == encoded[order].tobytes()


def test_missing_model_dir_is_oserror(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="make model"):
        mha.Embedder(tmp_path / "absent")
    monkeypatch.setenv("MHA_MODEL_DIR", str(tmp_path / "absent"))
    with pytest.raises(FileNotFoundError, match="MHA_MODEL_DIR"):
        mha.Embedder()
    # nothing named, nothing here nor in the checkout: says how to get one
    monkeypatch.delenv("MHA_MODEL_DIR")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(mha.embedder._mha, "source_root", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="make model"):
        mha.Embedder()
    # an empty directory: mha's own message names the missing file (a build
    # without libcjson refuses before reading anything, and says why)
    try:
        mha.Embedder(tmp_path)
    except NotImplementedError as e:
        assert "libcjson" in str(e)
    except OSError as e:
        assert "config.json" in str(e)
    else:
        pytest.fail("an empty model directory was accepted")


def test_default_model_dir(embedder, tmp_path, monkeypatch):
    monkeypatch.setenv("MHA_MODEL_DIR", embedder.model_dir)
    assert mha.find_model_dir() == embedder.model_dir
    monkeypatch.delenv("MHA_MODEL_DIR")
    os.makedirs(tmp_path / "models")
    os.symlink(os.path.abspath(embedder.model_dir), tmp_path / "models" / "all-MiniLM-L6-v2")
    monkeypatch.chdir(tmp_path)
    assert mha.find_model_dir() == os.path.join(str(tmp_path), "models", "all-MiniLM-L6-v2")
    e = mha.Embedder()
    assert e.encode("hello").shape == (D,)


def model_copy(src, dst, replace):
    """dst: a copy of model directory src (big files linked) with the files
    of `replace` {name: bytes} written over."""
    shutil.copytree(src, dst, copy_function=os.symlink)
    for name, data in replace.items():
        os.unlink(os.path.join(dst, name))
        with open(os.path.join(dst, name), "wb") as f:
            f.write(data)
    return dst


@pytest.mark.parametrize("name,data,match", [
    ("config.json", b"{not json", "config.json"),
    ("tokenizer.json", b"[1, 2", "tokenizer.json"),
    ("model.safetensors", b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ", "safetensors"),
])
def test_corrupt_model_file_is_oserror(embedder, tmp_path, name, data, match):
    bad = model_copy(os.path.abspath(embedder.model_dir), str(tmp_path / "m"), {name: data})
    with pytest.raises(OSError, match=match):
        mha.Embedder(bad)


def test_missing_tokenizer_is_oserror(embedder, tmp_path):
    bad = str(tmp_path / "m")
    shutil.copytree(os.path.abspath(embedder.model_dir), bad, copy_function=os.symlink)
    os.unlink(os.path.join(bad, "tokenizer.json"))
    with pytest.raises(OSError, match="tokenizer.json"):
        mha.Embedder(bad)
