"""Text that every machine has: the Python standard library's own source, as bytes.

Chapter 8's language model reads bytes (256 token values, no tokenizer to download).
Its corpus is the ``*.py`` files of the running interpreter's standard library
(``sysconfig.get_paths()["stdlib"]``), leaving out ``test/`` and ``tests/`` folders and
``site-packages``, in sorted order. Its size depends on the interpreter: about 11 MB on
CPython 3.12 and 3.13 (31.7 MB with the test suites). :func:`load` says what it read.

The held-out split is by file, decided by a hash of the file's path relative to the
standard library (SHA-256, so it is the same on every machine and every run, and a file
never straddles the split): about 10 % of the files are held out.

:func:`batch_at` gives the training batch of any step as a pure function of (data,
step, seed): a run resumed at step k reads exactly the batches an uninterrupted run
would, with no iterator state to save. Baselines a model must beat, in bits per byte:
:func:`unigram_bits_per_byte` and :func:`bigram_bits_per_byte` (counts from the
training split, add-one smoothing, scored on the held-out split).

Where the runtime has internet, :func:`download` fetches a public text instead (Tiny
Shakespeare, Karpathy's char-rnn, 1.1 MB), checks its SHA-256, caches it
(``TPU_COURSE_CACHE``, as :mod:`tpu_course.data`) and holds out its last 10 %.

>>> round(bits_per_byte(math.log(256)), 6)  # a uniform guess over 256 bytes: 8 bits
8.0
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import pathlib
import sysconfig
import urllib.request
from collections.abc import Iterator

import numpy as np

from tpu_course import errors
from tpu_course.data import _cache_dir as data_cache_dir  # one cache for all course data

EXCLUDED_DIRS = ("test", "tests", "site-packages", "__pycache__")


def stdlib_root() -> pathlib.Path:
    """The running interpreter's standard library folder."""
    return pathlib.Path(sysconfig.get_paths()["stdlib"])


def is_heldout(relative_path: str, fraction: float = 0.1) -> bool:
    """Whether a file (its path relative to the corpus root) is in the held-out split.

    >>> is_heldout("json/decoder.py"), is_heldout("json/decoder.py", fraction=1.0)
    (False, True)
    """
    digest = hashlib.sha256(relative_path.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


@dataclasses.dataclass(frozen=True)
class Corpus:
    """Bytes for training and held-out evaluation, and where they came from."""

    train: np.ndarray  # uint8, the training files concatenated
    heldout: np.ndarray  # uint8, the held-out files concatenated
    root: str
    files_train: int
    files_heldout: int

    kind: str = "Python source"  # what the bytes are
    split: str = "by file"  # or "tail": one text, its last bytes held out

    @property
    def size_bytes(self) -> int:
        return int(self.train.size + self.heldout.size)

    def __str__(self) -> str:
        if self.split == "tail":
            return (f"{self.size_bytes / 1e6:.1f} MB of {self.kind} from {self.root}: the "
                    f"first {self.train.size / 1e6:.2f} MB to train on, the last "
                    f"{self.heldout.size / 1e6:.2f} MB held out")
        return (f"{self.size_bytes / 1e6:.1f} MB of {self.kind} from {self.root}: "
                f"{self.files_train:,} files ({self.train.size / 1e6:.1f} MB) to train on, "
                f"{self.files_heldout:,} ({self.heldout.size / 1e6:.1f} MB) held out")


def load(root: str | pathlib.Path | None = None, heldout_fraction: float = 0.1) -> Corpus:
    """Read every ``*.py`` under ``root`` (default: the standard library), split by file.

    Files are read in sorted order of their relative paths and joined with a newline.
    """
    base = stdlib_root() if root is None else pathlib.Path(root)
    heldout_fraction = errors.check_number("heldout_fraction", heldout_fraction, low=0,
                                           high=1, low_open=True, high_open=True)
    if not base.is_dir():
        raise errors.CourseValueError(
            f"root={str(base)!r} is not a folder; pass a folder of *.py files, or nothing "
            "for the running interpreter's standard library")
    paths = sorted((p.relative_to(base).as_posix(), p) for p in base.rglob("*.py")
                   if not set(p.relative_to(base).parts[:-1]) & set(EXCLUDED_DIRS))
    parts: dict[bool, list[bytes]] = {False: [], True: []}
    for relative, path in paths:
        parts[is_heldout(relative, heldout_fraction)].append(path.read_bytes())
    if not parts[False] or not parts[True]:
        raise errors.CourseValueError(
            f"{base} has {len(paths)} *.py files: too few to split into training and "
            "held-out files; pass a folder with more of them")

    def join(chunks: list[bytes]) -> np.ndarray:
        return np.frombuffer(b"\n".join(chunks), dtype=np.uint8)

    return Corpus(join(parts[False]), join(parts[True]), str(base),
                  len(parts[False]), len(parts[True]))


#: Public texts :func:`download` knows: name -> (url, SHA-256 of the file, what it is).
PUBLIC_TEXTS = {
    "tinyshakespeare": (
        "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/"
        "input.txt",
        # 1,115,394 bytes, unchanged since the commit that added it (char-rnn 370cbcd, 2015)
        "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
        "Tiny Shakespeare (Karpathy's char-rnn)"),
}


def download(name: str = "tinyshakespeare", *, heldout_fraction: float = 0.1,
             cache_dir: str | pathlib.Path | None = None, url: str | None = None,
             sha256: str | None = None, timeout_s: float = 30.0) -> Corpus:
    """A public text as a :class:`Corpus`: its last ``heldout_fraction`` held out.

    Reads the cached copy when its SHA-256 is right, else downloads it (``url`` and
    ``sha256`` override the known text's, for a mirror or another text) and checks it.
    Needs internet once; :func:`load` never does.
    """
    if url is None or sha256 is None:
        errors.check_choice("name", name, tuple(PUBLIC_TEXTS), where="textdata.download")
        known_url, known_sha, kind = PUBLIC_TEXTS[name]
        url, sha256 = url or known_url, sha256 or known_sha
    else:
        kind = name
    heldout_fraction = errors.check_number("heldout_fraction", heldout_fraction, low=0,
                                           high=1, low_open=True, high_open=True)
    folder = pathlib.Path(cache_dir or data_cache_dir()) / "text"
    path = folder / f"{name}.txt"
    blob = path.read_bytes() if path.is_file() else b""
    if hashlib.sha256(blob).hexdigest() != sha256:
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as response:
                blob = response.read()
        except (OSError, ValueError) as err:
            raise errors.CourseValueError(
                f"could not download {name} from {url} ({type(err).__name__}: {err}); "
                "without internet use textdata.load(), the standard library's source "
                f"(Kaggle: Settings > Internet on), or put the file at {path}") from None
        found = hashlib.sha256(blob).hexdigest()
        if found != sha256:
            raise errors.CourseValueError(
                f"{url} gave {len(blob):,} bytes with SHA-256 {found}, not {sha256}: "
                "a changed or damaged file; nothing was saved. Try again, or pass "
                "url= a mirror of the same file")
        folder.mkdir(parents=True, exist_ok=True)
        path.write_bytes(blob)
    data = np.frombuffer(blob, dtype=np.uint8)
    cut = int(round(data.size * (1 - heldout_fraction)))
    if not 0 < cut < data.size:
        raise errors.CourseValueError(
            f"{name} has {data.size} bytes: too few to hold out {heldout_fraction:.0%}")
    return Corpus(data[:cut], data[cut:], url, 1, 1, kind, "tail")


def batch_at(data: np.ndarray, step: int, batch: int, length: int,
             seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The ``step``-th batch: ``batch`` random windows of ``length + 1`` bytes.

    Returns (inputs, targets), both int32 ``(batch, length)``, targets shifted by one
    byte. The windows' offsets come from ``np.random.default_rng((seed, step))``: a pure
    function of its arguments, so any step's batch can be rebuilt after a restart.
    """
    step = errors.check_int("step", step, low=0)
    batch = errors.check_int("batch", batch, low=1)
    length = errors.check_int("length", length, low=1)
    data = np.asarray(data)
    if data.ndim != 1 or data.size < length + 1:
        raise errors.CourseValueError(
            f"data of shape {data.shape} is too short for windows of {length + 1} bytes; "
            "pass a 1-D byte array (Corpus.train) or a shorter length")
    starts = np.random.default_rng((seed, step)).integers(0, data.size - length, batch)
    windows = data[starts[:, None] + np.arange(length + 1)].astype(np.int32)
    return windows[:, :-1], windows[:, 1:]


def batches(data: np.ndarray, batch: int, length: int, *, seed: int = 0,
            start_step: int = 0) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``batch_at`` for step ``start_step``, then the next step, and so on, forever."""
    step = start_step
    while True:
        yield batch_at(data, step, batch, length, seed)
        step += 1


def bits_per_byte(loss_nats: float) -> float:
    """A mean cross-entropy in nats per byte, in bits per byte: ``loss / ln 2``."""
    return float(loss_nats) / math.log(2)


def unigram_bits_per_byte(train: np.ndarray, heldout: np.ndarray) -> float:
    """Held-out bits per byte of predicting each byte from byte frequencies alone.

    >>> every_byte_once = np.arange(256, dtype=np.uint8)  # smoothed: still uniform
    >>> unigram_bits_per_byte(every_byte_once, np.array([7, 42], np.uint8))
    8.0
    """
    counts = np.bincount(np.asarray(train, np.uint8), minlength=256) + 1.0  # add-one
    log_p = np.log2(counts / counts.sum())
    return float(-log_p[np.asarray(heldout, np.uint8)].mean())


def bigram_bits_per_byte(train: np.ndarray, heldout: np.ndarray) -> float:
    """Held-out bits per byte of predicting each byte from the byte before it."""
    train = np.asarray(train, np.int64)
    heldout = np.asarray(heldout, np.int64)
    pairs = np.bincount(train[:-1] * 256 + train[1:], minlength=256 * 256)
    counts = pairs.reshape(256, 256) + 1.0  # add-one smoothing
    log_p = np.log2(counts / counts.sum(axis=1, keepdims=True))
    return float(-log_p[heldout[:-1], heldout[1:]].mean())
