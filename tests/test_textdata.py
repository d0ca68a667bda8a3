"""tpu_course.textdata: the standard-library corpus, its split, batches and baselines."""

import hashlib
import math

import numpy as np
import pytest

from tpu_course import errors, textdata


@pytest.fixture(scope="module")
def corpus():
    return textdata.load()


def test_corpus_is_the_interpreters_stdlib_without_tests(corpus):
    assert corpus.root == str(textdata.stdlib_root())
    assert 5e6 < corpus.size_bytes < 30e6  # ~11-12 MB on CPython 3.12 / 3.13
    assert corpus.train.dtype == np.uint8 and corpus.heldout.dtype == np.uint8
    share = corpus.files_heldout / (corpus.files_train + corpus.files_heldout)
    assert 0.05 < share < 0.15  # about 10 % of the files held out
    assert b"def " in corpus.train[:100_000].tobytes()


def test_split_is_by_file_and_deterministic(tmp_path):
    for i in range(40):
        folder = tmp_path / ("tests" if i % 10 == 0 else "pkg")
        folder.mkdir(exist_ok=True)
        (folder / f"m{i:02d}.py").write_bytes(f"# file {i}\n".encode())
    a = textdata.load(tmp_path, heldout_fraction=0.3)
    b = textdata.load(tmp_path, heldout_fraction=0.3)
    np.testing.assert_array_equal(a.train, b.train)
    assert a.files_train + a.files_heldout == 36  # tests/ left out
    held = [f"pkg/m{i:02d}.py" for i in range(40) if i % 10
            and textdata.is_heldout(f"pkg/m{i:02d}.py", 0.3)]
    assert a.files_heldout == len(held)
    text = a.heldout.tobytes().decode()
    assert all(f"# file {int(h[5:7])}\n" in text for h in held)  # whole files, sorted


def test_batch_at_is_a_pure_function_of_the_step():
    data = np.arange(1000, dtype=np.uint8)
    x, y = textdata.batch_at(data, step=7, batch=4, length=16, seed=3)
    assert x.shape == y.shape == (4, 16) and x.dtype == np.int32
    np.testing.assert_array_equal(x[:, 1:], y[:, :-1])  # targets are inputs shifted
    again = textdata.batch_at(data, step=7, batch=4, length=16, seed=3)
    np.testing.assert_array_equal(x, again[0])
    other = textdata.batch_at(data, step=8, batch=4, length=16, seed=3)
    assert not np.array_equal(x, other[0])
    stream = textdata.batches(data, 4, 16, seed=3, start_step=7)
    np.testing.assert_array_equal(next(stream)[0], x)
    np.testing.assert_array_equal(next(stream)[0], other[0])


def test_baselines_against_hand_computed_entropies():
    assert textdata.bits_per_byte(math.log(2)) == pytest.approx(1.0)
    # a source that alternates 0, 1: unigram p = 1/2 each (smoothed slightly away), and
    # a bigram that knows the next byte almost surely
    train = np.array([0, 1] * 5000, np.uint8)
    heldout = np.array([0, 1] * 50, np.uint8)
    unigram = textdata.unigram_bits_per_byte(train, heldout)
    assert unigram == pytest.approx(-math.log2(5001 / (10000 + 256)), rel=1e-9)
    bigram = textdata.bigram_bits_per_byte(train, heldout)
    # 5000 pairs 0->1 and 4999 pairs 1->0 in train; held out: 50 of the first, 49 of
    # the second; add-one over 256 next bytes
    want = -(50 * math.log2(5001 / 5256) + 49 * math.log2(5000 / 5255)) / 99
    assert bigram == pytest.approx(want, rel=1e-9)
    uniform = np.arange(256, dtype=np.uint8)
    assert textdata.unigram_bits_per_byte(uniform, uniform) == pytest.approx(8.0)


def test_real_baselines_are_ordered(corpus):
    head = corpus.train[:2_000_000]
    unigram = textdata.unigram_bits_per_byte(head, corpus.heldout)
    bigram = textdata.bigram_bits_per_byte(head, corpus.heldout)
    assert 3.0 < bigram < unigram < 5.5 < 8


def test_bad_input_gets_a_course_error(tmp_path):
    with pytest.raises(errors.CourseValueError, match="not a folder"):
        textdata.load(tmp_path / "missing")
    with pytest.raises(errors.CourseValueError, match="too few"):
        textdata.load(tmp_path)
    with pytest.raises(errors.CourseValueError, match="too short"):
        textdata.batch_at(np.zeros(5, np.uint8), 0, 2, 16)
    with pytest.raises(errors.CourseTypeError):
        textdata.batch_at(np.zeros(50, np.uint8), 1.5, 2, 16)


# -- download: a public text, checksummed and cached (a file:// URL stands in for the web)

def _text_file(tmp_path):
    path = tmp_path / "source.txt"
    path.write_bytes(b"To be, or not to be, that is the question.\n" * 50)
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def test_download_checks_caches_and_holds_out_the_tail(tmp_path):
    path, digest = _text_file(tmp_path)
    corpus = textdata.download("hamlet", url=path.as_uri(), sha256=digest,
                               cache_dir=tmp_path / "cache")
    whole = path.read_bytes()
    assert corpus.size_bytes == len(whole) and corpus.split == "tail"
    assert bytes(corpus.train) + bytes(corpus.heldout) == whole
    assert corpus.heldout.size == round(0.1 * len(whole))
    assert "the last" in str(corpus) and "hamlet" in str(corpus)
    path.unlink()  # the cached copy is read, not the source
    again = textdata.download("hamlet", url=path.as_uri(), sha256=digest,
                              cache_dir=tmp_path / "cache")
    assert bytes(again.heldout) == bytes(corpus.heldout)


def test_download_refuses_a_wrong_checksum_and_a_missing_network(tmp_path):
    path, digest = _text_file(tmp_path)
    with pytest.raises(errors.CourseValueError, match="SHA-256 .* nothing was saved"):
        textdata.download("hamlet", url=path.as_uri(), sha256="0" * 64,
                          cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache" / "text" / "hamlet.txt").exists()
    with pytest.raises(errors.CourseValueError, match="without internet use textdata.load"):
        textdata.download("hamlet", url=(tmp_path / "absent.txt").as_uri(), sha256=digest,
                          cache_dir=tmp_path / "cache")
    with pytest.raises(errors.CourseValueError, match="tinyshakespeare"):
        textdata.download("shakespeare")  # not a known name: the known ones are listed
    assert set(textdata.PUBLIC_TEXTS) == {"tinyshakespeare"}


@pytest.mark.parametrize("name", ["../victim", "/tmp/victim", "sub/victim", "..", ".hidden", "",
                                  "a" * 65, "name with spaces"])
def test_download_name_is_never_a_path(tmp_path, name):
    path, digest = _text_file(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    with pytest.raises(errors.CourseValueError, match=r"name=.*: expected a plain name for the "
                       r"cached file .* no path"):
        textdata.download(name, url=path.as_uri(), sha256=digest, cache_dir=tmp_path / "cache")
    assert victim.read_text() == "precious" and not (tmp_path / "cache").exists()


def test_download_writes_by_renaming_and_refuses_half_given_sources(tmp_path):
    path, digest = _text_file(tmp_path)
    textdata.download("hamlet", url=path.as_uri(), sha256=digest.upper(),
                      cache_dir=tmp_path / "cache")
    assert [p.name for p in (tmp_path / "cache" / "text").iterdir()] == ["hamlet.txt"]  # no temp
    with pytest.raises(errors.CourseValueError, match=r"sha256=None: 'hamlet' is not a known "
                       r"text \(tinyshakespeare\), so it needs both url="):
        textdata.download("hamlet", url=path.as_uri())
    with pytest.raises(errors.CourseValueError, match=r"sha256='abc': expected 64 hexadecimal"):
        textdata.download("hamlet", url=path.as_uri(), sha256="abc")
    (tmp_path / "cache2" / "text" / "hamlet.txt").mkdir(parents=True)  # not a file: left alone
    with pytest.raises(errors.CourseValueError, match=r"hamlet.txt is not a file"):
        textdata.download("hamlet", url=path.as_uri(), sha256=digest, cache_dir=tmp_path / "cache2")


def test_reported_nonsense_is_refused_not_answered(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # '' would have read the current folder
    with pytest.raises(errors.CourseValueError, match=r"root='' is empty \(it would read the "
                       r"current folder\)"):
        textdata.load("")
    with pytest.raises(errors.CourseValueError, match=r"train holds 300 \(at index 1\): byte "
                       r"values are 0..255; .* \(cast to bytes, 300 would count as 44\)"):
        textdata.unigram_bits_per_byte(np.array([1, 300]), np.array([1], np.uint8))
    with pytest.raises(errors.CourseValueError, match=r"heldout holds -1"):
        textdata.bigram_bits_per_byte(np.arange(10), np.array([1, -1]))
    with pytest.raises(errors.CourseValueError, match=r"heldout has 0 bytes"):
        textdata.unigram_bits_per_byte(np.arange(10), np.array([], np.uint8))
    with pytest.raises(errors.CourseValueError, match=r"loss_nats=-1.0: expected a finite number >= 0"):
        textdata.bits_per_byte(-1.0)
    assert textdata.bits_per_byte(np.float32(math.log(2))) == pytest.approx(1.0)
    with pytest.raises(errors.CourseValueError, match=r"fraction=2: expected a finite number >= 0 "
                       r"and <= 1"):
        textdata.is_heldout("json/decoder.py", fraction=2)
    with pytest.raises(errors.CourseTypeError, match=r"data: expected a 1-D integer array"):
        textdata.batches(np.zeros(50, np.float32), 2, 8)  # at the call, not at the first batch
    with pytest.raises(errors.CourseValueError, match=r"seed=-1: expected an integer >= 0"):
        textdata.batch_at(np.zeros(50, np.uint8), 0, 2, 8, seed=-1)
