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
import os
import pathlib
import re
import secrets
import sysconfig
import urllib.request
from collections.abc import Iterator
from typing import Any

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
    if not isinstance(relative_path, str):
        raise errors.CourseTypeError(
            f"relative_path={relative_path!r}: expected a path as a string (relative to the "
            f"corpus root, e.g. 'json/decoder.py'), got {type(relative_path).__name__}.")
    fraction = errors.check_number("fraction", fraction, low=0, high=1)
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
    if root is not None and (isinstance(root, bool) or not isinstance(root, (str, os.PathLike))):
        raise errors.CourseTypeError(
            f"root={root!r}: expected a folder path (a string or pathlib.Path), or nothing "
            f"for the standard library; got {type(root).__name__}.")
    if root is not None and not str(root).strip():
        raise errors.CourseValueError(
            f"root={root!r} is empty (it would read the current folder): pass a folder of "
            "*.py files, or nothing for the running interpreter's standard library")
    base = stdlib_root() if root is None else pathlib.Path(root)
    heldout_fraction = errors.check_number("heldout_fraction", heldout_fraction, low=0,
                                           high=1, low_open=True, high_open=True)
    if not base.is_dir():
        raise errors.CourseValueError(
            f"root={str(base)!r} is not a folder; pass a folder of *.py files, or nothing "
            "for the running interpreter's standard library")
    paths = []  # (path relative to base, path); the excluded folders are never entered
    for folder, dirs, files in os.walk(base):
        dirs[:] = [d for d in dirs if d not in EXCLUDED_DIRS]
        relative = pathlib.PurePath(folder).relative_to(base).as_posix()
        paths += [(name if relative == "." else f"{relative}/{name}", os.path.join(folder, name))
                  for name in files if name.endswith(".py")]
    paths.sort()
    parts: dict[bool, list[bytes]] = {False: [], True: []}
    for relative, path in paths:
        parts[is_heldout(relative, heldout_fraction)].append(pathlib.Path(path).read_bytes())
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
    Needs internet once; :func:`load` never does. ``name`` names the cached file
    (``<cache>/text/<name>.txt``): a plain name (letters, digits, ``_ . -``), never a
    path. The file is written under a temporary name in that folder and renamed into
    place, so a failed download leaves what was there.
    """
    if not isinstance(name, str) or not SAFE_NAME.fullmatch(name) or ".." in name:
        raise errors.CourseValueError(
            f"name={name!r}: expected a plain name for the cached file (letters, digits, "
            "'_', '.', '-'; at most 64; no path), e.g. 'tinyshakespeare' or 'hamlet'. It "
            "names <cache>/text/<name>.txt; pass cache_dir= to choose the folder.")
    for label, value in (("url", url), ("sha256", sha256)):
        if value is not None and not isinstance(value, str):
            raise errors.CourseTypeError(f"{label}={value!r}: expected a string or None, got "
                                         f"{type(value).__name__}.")
    if sha256 is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", sha256):
        raise errors.CourseValueError(
            f"sha256={sha256!r}: expected 64 hexadecimal digits (hashlib.sha256(data)"
            ".hexdigest() of the file).")
    sha256 = sha256.lower() if sha256 is not None else None
    timeout_s = errors.check_number("timeout_s", timeout_s, low=0, low_open=True)
    if cache_dir is not None and (isinstance(cache_dir, bool)
                                  or not isinstance(cache_dir, (str, os.PathLike))
                                  or not str(cache_dir).strip()):
        raise errors.CourseTypeError(
            f"cache_dir={cache_dir!r}: expected a folder path (a string or pathlib.Path), "
            "or None for the course's cache.")
    if name in PUBLIC_TEXTS:
        known_url, known_sha, kind = PUBLIC_TEXTS[name]
        url, sha256 = url or known_url, sha256 or known_sha
    elif url is None and sha256 is None:
        errors.check_choice("name", name, tuple(PUBLIC_TEXTS), where="textdata.download")
    elif url is None or sha256 is None:
        missing = "url" if url is None else "sha256"
        raise errors.CourseValueError(
            f"{missing}=None: {name!r} is not a known text ({', '.join(PUBLIC_TEXTS)}), so "
            "it needs both url= (where to fetch it) and sha256= (its SHA-256, to check what "
            "arrives).")
    else:
        kind = name
    heldout_fraction = errors.check_number("heldout_fraction", heldout_fraction, low=0,
                                           high=1, low_open=True, high_open=True)
    folder = pathlib.Path(cache_dir or data_cache_dir()) / "text"
    path = folder / f"{name}.txt"
    if folder.exists() and not folder.is_dir() or path.exists() and not path.is_file():
        raise errors.CourseValueError(
            f"cache_dir: {folder if not folder.is_dir() else path} is not a "
            f"{'folder' if not folder.is_dir() else 'file'}; pass cache_dir= another folder")
    blob = path.read_bytes() if path.is_file() else b""
    if hashlib.sha256(blob).hexdigest() != sha256:
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as response:
                blob = response.read()
        except (OSError, ValueError) as err:
            raise errors.CourseValueError(
                f"could not download {name} from url={url!r} ({type(err).__name__}: {err}); "
                "without internet use textdata.load(), the standard library's source "
                f"(Kaggle: Settings > Internet on), or put the file at {path}") from None
        found = hashlib.sha256(blob).hexdigest()
        if found != sha256:
            raise errors.CourseValueError(
                f"{url} gave {len(blob):,} bytes with SHA-256 {found}, not {sha256}: "
                "a changed or damaged file; nothing was saved. Try again, or pass "
                "url= a mirror of the same file")
        _write_atomically(folder, path, blob)
    data = np.frombuffer(blob, dtype=np.uint8)
    cut = int(round(data.size * (1 - heldout_fraction)))
    if not 0 < cut < data.size:
        raise errors.CourseValueError(
            f"{name} has {data.size} bytes: too few to hold out {heldout_fraction:.0%}")
    return Corpus(data[:cut], data[cut:], url, 1, 1, kind, "tail")


#: What :func:`download`'s ``name`` may be: a file name, never a path.
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def _write_atomically(folder: pathlib.Path, path: pathlib.Path, blob: bytes) -> None:
    """Write ``blob`` to ``path`` (in ``folder``) under a temporary name there, then rename
    it into place: a reader sees the old file or the new one, never half of one."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise errors.CourseValueError(
            f"cache_dir: cannot create {folder} ({err.strerror or err}); pass cache_dir= a "
            "folder you can write to") from None
    tmp = folder / f".{path.name}.{secrets.token_hex(4)}.tmp"
    try:
        with open(tmp, "xb") as f:
            f.write(blob)
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        raise errors.CourseValueError(
            f"cannot save {path} ({err.strerror or err}); pass cache_dir= a folder you can "
            "write to") from None


def _byte_array(name: str, data: Any, *, min_size: int = 0) -> np.ndarray:
    """``data`` as a 1-D array of byte values (0..255), else a course error naming ``name``
    (never cast: 300 would become 44)."""
    if isinstance(data, (str, bytes, bytearray)):
        hint = "np.frombuffer(text.encode(), np.uint8)" if isinstance(data, str) else \
            "np.frombuffer(data, np.uint8)"
        raise errors.CourseTypeError(f"{name}: got {type(data).__name__}; pass a 1-D array of "
                                     f"byte values, {hint}.")
    try:
        array = np.asarray(data)
    except (TypeError, ValueError) as err:
        raise errors.CourseTypeError(f"{name}: expected a 1-D array of byte values, got "
                                     f"{type(data).__name__} ({err}).") from None
    if array.dtype.kind not in "iu" or array.ndim != 1:
        raise errors.CourseTypeError(
            f"{name}: expected a 1-D integer array of byte values (Corpus.train, "
            f"Corpus.heldout), got shape {array.shape} and dtype {array.dtype}.")
    if array.dtype != np.uint8 and array.size:
        low, high = int(array.min()), int(array.max())
        if low < 0 or high > 255:
            bad = low if low < 0 else high
            raise errors.CourseValueError(
                f"{name} holds {bad} (at index {int(np.argmax(array == bad))}): byte values "
                f"are 0..255; the course does not wrap them (cast to bytes, {bad} would count "
                f"as {bad % 256}).")
    if array.size < min_size:
        raise errors.CourseValueError(f"{name} has {array.size} bytes: at least {min_size} "
                                      "are needed.")
    return array


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
    seed = errors.check_int("seed", seed, low=0)
    data = _byte_array("data", data)
    if data.size < length + 1:
        raise errors.CourseValueError(
            f"data of shape {data.shape} is too short for windows of {length + 1} bytes; "
            "pass a 1-D byte array (Corpus.train) or a shorter length")
    starts = np.random.default_rng((seed, step)).integers(0, data.size - length, batch)
    windows = data[starts[:, None] + np.arange(length + 1)].astype(np.int32)
    return windows[:, :-1], windows[:, 1:]


def batches(data: np.ndarray, batch: int, length: int, *, seed: int = 0,
            start_step: int = 0) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``batch_at`` for step ``start_step``, then the next step, and so on, forever.

    The arguments are checked here, when it is called, not at the first batch."""
    batch_at(data, errors.check_int("start_step", start_step, low=0), batch, length, seed)
    return _batches(data, batch, length, seed, start_step)


def _batches(data: np.ndarray, batch: int, length: int, seed: int,
             step: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    while True:
        yield batch_at(data, step, batch, length, seed)
        step += 1


def bits_per_byte(loss_nats: float) -> float:
    """A mean cross-entropy in nats per byte, in bits per byte: ``loss / ln 2``.

    A cross-entropy is never negative: a negative or non-finite loss is refused."""
    if getattr(loss_nats, "shape", None) == () and np.dtype(loss_nats.dtype).kind in "fiu":
        loss_nats = float(loss_nats)  # a numpy or JAX scalar: its value
    return errors.check_number("loss_nats", loss_nats, low=0) / math.log(2)


def unigram_bits_per_byte(train: np.ndarray, heldout: np.ndarray) -> float:
    """Held-out bits per byte of predicting each byte from byte frequencies alone.

    >>> every_byte_once = np.arange(256, dtype=np.uint8)  # smoothed: still uniform
    >>> unigram_bits_per_byte(every_byte_once, np.array([7, 42], np.uint8))
    8.0
    """
    train = _byte_array("train", train)
    heldout = _byte_array("heldout", heldout, min_size=1)
    counts = np.bincount(train, minlength=256) + 1.0  # add-one
    log_p = np.log2(counts / counts.sum())
    return float(-log_p[heldout].mean())


def bigram_bits_per_byte(train: np.ndarray, heldout: np.ndarray) -> float:
    """Held-out bits per byte of predicting each byte from the byte before it."""
    train = _byte_array("train", train).astype(np.int64)
    heldout = _byte_array("heldout", heldout, min_size=2).astype(np.int64)
    pairs = np.bincount(train[:-1] * 256 + train[1:], minlength=256 * 256)
    counts = pairs.reshape(256, 256) + 1.0  # add-one smoothing
    log_p = np.log2(counts / counts.sum(axis=1, keepdims=True))
    return float(-log_p[heldout[:-1], heldout[1:]].mean())
