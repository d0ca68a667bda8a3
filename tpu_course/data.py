"""MNIST and Fashion-MNIST: found on disk or downloaded, checksummed, cached.

Where the files come from, in order:

1. ``TPU_COURSE_DATA``: one or more directories (``os.pathsep``-separated) that already
   hold the IDX files. When it is set, nothing is downloaded: this is how CI and offline
   workshops run. For MNIST the full 60,000-image training file is used when it is
   there, else the 10,000-image offline subset (``train-10k-*``).
2. The cache (``TPU_COURSE_CACHE``, default ``~/.cache/tpu_course``) and system copies
   (``/usr/share/datasets/fashion-mnist`` from Debian's ``dataset-fashion-mnist``).
3. A download from the first mirror that answers, with retries, a progress bar and a
   checksum check, into the cache.

Every file is checked before it is parsed: a corrupt or truncated file raises
:class:`DataError` naming the file and the expected checksum, never a wrong array.

>>> import numpy as np
>>> d = _parse_idx(bytes([0, 0, 8, 1, 0, 0, 0, 3, 7, 8, 9]))
>>> d.tolist(), d.dtype == np.uint8
([7, 8, 9], True)
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import os
import pathlib
import shutil
import struct
import tempfile
import time
import urllib.request
import zlib
from typing import Iterable, Mapping

import numpy as np

from tpu_course import errors


class DataError(errors.CourseError, ValueError, RuntimeError):
    """A data file is missing, corrupt or truncated; the message says what to do.

    A ``ValueError`` (the data is not what it should be) and, as before, a ``RuntimeError``.
    """


class MissingDataError(DataError):
    """The files are not on disk (and were not to be downloaded)."""


@dataclasses.dataclass(frozen=True)
class FileSpec:
    """One IDX file and the checksums it may have.

    ``md5`` is the published checksum of the canonical ``.gz``; ``sha256_raw`` that of
    the decompressed IDX bytes, so a re-compressed copy (Debian's) also verifies.
    """

    name: str
    md5: str | None = None
    sha256: str | None = None
    sha256_raw: str | None = None


# Checksums. MNIST md5s are the published ones (the canonical distribution, as listed by
# torchvision and the shared data README); sha256s of the shared files are from
# shared/data/README.md; raw sha256s were computed from those files and from Debian's
# dataset-fashion-mnist 0.0~git20200523.55506a9-1. Fashion-MNIST md5s are the ones the
# zalandoresearch/fashion-mnist README publishes.
MNIST_FILES: Mapping[str, FileSpec] = {
    "train_images": FileSpec("train-images-idx3-ubyte.gz", md5="f68b3c2dcbeaaa9fbdd348bbdeb94873"),
    "train_labels": FileSpec("train-labels-idx1-ubyte.gz", md5="d53e105ee54ea40749a09fcbcd1e9432"),
    "test_images": FileSpec(
        "t10k-images-idx3-ubyte.gz", md5="9fb629c4189551a2d022fa330f9573f3",
        sha256="8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
        sha256_raw="0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7"),
    "test_labels": FileSpec(
        "t10k-labels-idx1-ubyte.gz", md5="ec29112dd5afa0611ce80d1b7f02629c",
        sha256="f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
        sha256_raw="ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2"),
}
MNIST_SUBSET_FILES: Mapping[str, FileSpec] = {
    "train_images": FileSpec(
        "train-10k-images-idx3-ubyte.gz",
        sha256="2747ed10697bbef1652240687b06fe92c3bca7ae914de53c9ccf2343015be2bf",
        sha256_raw="87ff80b1af14cbb3cd72b14f87b48775177b2bbd6ad1b2645c25bd389d95c284"),
    "train_labels": FileSpec(
        "train-10k-labels-idx1-ubyte.gz",
        sha256="ea948178aadae3130b2478529dca6f7dff2de9d14e860f046ec256dc65e9a7b5",
        sha256_raw="abc1ca0c0af29e09d56751fab3baff6f96ac830fe542e7e091e7f3ed8afce81d"),
}
FASHION_FILES: Mapping[str, FileSpec] = {
    "train_images": FileSpec(
        "train-images-idx3-ubyte.gz", md5="8d4fb7e6c68d591d4c3dfef9ec88bf0d",
        sha256_raw="c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888"),
    "train_labels": FileSpec(
        "train-labels-idx1-ubyte.gz", md5="25c81989df183df01b3e8a0aad5dffbe",
        sha256_raw="bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9"),
    "test_images": FileSpec(
        "t10k-images-idx3-ubyte.gz", md5="bef4ecab320f06d8554ea6380940ec79",
        sha256_raw="5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b"),
    "test_labels": FileSpec(
        "t10k-labels-idx1-ubyte.gz", md5="bb300cfdad3c16e7a12a480ee83cd310",
        sha256_raw="0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34"),
}

MNIST_MIRRORS = (
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "http://yann.lecun.com/exdb/mnist/",
)
FASHION_MIRRORS = (
    "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
    "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/",
)
SYSTEM_DIRS = {"fashion_mnist": ("/usr/share/datasets/fashion-mnist",)}

MNIST_CLASSES = tuple(str(i) for i in range(10))
FASHION_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                   "Sneaker", "Bag", "Ankle boot")


@dataclasses.dataclass(frozen=True, repr=False)
class Dataset:
    """Images (uint8, N x 28 x 28) and integer labels, and which files they came from."""

    name: str
    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    train_set: str  # e.g. 'full (60,000 images)' or 'offline subset (10,000 images)'
    classes: tuple[str, ...]
    source: str  # the directory the files were read from

    def __repr__(self) -> str:
        return (f"Dataset({self.name}: train {self.train_images.shape} [{self.train_set}], "
                f"test {self.test_images.shape}, from {self.source})")


def _cache_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("TPU_COURSE_CACHE",
                                       pathlib.Path.home() / ".cache" / "tpu_course"))


def _data_dirs() -> list[pathlib.Path] | None:
    value = os.environ.get("TPU_COURSE_DATA")
    if not value:
        return None
    return [pathlib.Path(p).expanduser() for p in value.split(os.pathsep) if p]


def _digest(data: bytes, algo: str) -> str:
    return hashlib.new(algo, data).hexdigest()


def verify(path: pathlib.Path, spec: FileSpec) -> bytes:
    """Read ``path``, check it against ``spec`` and return the decompressed IDX bytes.

    Raises :class:`DataError` naming the file and its expected checksum when the file is
    truncated, not gzip, or has the wrong contents.
    """
    blob = path.read_bytes()
    expected = spec.sha256 or spec.md5 or spec.sha256_raw
    fix = _fix_advice(spec)
    if spec.md5 and _digest(blob, "md5") == spec.md5:
        ok_packed = True
    elif spec.sha256 and _digest(blob, "sha256") == spec.sha256:
        ok_packed = True
    else:
        ok_packed = False
    try:
        raw = gzip.decompress(blob)
    except EOFError as err:
        raise DataError(f"{path} is truncated: the gzip stream ends early ({err}); expected "
                        f"checksum {expected}. {fix}") from None
    except gzip.BadGzipFile as err:
        raise DataError(f"{path} is not a gzip file ({err}); expected checksum {expected}. "
                        f"{fix}") from None
    except (OSError, zlib.error) as err:  # zlib.error: the compressed bytes are damaged
        raise DataError(f"{path} is corrupt: it does not decompress ({type(err).__name__}: "
                        f"{err}); expected checksum {expected}. {fix}") from None
    if not ok_packed and not (spec.sha256_raw and _digest(raw, "sha256") == spec.sha256_raw):
        raise DataError(f"{path} has the wrong checksum: expected {expected} "
                        f"(md5 {_digest(blob, 'md5')} found). {fix}")
    return raw


def _fix_advice(spec: FileSpec) -> str:
    """What to do about a bad copy of ``spec``: re-download only when that will happen."""
    env_dirs = _data_dirs()
    if env_dirs is not None:
        where = os.pathsep.join(str(d) for d in env_dirs)
        return (f"TPU_COURSE_DATA is set ({where}), so nothing is downloaded: replace the file "
                f"with a good copy of {spec.name}, or unset TPU_COURSE_DATA to download it "
                "into the cache.")
    return (f"Delete it and run again to re-download it, or replace it with a good copy of "
            f"{spec.name}.")


def _parse_idx(raw: bytes) -> np.ndarray:
    """Parse IDX bytes (the MNIST format: magic, dims, big-endian data) into an array."""
    dtypes = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in dtypes:
        raise DataError("not an IDX file (bad magic number)")
    dtype = dtypes[raw[2]]
    ndim = raw[3]
    if len(raw) < 4 + 4 * ndim:
        raise DataError(f"IDX header promises {ndim} dimensions but the file ends before them")
    dims = struct.unpack(f">{ndim}I", raw[4:4 + 4 * ndim])
    data = np.frombuffer(raw, dtype=dtype, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise DataError(f"IDX header says {dims} but the file holds {data.size} values")
    return data.reshape(dims)


def _parse(path: pathlib.Path, raw: bytes) -> np.ndarray:
    """:func:`_parse_idx`, its errors naming the file."""
    try:
        return _parse_idx(raw)
    except DataError as err:
        raise DataError(f"{path}: {err}") from None


def _download(spec: FileSpec, mirrors: Iterable[str], target: pathlib.Path,
              retries: int = 3, timeout_s: float = 30.0) -> pathlib.Path:
    """Fetch ``spec`` from the first mirror that answers; verify; move into ``target``."""
    from tqdm.auto import tqdm

    errors: dict[str, str] = {}  # per mirror, its last error and how many attempts failed
    target.parent.mkdir(parents=True, exist_ok=True)
    for mirror in mirrors:
        for attempt in range(retries):
            url = mirror + spec.name
            fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".part")
            os.close(fd)
            try:
                with urllib.request.urlopen(url, timeout=timeout_s) as resp:
                    total = int(resp.headers.get("Content-Length") or 0) or None
                    with open(tmp, "wb") as out, tqdm(
                        total=total, unit="B", unit_scale=True, desc=spec.name, leave=False
                    ) as bar:
                        while chunk := resp.read(1 << 16):
                            out.write(chunk)
                            bar.update(len(chunk))
                verify(pathlib.Path(tmp), spec)
                shutil.move(tmp, target)
                return target
            except (OSError, DataError) as err:
                tries = "" if retries == 1 else f" ({attempt + 1} attempts)"
                errors[url] = f"{url}: {' '.join(str(err).split())}{tries}"
                pathlib.Path(tmp).unlink(missing_ok=True)
                if attempt + 1 < retries:
                    time.sleep(min(2**attempt, 4))
    raise DataError(
        f"could not download {spec.name} from any mirror:\n  " + "\n  ".join(errors.values())
        + "\nWithout a network, put the file in a directory and set TPU_COURSE_DATA to it, "
        f"or copy it into {target.parent}."
    )


def _missing_error(dataset: str, files: Mapping[str, FileSpec], dirs: list[pathlib.Path],
                   subset: Mapping[str, FileSpec] | None = None) -> DataError:
    """Which sets of files are accepted, and where they were looked for."""
    where = ", ".join(str(d) for d in dirs) or "(none)"
    names = lambda fs, keys: " + ".join(fs[k].name for k in keys)
    train, test = ("train_images", "train_labels"), ("test_images", "test_labels")
    wanted = f"the training set ({names(files, train)})"
    if subset:
        wanted = (f"a training set, either the full one ({names(files, train)}) or the "
                  f"offline 10,000-image subset ({names(subset, train)})")
    present = sorted(p.name for d in dirs if d.is_dir() for p in d.glob("*.gz"))
    # Say which of TPU_COURSE_DATA's entries is not a folder at all (a typo, a file).
    env_dirs = _data_dirs() or []
    odd = [f"{d} is a file, not a folder" if d.exists() else f"{d} does not exist"
           for d in dirs if d in env_dirs and not d.is_dir()]
    notes = f" In TPU_COURSE_DATA, {'; '.join(odd)}." if odd else ""
    folders = [d for d in dirs if d.is_dir()]
    found = (f" Found there: {', '.join(present)}." if present else
             " Those folders hold no .gz files." if folders else "")
    return MissingDataError(
        f"{dataset}: no folder among {where} holds {wanted}, plus the test set "
        f"({names(files, test)}), all in the same folder.{notes}{found} Put the IDX .gz "
        "files in one folder and set TPU_COURSE_DATA to it, or unset TPU_COURSE_DATA to "
        "download them into the cache."
    )


def _resolve(dataset: str, files: Mapping[str, FileSpec], mirrors: tuple[str, ...],
             dirs: list[pathlib.Path], download: bool) -> tuple[dict[str, np.ndarray], pathlib.Path]:
    """Arrays from the first directory of ``dirs`` whose files all verify, else a download.

    All files must come from one directory and pass their checksums there: MNIST and
    Fashion-MNIST share file names, so a folder that holds the other data set (or only
    some of the files) is passed over. When a folder has every file but one fails its
    checksum and no other folder qualifies, that checksum error is raised.
    """
    if os.environ.get(WITHHELD_ENV) == "1":  # a grading worker: no evaluation labels
        files = {key: spec for key, spec in files.items() if key != "test_labels"}
    bad: DataError | None = None
    for d in dirs:
        if not all((d / spec.name).is_file() for spec in files.values()):
            continue
        try:
            raw = {key: verify(d / spec.name, spec) for key, spec in files.items()}
        except DataError as err:
            bad = bad or err
            continue
        return {key: _parse(d / files[key].name, r) for key, r in raw.items()}, d
    if bad is not None:
        raise bad
    if not download:
        raise _missing_error(dataset, files, dirs)
    cache = _cache_dir() / dataset
    for spec in files.values():
        if not (cache / spec.name).is_file():
            _download(spec, mirrors, cache / spec.name)
    return {key: _parse(cache / spec.name, verify(cache / spec.name, spec))
            for key, spec in files.items()}, cache


#: Set in a grading worker: the evaluation labels are withheld (the sandbox hides their
#: files), and a data set's ``test_labels`` read -1.
WITHHELD_ENV = "TPU_COURSE_WITHHOLD_TEST_LABELS"


def _dataset(name: str, arrays: dict, train_set: str, classes: tuple[str, ...],
             source: pathlib.Path) -> Dataset:
    test_labels = arrays.get("test_labels")
    if test_labels is None:
        test_labels = np.full(len(arrays["test_images"]), -1)
    return Dataset(name, arrays["train_images"], arrays["train_labels"].astype(np.int32),
                   arrays["test_images"], test_labels.astype(np.int32),
                   train_set, classes, str(source))


def load_mnist(download: bool = True) -> Dataset:
    """MNIST: the full 60,000-image training set when it can be had, else the offline subset.

    With ``TPU_COURSE_DATA`` set, reads only from there (the full set if a folder holds
    it, else the 10,000-image ``train-10k`` subset) and downloads nothing; otherwise the
    cache, then a download. ``train_set`` says which training set was loaded.
    """
    env_dirs = _data_dirs()
    label = "full (60,000 images)"
    if env_dirs is None:
        arrays, where = _resolve("mnist", MNIST_FILES, MNIST_MIRRORS, [_cache_dir() / "mnist"],
                                 download)
        return _dataset("mnist", arrays, label, MNIST_CLASSES, where)
    try:
        arrays, where = _resolve("mnist", MNIST_FILES, MNIST_MIRRORS, env_dirs, download=False)
    except DataError as full_err:
        label = "offline subset (10,000 images)"
        try:
            arrays, where = _resolve("mnist", {**MNIST_FILES, **MNIST_SUBSET_FILES},
                                     MNIST_MIRRORS, env_dirs, download=False)
        except MissingDataError:
            if not isinstance(full_err, MissingDataError):
                raise full_err from None  # the full set is there but corrupt: say so
            raise _missing_error("mnist", MNIST_FILES, env_dirs, MNIST_SUBSET_FILES) from None
    return _dataset("mnist", arrays, label, MNIST_CLASSES, where)


def load_fashion_mnist(download: bool = True) -> Dataset:
    """Fashion-MNIST (60,000 + 10,000 clothing images, 10 classes), same format as MNIST.

    Looks in ``TPU_COURSE_DATA`` (when set), the cache and
    ``/usr/share/datasets/fashion-mnist`` (Debian's ``dataset-fashion-mnist``); downloads
    into the cache only when ``TPU_COURSE_DATA`` is not set.
    """
    env_dirs = _data_dirs()
    dirs = [*(env_dirs or []), _cache_dir() / "fashion_mnist",
            *map(pathlib.Path, SYSTEM_DIRS["fashion_mnist"])]
    arrays, where = _resolve("fashion_mnist", FASHION_FILES, FASHION_MIRRORS, dirs,
                             download and env_dirs is None)
    return _dataset("fashion_mnist", arrays, "full (60,000 images)", FASHION_CLASSES, where)
