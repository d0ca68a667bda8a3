"""Checkpoints of a :class:`~tpu_course.train.step.TrainState`, through Orbax.

A checkpoint directory holds one sub-directory per saved step (Orbax's
``CheckpointManager`` layout), each with the state (``StandardSave``: every array of
the pytree) and a JSON item: the caller's metadata and the state's structure (each
leaf's pytree path, shape and dtype). Restoring compares that structure with the state
it restores into first, so a checkpoint of another model or optimizer is refused with
the first leaf that differs rather than an error from deep inside Orbax. Orbax writes a
step to a temporary name and renames it when complete, so an interrupted save never
leaves a broken checkpoint.

``train.fit(config, checkpoint_dir=..., resume=True)`` saves after every epoch and
resumes from the last one, refusing a checkpoint written under another config
(:meth:`~tpu_course.train.config.TrainConfig.differences`).
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

import jax

from tpu_course import errors


def _structure(state: Any) -> list[list]:
    """``[path, shape, dtype]`` of every leaf (JSON-able)."""
    return [[jax.tree_util.keystr(path), list(x.shape), str(x.dtype)]
            for path, x in jax.tree_util.tree_flatten_with_path(state)[0]]


def _manager(directory: str | os.PathLike, max_to_keep: int | None = None) -> Any:
    import orbax.checkpoint as ocp

    path = pathlib.Path(directory).absolute()  # Orbax refuses a relative path
    return ocp.CheckpointManager(path, options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep))


def latest_step(directory: str | os.PathLike) -> int | None:
    """The newest step saved in ``directory``, or None when there is none (or no directory)."""
    if not pathlib.Path(directory).is_dir():
        return None
    manager = _manager(directory)
    try:
        return manager.latest_step()
    finally:
        manager.close()


def save_checkpoint(directory: str | os.PathLike, state: Any, metadata: dict | None = None, *,
                    step: int | None = None, max_to_keep: int | None = None) -> pathlib.Path:
    """Save ``state`` (and JSON-able ``metadata``) as step ``step`` of ``directory``.

    ``step`` defaults to ``state.step``; ``max_to_keep`` deletes the oldest steps beyond
    that many (None keeps all). Returns the step's directory. Waits until written.
    """
    import orbax.checkpoint as ocp

    step = int(state.step) if step is None else errors.check_int("step", step, low=0)
    meta = {"metadata": metadata or {}, "structure": _structure(state)}
    manager = _manager(directory, max_to_keep)
    try:
        manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                   meta=ocp.args.JsonSave(meta)), force=True)
        manager.wait_until_finished()
    finally:
        manager.close()
    return pathlib.Path(directory).absolute() / str(step)


def restore_checkpoint(directory: str | os.PathLike, like: Any,
                       step: int | None = None) -> tuple[Any, dict]:
    """Restore step ``step`` (default: the newest) of ``directory`` into the structure of ``like``.

    Returns ``(state, metadata)``. ``like`` gives the tree structure, shapes, dtypes and
    placement (e.g. a fresh ``init_state``; each array lands on ``like``'s sharding); a
    mismatch raises ``CourseValueError`` naming the first differing leaf.
    """
    import orbax.checkpoint as ocp

    if not pathlib.Path(directory).is_dir():
        raise errors.CourseValueError(f"no checkpoint directory {directory}; save one with save_checkpoint")
    manager = _manager(directory)
    try:
        step = manager.latest_step() if step is None else step
        if step is None or step not in manager.all_steps():
            raise errors.CourseValueError(
                f"no checkpoint{'' if step is None else f' of step {step}'} in {directory} "
                f"(steps saved there: {list(manager.all_steps())}); save one with save_checkpoint")
        meta = manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
        saved, want = meta["structure"], _structure(like)
        if saved != want:
            diff = next((f"{a[0]} is {a[1]} {a[2]} there, expected {b[1]} {b[2]}"
                         for a, b in zip(saved, want) if a != b),
                        f"{len(saved)} leaves there, {len(want)} expected")
            raise errors.CourseValueError(
                f"checkpoint {directory} (step {step}) does not match this model/optimizer: {diff}. "
                "Restore into the state of the same model and optimizer.")
        abstract = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)), like)
        state = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract))).state
    finally:
        manager.close()
    return state, meta["metadata"]
