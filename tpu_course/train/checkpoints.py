"""Checkpoints of a :class:`~tpu_course.train.step.TrainState`, through Orbax.

A checkpoint directory holds one sub-directory per saved step, named by the step::

    DIR/12/state/...            the arrays (Orbax's StandardSave of the whole pytree)
    DIR/12/tpu_course.json      the course's manifest: the caller's metadata, each leaf's
                                pytree path, shape, dtype and SHA-256, and the SHA-256 and
                                size of every file Orbax wrote under state/

The manifest is what makes a step the course's: a folder without one (a learner's
``2023/`` or ``7/``, a stray ``0/junk.txt``) is never read, overwritten or deleted, only
named in the messages. A step is written under a temporary name and renamed to
``DIR/12`` once its manifest is complete, so an interrupted save never leaves a step
that looks finished; ``max_to_keep`` deletes only the files an older step's manifest
lists. The temporary name is unique to each save (``DIR/12.<random>.tpu-course-tmp``):
a folder that is already there under a temporary-looking name (an interrupted save, or
someone else's) is never deleted, only named in a :class:`CheckpointWarning`.

Restoring compares the saved structure with the state it restores into first (a
checkpoint of another model or optimizer is refused with the first leaf that differs),
then checks every file against the manifest and every restored leaf against its
checksum: a truncated, deleted or altered file gives a :class:`CheckpointDamagedError`
naming the step, the file and the leaf, and what to do, never garbage parameters.

``train.fit(config, checkpoint_dir=..., resume=True)`` saves after every epoch and
resumes from the last one, refusing a checkpoint written under another config
(:meth:`~tpu_course.train.config.TrainConfig.differences`). One process writes a
checkpoint (the course's runs are single-process).
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import secrets
import warnings
from typing import Any

import jax
import numpy as np

from tpu_course import errors

#: The manifest file that marks a step folder as the course's, and its format tag.
MANIFEST = "tpu_course.json"
FORMAT = "tpu_course.train.checkpoints/2"
_TMP_SUFFIX = ".tpu-course-tmp"


class CheckpointDamagedError(errors.CourseValueError):
    """A step the course saved no longer reads back as it was written."""


class CheckpointWarning(UserWarning):
    """Something in a checkpoint directory the course left alone, and says so."""


def _a(value: Any) -> str:
    """``'a numpy.ndarray'``, ``'a set'``, ``'an int'``: the type of ``value``, for a message."""
    kind = type(value)
    name = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__.split('.')[0]}.{kind.__name__}"
    return f"{'an' if name[0].lower() in 'aeiou' else 'a'} {name}"


def _check_state(state: Any, name: str) -> None:
    """A course error unless ``state`` is a pytree of arrays, with at least one."""
    leaves = jax.tree.leaves(state)
    if not leaves:
        raise errors.CourseValueError(
            f"{name}={state!r}: expected a pytree of arrays (a TrainState, a dict of "
            "arrays), got one with no arrays in it.")
    if len(leaves) == 1 and leaves[0] is state:
        raise errors.CourseTypeError(
            f"{name}: expected a pytree of arrays (a TrainState, a dict of arrays), got a single "
            f"{_a(state)[2:] if _a(state).startswith('a ') else _a(state)[3:]}; wrap it, e.g. "
            "{'w': x}.")
    for leaf in leaves:
        if not (hasattr(leaf, "shape") and hasattr(leaf, "dtype")):
            hint = f" (np.asarray({leaf!r}))" if isinstance(leaf, (int, float)) else ""
            raise errors.CourseTypeError(
                f"{name}: expected a pytree of arrays (a TrainState, a dict of arrays), but it "
                f"holds {_a(leaf)} ({leaf!r:.60}); pass it as an array{hint}.")


def _structure(state: Any) -> list[list]:
    """``[path, shape, dtype]`` of every leaf (JSON-able)."""
    return [[jax.tree_util.keystr(path), list(x.shape), str(x.dtype)]
            for path, x in jax.tree_util.tree_flatten_with_path(state)[0]]


def _leaf_sha256(state: Any) -> list[str]:
    """The SHA-256 of every leaf's bytes, in tree order (fetched to the host)."""
    return [hashlib.sha256(np.ascontiguousarray(np.asarray(x)).tobytes()).hexdigest()
            for x in jax.tree.leaves(state)]


def _file_sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def check_directory(directory: Any, what: str = "checkpoint_dir") -> pathlib.Path:
    """``directory`` as an absolute path that is, or can become, a folder; else a course error.

    Refuses a value that is not a path, a path that is a file, and a path under a file,
    before anything is trained or written. Creates nothing.
    """
    if isinstance(directory, bool) or not isinstance(directory, (str, os.PathLike)):
        raise errors.CourseTypeError(f"{what}={directory!r}: expected a folder path (a string "
                                     f"or pathlib.Path), got {_a(directory)}.")
    if not str(directory).strip():
        raise errors.CourseValueError(f"{what}={directory!r}: expected a folder path, got an "
                                      "empty string.")
    path = pathlib.Path(directory).absolute()  # Orbax refuses a relative path
    if path.exists() and not path.is_dir():
        raise errors.CourseValueError(
            f"{what}={str(directory)!r} is a file, not a folder: checkpoints are folders of "
            f"steps. Pass a folder (it is created if missing), e.g. {str(path) + '_checkpoints'!r}.")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise errors.CourseValueError(
                    f"{what}={str(directory)!r} cannot be created: {parent} is a file. "
                    "Pass a folder whose parents are folders.")
            break
    return path


def step_folders(path: pathlib.Path) -> tuple[dict[int, pathlib.Path], dict[int, pathlib.Path]]:
    """``(course, foreign)``: the step-named folders of ``path`` with the course's manifest,
    and those without one (not the course's: never read, overwritten or deleted)."""
    course, foreign = {}, {}
    if path.is_dir():
        for entry in path.iterdir():
            if entry.name.isdigit() and entry.name == str(int(entry.name)) and entry.is_dir():
                (course if (entry / MANIFEST).is_file() else foreign)[int(entry.name)] = entry
    return dict(sorted(course.items())), dict(sorted(foreign.items()))


def _describe_foreign(foreign: dict[int, pathlib.Path]) -> str:
    """``'0/ (holds junk.txt)'``... for the messages; empty when there is none."""
    if not foreign:
        return ""
    parts = []
    for step, folder in list(foreign.items())[:5]:
        names = sorted(p.name for p in folder.iterdir())
        held = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "") if names else "nothing"
        orbax = (folder / "_CHECKPOINT_METADATA").exists()
        parts.append(f"{step}/ (holds {held}" + ("; an Orbax checkpoint without the course's "
                     "manifest: another program's, or an older course version's" if orbax else "")
                     + ")")
    more = f" and {len(foreign) - 5} more" if len(foreign) > 5 else ""
    return (f" Folders named like steps but not written by the course (no {MANIFEST}; never "
            f"read or deleted): {'; '.join(parts)}{more}.")


def latest_step(directory: str | os.PathLike) -> int | None:
    """The newest step the course saved in ``directory``, or None when there is none (or no
    directory). Folders named like steps that the course did not write do not count."""
    course, _ = step_folders(check_directory(directory, "directory"))
    return max(course) if course else None


def _check_metadata(metadata: Any) -> dict:
    """``metadata`` when JSON can hold it exactly; else a course error naming the key."""
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise errors.CourseTypeError(f"metadata={metadata!r}: expected a dict (JSON-able), got "
                                     f"{_a(metadata)}.")

    def find(value: Any, where: str) -> str | None:  # the first value JSON cannot hold
        if isinstance(value, dict):
            for k, v in value.items():
                if not isinstance(k, str):
                    return f"{where} has the key {k!r}, {_a(k)} (JSON keys are strings)"
                bad = find(v, f"{where}[{k!r}]")
                if bad:
                    return bad
            return None
        if isinstance(value, (list, tuple)):
            return next((b for i, v in enumerate(value) if (b := find(v, f"{where}[{i}]"))), None)
        if value is None or isinstance(value, (str, bool, int, float)):
            return None
        return f"{where} is {_a(value)}"

    bad = find(metadata, "metadata")
    if bad:
        raise errors.CourseTypeError(
            f"{bad}, which JSON cannot hold: nothing was saved. Pass numbers, strings, bools, "
            "None, lists and dicts with string keys (an array: x.tolist(); a set: sorted(x)).")
    return metadata


def save_checkpoint(directory: str | os.PathLike, state: Any, metadata: dict | None = None, *,
                    step: int | None = None, max_to_keep: int | None = None) -> pathlib.Path:
    """Save ``state`` (and JSON-able ``metadata``) as step ``step`` of ``directory``.

    ``step`` defaults to ``state.step``; ``max_to_keep`` deletes the oldest of the
    course's steps beyond that many (None keeps all; folders the course did not write
    are never touched). A step that exists already is refused. Returns the step's
    directory. Waits until written.
    """
    import orbax.checkpoint as ocp

    path = check_directory(directory, "directory")
    if step is None and not hasattr(state, "step"):
        raise errors.CourseValueError(
            f"step=None: state ({_a(state)}) has no .step to number the save by; pass step=.")
    _check_state(state, "state")
    step = int(state.step) if step is None else errors.check_int("step", step, low=0)
    if max_to_keep is not None:
        errors.check_int("max_to_keep", max_to_keep, low=1)
    metadata = _check_metadata(metadata)
    final = path / str(step)
    if final.exists():
        ours = (final / MANIFEST).is_file()
        raise errors.CourseValueError(
            f"{final} exists already"
            + (" (a step the course saved): the course does not overwrite a checkpoint. Save "
               "under another step, or delete that folder first." if ours else
               f" and is not a checkpoint the course wrote (no {MANIFEST}): the course does "
               "not touch it. Save under another step, or into another directory."))
    path.mkdir(parents=True, exist_ok=True)
    left = sorted(p.name for p in path.glob(f"{step}.*") if p.name.endswith(_TMP_SUFFIX))
    if left:  # an interrupted save, or someone else's folder: never deleted
        warnings.warn(
            f"{path} holds {', '.join(left)}: left alone (an interrupted save, or not the "
            "course's; it is never deleted). Delete it yourself once you know it holds "
            "nothing you need.", CheckpointWarning, stacklevel=2)
    tmp = _new_tmp(path, step)
    try:
        checkpointer = ocp.Checkpointer(ocp.StandardCheckpointHandler())
        try:
            checkpointer.save(tmp / "state", args=ocp.args.StandardSave(state))
        finally:
            checkpointer.close()
        files = {str(p.relative_to(tmp)): {"bytes": p.stat().st_size, "sha256": _file_sha256(p)}
                 for p in sorted((tmp / "state").rglob("*")) if p.is_file()}
        manifest = {"format": FORMAT, "step": step, "metadata": metadata,
                    "structure": _structure(state), "leaf_sha256": _leaf_sha256(state),
                    "files": files}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if max_to_keep is not None:
        course, _ = step_folders(path)
        for old in [s for s in course if s != step][: max(0, len(course) - max_to_keep)]:
            _delete_step(course[old])
    return final


def _new_tmp(path: pathlib.Path, step: int) -> pathlib.Path:
    """A new, empty folder ``path/<step>.<random>.tpu-course-tmp`` that no one else has."""
    while True:
        tmp = path / f"{step}.{secrets.token_hex(4)}{_TMP_SUFFIX}"
        try:
            tmp.mkdir()
            return tmp
        except FileExistsError:  # taken (1 in 4 billion): draw another name
            continue


def _delete_step(folder: pathlib.Path) -> None:
    """Delete what the course wrote in a step folder (the files its manifest lists, then
    the folders left empty); anything else found there stays."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        listed = list(manifest["files"]) if manifest.get("format") == FORMAT else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        listed = None
    if listed is None:  # damaged or not ours: keep it
        return
    for name in listed:
        (folder / name).unlink(missing_ok=True)
    (folder / MANIFEST).unlink(missing_ok=True)
    for sub in sorted((p for p in folder.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        if not any(sub.iterdir()):
            sub.rmdir()
    if not any(folder.iterdir()):
        folder.rmdir()


def _damaged(path: pathlib.Path, step: int, problems: list[str], others: list[int]) -> CheckpointDamagedError:
    earlier = [s for s in others if s < step]
    fix = (f"Restore an earlier step (step={earlier[-1]}; the course's steps there: {others})"
           if earlier else "There is no earlier step to restore")
    return CheckpointDamagedError(
        f"checkpoint step {step} in {path} is damaged: {'; '.join(problems)}. {fix}, or delete "
        f"{path / str(step)} and train that step again (fit(..., resume=True) continues from the "
        "newest step left).")


def _read_manifest(path: pathlib.Path, step: int, steps: list[int]) -> dict:
    file = path / str(step) / MANIFEST
    try:
        manifest = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise _damaged(path, step, [f"{step}/{MANIFEST} cannot be read as JSON ({e})"], steps) from None
    keys = ("format", "metadata", "structure", "leaf_sha256", "files")
    if not isinstance(manifest, dict) or any(k not in manifest for k in keys):
        raise _damaged(path, step, [f"{step}/{MANIFEST} lacks the course's fields"], steps)
    if manifest["format"] != FORMAT:
        raise errors.CourseValueError(
            f"checkpoint step {step} in {path} has format {manifest['format']!r}; this version of "
            f"the course reads {FORMAT!r}. Train it again into a new directory.")
    return manifest


def _check_files(path: pathlib.Path, step: int, files: dict) -> list[str]:
    """One line per file of the step that is missing, truncated or altered."""
    problems = []
    for name, want in files.items():
        file = path / str(step) / name
        if not file.is_file():
            problems.append(f"{step}/{name} is missing")
        elif file.stat().st_size != want["bytes"]:
            problems.append(f"{step}/{name} has {file.stat().st_size} bytes, {want['bytes']} were "
                            "saved (truncated or overwritten)")
        elif _file_sha256(file) != want["sha256"]:
            problems.append(f"{step}/{name} differs from what was saved (SHA-256)")
    return problems


def _warn_newer_foreign(path: pathlib.Path, step: int, foreign: dict[int, pathlib.Path]) -> None:
    """A :class:`CheckpointWarning` when folders named like later steps were passed over
    (no manifest: an interrupted save, a deleted manifest, or not the course's)."""
    newer = [s for s in foreign if s > step]
    if newer:
        names = ", ".join(f"{s}/" for s in newer[:5]) + (" ..." if len(newer) > 5 else "")
        warnings.warn(
            f"restoring step {step} of {path}, the newest the course saved and can check; "
            f"{names} {'is' if len(newer) == 1 else 'are'} newer but {'has' if len(newer) == 1 else 'have'} "
            f"no {MANIFEST} (a save that did not finish, a manifest deleted, or not the "
            "course's), so it was not read. If it is a run of yours, restore it with the "
            "program that wrote it; if it is a broken save, delete it.",
            CheckpointWarning, stacklevel=3)


def saved_metadata(directory: str | os.PathLike, step: int | None = None) -> dict:
    """The metadata saved with step ``step`` (default: the newest) of ``directory``, read
    from its manifest without loading any array (to compare a run's settings before
    restoring). A course error when there is no such step."""
    path = check_directory(directory, "directory")
    course, foreign = step_folders(path)
    steps = list(course)
    if step is None:
        if not steps:
            raise errors.CourseValueError(
                f"no checkpoint in directory={str(directory)!r} (the course's steps there: []); "
                f"save one with save_checkpoint.{_describe_foreign(foreign)}")
        step = steps[-1]
    step = errors.check_int("step", step, low=0)
    if step not in course:
        raise errors.CourseValueError(
            f"no checkpoint of step {step} in directory={str(directory)!r} (the course's steps "
            f"there: {steps}).{_describe_foreign(foreign)}")
    return _read_manifest(path, step, steps)["metadata"]


def restore_checkpoint(directory: str | os.PathLike, like: Any,
                       step: int | None = None) -> tuple[Any, dict]:
    """Restore step ``step`` (default: the newest) of ``directory`` into the structure of ``like``.

    Returns ``(state, metadata)``. ``like`` gives the tree structure, shapes, dtypes and
    placement (e.g. a fresh ``init_state``; each array lands on ``like``'s sharding); a
    mismatch raises ``CourseValueError`` naming the first differing leaf. A step whose
    files or leaves differ from their checksums raises :class:`CheckpointDamagedError`
    naming the step, the file and the leaf. When the newest step is restored and
    folders named like later steps have no manifest (a save that did not finish, a
    deleted manifest), a :class:`CheckpointWarning` names them: never passed over in
    silence.
    """
    import orbax.checkpoint as ocp

    path = check_directory(directory, "directory")
    if not path.is_dir():
        raise errors.CourseValueError(f"no checkpoint directory: directory={str(directory)!r} "
                                      "does not exist; save one with save_checkpoint, or pass "
                                      "the folder your checkpoints are in")
    _check_state(like, "like")
    course, foreign = step_folders(path)
    steps = list(course)
    newest_default = step is None
    if step is not None:
        step = errors.check_int("step", step, low=0)
    else:
        step = steps[-1] if steps else None
    if step is None or step not in course:
        raise errors.CourseValueError(
            f"no checkpoint{'' if step is None else f' of step {step}'} in directory="
            f"{str(directory)!r} "
            f"(the course's steps there: {steps}); save one with save_checkpoint, or pass the "
            f"folder your checkpoints are in.{_describe_foreign(foreign)}")
    if newest_default:
        _warn_newer_foreign(path, step, foreign)
    manifest = _read_manifest(path, step, steps)
    saved, want = manifest["structure"], _structure(like)
    if saved != want:
        diff = next((f"{a[0]} is {a[1]} {a[2]} there, expected {b[1]} {b[2]}"
                     for a, b in zip(saved, want) if a != b),
                    f"{len(saved)} leaves there, {len(want)} expected")
        raise errors.CourseValueError(
            f"checkpoint {directory} (step {step}) does not match like, the state to restore "
            f"into (this model/optimizer): {diff}. Restore into the state of the same model "
            "and optimizer.")
    problems = _check_files(path, step, manifest["files"])
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)), like)
    checkpointer = ocp.Checkpointer(ocp.StandardCheckpointHandler())
    try:
        state = checkpointer.restore(path / str(step) / "state", args=ocp.args.StandardRestore(abstract))
    except Exception as e:  # noqa: BLE001 - Orbax/TensorStore raise bare Exceptions
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise _damaged(path, step, problems or [f"Orbax could not read {step}/state: {first}"],
                       steps) from None
    finally:
        checkpointer.close()
    names = [s[0] for s in saved]
    bad = [n for n, a, b in zip(names, _leaf_sha256(state), manifest["leaf_sha256"]) if a != b]
    if bad:
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        which = f"leaf {bad[0]} differs" if len(bad) == 1 else f"leaves {', '.join(bad[:3])}{more} differ"
        problems.insert(0, f"{which} from what was saved (SHA-256)")
    if problems:
        raise _damaged(path, step, problems, steps)
    return state, manifest["metadata"]
