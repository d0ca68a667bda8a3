"""The loaders: real files load with the right shapes and counts; bad files fail clearly."""

from __future__ import annotations

import gzip
import pathlib
import shutil

import numpy as np
import pytest

from tpu_course import data

SHARED = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data" / "mnist"
FASHION = pathlib.Path("/usr/share/datasets/fashion-mnist")
# The official MNIST test set's class counts (LeCun et al.).
MNIST_TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]

needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="shared MNIST files not here")


def _idx(values: np.ndarray) -> bytes:
    dims = values.shape
    header = bytes([0, 0, 8, len(dims)]) + b"".join(d.to_bytes(4, "big") for d in dims)
    return header + values.astype(np.uint8).tobytes()


@pytest.fixture
def mnist_dir(tmp_path: pathlib.Path) -> pathlib.Path:
    """A copy of the shared MNIST folder that a test may damage."""
    if not SHARED.is_dir():
        pytest.skip("shared MNIST files not here")
    for f in SHARED.glob("*.gz"):
        shutil.copy(f, tmp_path / f.name)
    return tmp_path


@needs_shared
def test_shared_mnist_loads_with_shapes_dtypes_and_counts(monkeypatch):
    monkeypatch.setenv("TPU_COURSE_DATA", str(SHARED))
    d = data.load_mnist()
    assert d.train_images.shape == (10_000, 28, 28) and d.train_images.dtype == np.uint8
    assert d.test_images.shape == (10_000, 28, 28) and d.test_labels.shape == (10_000,)
    assert d.train_labels.dtype == np.int32
    assert d.train_set.startswith("offline subset")
    assert np.bincount(d.test_labels).tolist() == MNIST_TEST_COUNTS
    assert np.bincount(d.train_labels, minlength=10).min() > 800  # every digit is there
    assert d.train_images.max() == 255 and d.train_images.min() == 0


@pytest.mark.skipif(not FASHION.is_dir(), reason="apt-get install dataset-fashion-mnist")
def test_debian_fashion_mnist_loads(monkeypatch):
    # TPU_COURSE_DATA pointing at MNIST must not make Fashion-MNIST read MNIST's test files
    if SHARED.is_dir():
        monkeypatch.setenv("TPU_COURSE_DATA", str(SHARED))
    d = data.load_fashion_mnist()
    assert d.train_images.shape == (60_000, 28, 28) and d.test_images.shape == (10_000, 28, 28)
    assert np.bincount(d.train_labels).tolist() == [6000] * 10
    assert np.bincount(d.test_labels).tolist() == [1000] * 10
    assert d.classes[9] == "Ankle boot"


def test_checksum_mismatch_names_file_and_expected(mnist_dir, monkeypatch):
    bad = mnist_dir / "t10k-labels-idx1-ubyte.gz"
    labels = np.zeros(10_000, np.uint8)  # a valid gzip IDX file with the wrong contents
    bad.write_bytes(gzip.compress(bytes([0, 0, 8, 1]) + (10_000).to_bytes(4, "big") + labels.tobytes()))
    monkeypatch.setenv("TPU_COURSE_DATA", str(mnist_dir))
    with pytest.raises(data.DataError, match="wrong checksum") as err:
        data.load_mnist()
    assert "t10k-labels-idx1-ubyte.gz" in str(err.value)
    assert data.MNIST_FILES["test_labels"].sha256 in str(err.value)


def test_truncated_file_is_an_error_not_an_array(mnist_dir, monkeypatch):
    f = mnist_dir / "t10k-images-idx3-ubyte.gz"
    f.write_bytes(f.read_bytes()[: 100_000])
    monkeypatch.setenv("TPU_COURSE_DATA", str(mnist_dir))
    with pytest.raises(data.DataError, match="truncated") as err:
        data.load_mnist()
    assert "t10k-images-idx3-ubyte.gz" in str(err.value)
    assert data.MNIST_FILES["test_images"].sha256 in str(err.value)


def test_missing_file_offline_says_where_to_put_it(mnist_dir, monkeypatch):
    (mnist_dir / "train-10k-labels-idx1-ubyte.gz").unlink()
    monkeypatch.setenv("TPU_COURSE_DATA", str(mnist_dir))
    with pytest.raises(data.DataError) as err:
        data.load_mnist()
    msg = str(err.value)
    assert "train-10k-labels-idx1-ubyte.gz" in msg and "TPU_COURSE_DATA" in msg
    assert str(mnist_dir) in msg


def test_download_failure_falls_through_mirrors_then_explains(tmp_path, monkeypatch):
    monkeypatch.delenv("TPU_COURSE_DATA", raising=False)
    monkeypatch.setenv("TPU_COURSE_CACHE", str(tmp_path))
    monkeypatch.setattr(data.time, "sleep", lambda s: None)
    tried = []

    def refuse(url, timeout):
        tried.append(url)
        raise OSError("network unreachable")

    monkeypatch.setattr(data.urllib.request, "urlopen", refuse)
    with pytest.raises(data.DataError, match="could not download") as err:
        data.load_mnist()
    assert len({u.rsplit("/", 1)[0] for u in tried}) == len(data.MNIST_MIRRORS)
    assert "TPU_COURSE_DATA" in str(err.value)


def test_download_verifies_and_caches(tmp_path, monkeypatch):
    """A mirror serving a corrupt file is skipped; the next mirror's good file is cached."""
    if not SHARED.is_dir():
        pytest.skip("shared MNIST files not here")
    monkeypatch.delenv("TPU_COURSE_DATA", raising=False)
    monkeypatch.setenv("TPU_COURSE_CACHE", str(tmp_path))
    monkeypatch.setattr(data.time, "sleep", lambda s: None)
    spec = data.MNIST_FILES["test_labels"]
    good = (SHARED / spec.name).read_bytes()

    class Response:
        def __init__(self, body: bytes):
            self.body, self.headers = body, {"Content-Length": str(len(body))}

        def read(self, n: int) -> bytes:
            chunk, self.body = self.body[:n], self.body[n:]
            return chunk

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    def serve(url, timeout):
        return Response(good if url.startswith(data.MNIST_MIRRORS[1]) else b"garbage")

    monkeypatch.setattr(data.urllib.request, "urlopen", serve)
    path = data._download(spec, data.MNIST_MIRRORS, tmp_path / "mnist" / spec.name, retries=1)
    assert path.read_bytes() == good
    assert not list((tmp_path / "mnist").glob("*.part"))


def test_parse_idx_rejects_inconsistent_header():
    raw = _idx(np.arange(6).reshape(2, 3))
    assert data._parse_idx(raw).tolist() == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(data.DataError, match="header"):
        data._parse_idx(raw[:-1])


@pytest.mark.skipif(not FASHION.is_dir(), reason="apt-get install dataset-fashion-mnist")
def test_a_fashion_folder_in_the_path_is_not_taken_for_full_mnist(monkeypatch):
    """Fashion-MNIST's files carry MNIST's names; their checksums tell them apart."""
    if not SHARED.is_dir():
        pytest.skip("shared MNIST files not here")
    monkeypatch.setenv("TPU_COURSE_DATA", f"{FASHION}:{SHARED}")
    d = data.load_mnist()
    assert d.train_set.startswith("offline subset") and d.source == str(SHARED)
    assert np.bincount(d.test_labels).tolist() == MNIST_TEST_COUNTS


def test_corrupt_full_set_is_reported_not_silently_replaced(mnist_dir, monkeypatch):
    """A corrupt full-size file is an error even when the subset could be used instead."""
    (mnist_dir / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(b"\0\0\x08\x01junk"))
    (mnist_dir / "train-labels-idx1-ubyte.gz").write_bytes(gzip.compress(b"\0\0\x08\x01junk"))
    (mnist_dir / "train-10k-labels-idx1-ubyte.gz").unlink()
    monkeypatch.setenv("TPU_COURSE_DATA", str(mnist_dir))
    with pytest.raises(data.DataError, match="wrong checksum"):
        data.load_mnist()


def test_corrupt_gzip_in_the_offline_subset_is_a_data_error(mnist_dir, monkeypatch):
    # Damage the compressed bytes but keep the gzip header: gzip raises zlib.error.
    f = mnist_dir / "train-10k-images-idx3-ubyte.gz"
    blob = bytearray(f.read_bytes())
    blob[20:4000] = bytes(3980)
    f.write_bytes(bytes(blob))
    monkeypatch.setenv("TPU_COURSE_DATA", str(mnist_dir))
    with pytest.raises(data.DataError, match="corrupt: it does not decompress") as err:
        data.load_mnist()
    msg = str(err.value)
    assert "train-10k-images-idx3-ubyte.gz" in msg and "error" in msg
    assert isinstance(err.value, ValueError)


def test_truncated_file_advice_depends_on_whether_anything_will_be_downloaded(
        mnist_dir, tmp_path, monkeypatch):
    f = mnist_dir / "t10k-images-idx3-ubyte.gz"
    f.write_bytes(f.read_bytes()[: 100_000])
    spec = data.MNIST_FILES["test_images"]
    monkeypatch.setenv("TPU_COURSE_DATA", str(mnist_dir))
    with pytest.raises(data.DataError) as offline:
        data.verify(f, spec)
    assert "re-download" not in str(offline.value)
    assert "TPU_COURSE_DATA is set" in str(offline.value) and "replace the file" in str(offline.value)
    monkeypatch.delenv("TPU_COURSE_DATA")
    with pytest.raises(data.DataError) as cached:
        data.verify(f, spec)
    assert "re-download" in str(cached.value)


@pytest.mark.parametrize("contents", [[], ["t10k-images-idx3-ubyte.gz"]])
def test_empty_folder_says_which_sets_are_accepted(tmp_path, monkeypatch, contents):
    for name in contents:
        (tmp_path / name).write_bytes(b"")
    monkeypatch.setenv("TPU_COURSE_DATA", str(tmp_path / "missing") + ":" + str(tmp_path))
    with pytest.raises(data.MissingDataError) as err:
        data.load_mnist()
    msg = str(err.value)
    assert "either the full one (train-images-idx3-ubyte.gz + train-labels-idx1-ubyte.gz)" in msg
    assert "offline 10,000-image subset (train-10k-images-idx3-ubyte.gz" in msg
    assert "plus the test set (t10k-images-idx3-ubyte.gz + t10k-labels-idx1-ubyte.gz)" in msg
    assert ("no .gz files" in msg) == (not contents)


def test_a_bad_idx_header_names_the_file(tmp_path, monkeypatch):
    spec = data.FileSpec("x-idx1-ubyte.gz", sha256_raw=None)
    raw = bytes([0, 0, 0x42, 1, 0, 0, 0, 3, 1, 2, 3])  # unknown element type 0x42
    with pytest.raises(data.DataError, match="x-idx1-ubyte.gz: not an IDX file"):
        data._parse(tmp_path / spec.name, raw)


@pytest.mark.parametrize("kind", ["a file", "missing"])
def test_a_data_path_that_is_no_folder_says_what_it_is(tmp_path, monkeypatch, kind):
    target = tmp_path / "mnist"
    if kind == "a file":
        target.write_bytes(b"not a folder")
    monkeypatch.setenv("TPU_COURSE_DATA", str(target))
    with pytest.raises(data.MissingDataError) as err:
        data.load_mnist()
    msg = str(err.value)
    said = "is a file, not a folder" if kind == "a file" else "does not exist"
    assert f"In TPU_COURSE_DATA, {target} {said}." in msg, msg
    assert "no .gz files" not in msg  # there is no folder to hold any


def test_a_failed_download_lists_each_mirror_once_with_its_error(tmp_path, monkeypatch):
    monkeypatch.delenv("TPU_COURSE_DATA", raising=False)
    monkeypatch.setenv("TPU_COURSE_CACHE", str(tmp_path))
    monkeypatch.setattr(data.time, "sleep", lambda s: None)

    def refuse(url, timeout):
        raise OSError(f"no route to {url.split('/')[2]}")

    monkeypatch.setattr(data.urllib.request, "urlopen", refuse)
    spec = data.MNIST_FILES["train_labels"]
    with pytest.raises(data.DataError) as err:
        data._download(spec, data.MNIST_MIRRORS, tmp_path / "mnist" / spec.name, retries=3)
    lines = str(err.value).splitlines()
    listed = [line.strip() for line in lines if line.startswith("  ")]
    assert len(listed) == len(data.MNIST_MIRRORS), str(err.value)  # each once, in order
    for mirror, line in zip(data.MNIST_MIRRORS, listed):
        host = mirror.split("/")[2]
        assert line == f"{mirror}{spec.name}: no route to {host} (3 attempts)"
    assert not list((tmp_path / "mnist").glob("*.part"))
