"""Several processes, one program: chapter 6's multi-process run on one machine.

:func:`launch_local` runs this module's worker (``python -m tpu_course.multihost``) as
several processes on 127.0.0.1, joined by ``jax.distributed`` with gloo CPU
collectives, under a hard timeout; :func:`worker` is what each process runs (chapter 6
shows it): ``jax.distributed.initialize``, a mesh over every process's devices, and
:func:`train_data_parallel`, data-parallel training of ``tpu_course.parallel``'s MLP
block, each process feeding only its slice of every global batch. :func:`check_rows`
runs lab 6's ``process_rows`` the same way. Importing this module imports JAX but starts no backend.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from typing import Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding

from tpu_course import errors, parallel, runtime



def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LaunchError(errors.CourseError, RuntimeError):
    """A multi-process run failed: a rank exited with an error, or the run overran.

    ``rank`` is the first rank that failed (``None`` when the run timed out),
    ``exit_code`` its exit code, ``stderr_tail`` the last lines it wrote to stderr, and
    ``pids`` the process ids of every rank (all of them ended when this is raised).
    """

    def __init__(self, message: str, *, rank: int | None = None, exit_code: int | None = None,
                 stderr_tail: str = "", pids: Sequence[int] = ()):
        super().__init__(message)
        self.rank, self.exit_code, self.stderr_tail, self.pids = rank, exit_code, stderr_tail, tuple(pids)


def _is_json(line: str) -> bool:
    try:
        json.loads(line)
    except ValueError:
        return False
    return True


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _stop(procs: Sequence[subprocess.Popen], grace_s: float = 3.0) -> None:
    """End every process still running: SIGTERM, then SIGKILL after ``grace_s``."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + grace_s
    for proc in procs:
        try:
            proc.wait(timeout=max(deadline - time.monotonic(), 0.01))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def launch_local(num_processes: int = 2, local_devices: int = 2, steps: int = 5,
                 timeout_s: float = 120.0, extra_args: Sequence[str] = ()) -> list[dict]:
    """Run the multi-process worker as ``num_processes`` processes on 127.0.0.1.

    Each process is ``python -m tpu_course.multihost --process-id i ...`` with
    ``local_devices`` CPU devices, joined by ``jax.distributed.initialize`` through a
    coordinator on a free port, with gloo CPU collectives. The ranks inherit this
    process's environment (``PYTHONPATH`` included, with this copy of ``tpu_course``
    first). Returns each process's JSON result.

    Every rank is watched: as soon as one exits with an error, the others are stopped
    (within a few seconds) and :class:`LaunchError` names the rank, its exit code and the
    last lines of its stderr. A rank that hangs ends the run at ``timeout_s``; every
    process is stopped before the error is raised, so nothing is left running.

    On a TPU pod slice the same worker runs once per host, started on all hosts at once::

        gcloud compute tpus tpu-vm ssh NAME --zone ZONE --worker=all \\
            --command="python -m tpu_course.multihost --steps 5"

    (there ``jax.distributed.initialize()`` needs no arguments: it reads the slice's
    metadata).
    """
    num_processes = errors.check_int("num_processes", num_processes, low=1)
    local_devices = errors.check_int("local_devices", local_devices, low=1)
    steps = errors.check_int("steps", steps, low=1)
    timeout_s = errors.check_number("timeout_s", timeout_s, low=0, low_open=True)
    port = free_port()
    env = runtime.cpu_subprocess_env(local_devices, keep_xla_flags=False)
    procs: list[subprocess.Popen] = []
    files = []
    try:
        for i in range(num_processes):
            cmd = [sys.executable, "-m", "tpu_course.multihost", "--coordinator",
                   f"127.0.0.1:{port}", "--num-processes", str(num_processes),
                   "--process-id", str(i), "--steps", str(steps), *extra_args]
            out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
            files.append((out, err))
            procs.append(subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env))
        deadline = time.monotonic() + timeout_s
        failed = None
        while failed is None and any(p.poll() is None for p in procs):
            failed = next((i for i, p in enumerate(procs) if p.poll() not in (None, 0)), None)
            if failed is None and time.monotonic() > deadline:
                hung = [i for i, p in enumerate(procs) if p.poll() is None]
                _stop(procs)
                raise LaunchError(
                    f"multi-process run exceeded {timeout_s:g} s: rank(s) {hung} still running "
                    f"(hung), so all {num_processes} processes were killed. Check that every "
                    "rank started and can reach the coordinator port.",
                    pids=[p.pid for p in procs])
            time.sleep(0.05)
        if failed is None:  # all ended: any failure is among them
            failed = next((i for i, p in enumerate(procs) if p.returncode != 0), None)
        _stop(procs)
        texts = []
        for out, err in files:
            out.seek(0), err.seek(0)
            texts.append((out.read(), err.read()))
        if failed is not None:
            code = procs[failed].returncode
            how = f"exit code {code}" if code >= 0 else f"signal {-code}"
            tail = _tail(texts[failed][1])
            others = [i for i in range(num_processes) if i != failed]
            raise LaunchError(
                f"rank {failed} of {num_processes} failed with {how}; the other rank(s) "
                f"{others} were stopped. Last lines of its stderr:\n{tail or '(nothing)'}",
                rank=failed, exit_code=code, stderr_tail=tail, pids=[p.pid for p in procs])
        results = []
        for i, (out, err) in enumerate(texts):
            # the last line that is a JSON object: gloo may print to stdout after it
            found = next((json.loads(line) for line in reversed(out.strip().splitlines())
                          if line.startswith("{") and _is_json(line)), None)
            if found is None:
                raise LaunchError(f"rank {i} exited cleanly but printed no JSON result; its "
                                  f"stderr ends:\n{_tail(err) or '(nothing)'}", rank=i,
                                  exit_code=0, stderr_tail=_tail(err),
                                  pids=[p.pid for p in procs])
            results.append(found)
        return results
    finally:
        _stop(procs)
        for out, err in files:
            out.close(), err.close()


def multihost_problem(seed: int = 0, batch: int = 32, d_model: int = 16, d_ff: int = 64,
                      steps: int = 5) -> tuple[dict, np.ndarray, np.ndarray]:
    """The small regression every process (and the single-process reference) trains on."""
    params = parallel.mlp_block_params(d_model, d_ff, seed)
    rng = np.random.default_rng(seed + 1)
    x = rng.standard_normal((steps, batch, d_model)).astype(np.float32)
    y = np.tanh(x @ rng.standard_normal((d_model, d_model)).astype(np.float32))
    return params, x, y


def train_data_parallel(mesh: Mesh, steps: int, process_index: int = 0,
                        process_count: int = 1, lr: float = 0.1) -> dict:
    """Data-parallel training of the MLP block over every device of ``mesh``, in every
    process.

    Every process runs this same function. Each one makes the same global batch here (a
    real job would have each host read only its own files) and hands only its rows to
    ``jax.make_array_from_process_local_data``, which assembles one global array whose
    shards live on the devices of all processes. The step is the chapter's shard_map
    data-parallel step; its psum crosses processes like any other device.

    Returns the losses and the trained parameters, gathered to every process with
    ``process_allgather`` (a sharded array cannot be turned into numpy by a process that
    holds only some of its shards).
    """
    params, x, y = multihost_problem(steps=steps)
    axis = mesh.axis_names[0]
    pspec, xspec = parallel.mlp_block_specs("dp", axis)
    step = parallel.mlp_block_step("dp", mesh, lr)
    p = parallel.place(params, mesh, pspec)
    sharding = NamedSharding(mesh, xspec)
    # This process's devices come one after another in the mesh (jax.make_mesh orders
    # them so), so its rows of the global batch are one contiguous block.
    per = x.shape[1] // process_count
    rows = slice(process_index * per, (process_index + 1) * per)
    losses = []
    for t in range(steps):
        xb = jax.make_array_from_process_local_data(sharding, x[t, rows], x.shape[1:])
        yb = jax.make_array_from_process_local_data(sharding, y[t, rows], y.shape[1:])
        p, loss = step(p, xb, yb)
        losses.append(float(loss))  # the loss is replicated: every process has it whole
    from jax.experimental import multihost_utils

    trained = {k: np.asarray(multihost_utils.process_allgather(v, tiled=True))
               for k, v in p.items()}
    return {"losses": losses, "params": trained}


def worker(coordinator: str | None = None, num_processes: int | None = None,
           process_id: int | None = None, steps: int = 5,
           checkpoint_dir: str | None = None) -> dict:
    """What each process of a multi-process run executes: the same program on every
    host.

    ``jax.distributed.initialize`` joins this process to the others (on a TPU pod slice
    it takes no arguments: it reads the slice's metadata). After it, ``jax.devices()``
    lists the devices of every process and ``jax.local_devices()`` this process's own;
    the mesh spans them all. Only process 0 writes the checkpoint: every process holds
    the same gathered parameters, and one writer is enough.
    """
    if os.environ.get("JAX_PLATFORMS", "") == "cpu":
        # CPU devices of different processes talk through gloo (JAX's default on recent
        # versions; set explicitly for older ones).
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator, num_processes, process_id)
    mesh = jax.make_mesh((jax.device_count(),), ("data",), axis_types=(AxisType.Auto,))
    out = train_data_parallel(mesh, steps, jax.process_index(), jax.process_count())
    if checkpoint_dir is not None and jax.process_index() == 0:
        path = os.path.join(checkpoint_dir, f"mlp_block_step{steps}.npz")
        np.savez(path, **out["params"])
    return {"losses": out["losses"],
            "w1_sum": float(np.sum(out["params"]["w1"], dtype=np.float64)),
            "process_index": jax.process_index(), "process_count": jax.process_count(),
            "local_devices": jax.local_device_count(),
            "global_devices": jax.device_count()}


# ------------------------------------------------------- lab 6's check of process_rows


def rows_mesh(kind: str) -> Mesh:
    """A mesh whose processes' devices are not contiguous (lab 6's check).

    ``"interleaved"``: one ``data`` axis over the devices taken as (process 0's first,
    process 1's first, ..., process 0's second, ...). ``"replicated"``: a ``(data,
    model)`` grid with one row per process, so all the devices of a process hold
    replicas of the same block of the batch.
    """
    by_process: dict[int, list] = {}
    for d in sorted(jax.devices(), key=lambda d: d.id):
        by_process.setdefault(d.process_index, []).append(d)
    columns = [by_process[p] for p in sorted(by_process)]
    devices = [column[i] for i in range(len(columns[0])) for column in columns]
    if kind == "interleaved":
        return Mesh(np.asarray(devices, dtype=object), ("data",), axis_types=(AxisType.Auto,))
    if kind == "replicated":
        grid = np.asarray(columns, dtype=object)  # row p: process p's devices
        return Mesh(grid, ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    raise errors.CourseValueError(f"mesh kind must be 'interleaved' or 'replicated', got {kind!r}")


def check_rows(path: str, name: str, mesh_kind: str, rows: int = 16) -> dict:
    """Run a learner's ``name(global_batch, sharding)`` from the file ``path`` in this process.

    The global batch's row ``i`` holds ``i`` everywhere. Returns the rows this process
    fed, the rows its devices hold, and the global batch as assembled from every
    process's rows (gathered back with ``process_allgather``).
    """
    import runpy

    from jax.experimental import multihost_utils

    fn = runpy.run_path(path)[name]
    mesh = rows_mesh(mesh_kind)
    sharding = NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    batch = np.repeat(np.arange(rows, dtype=np.float32)[:, None], 3, axis=1)
    local = np.asarray(fn(batch.copy(), sharding))
    held = sorted({(i[0].start or 0) for i in sharding.addressable_devices_indices_map(batch.shape).values()})
    block = rows // mesh.shape["data"]
    arr = jax.make_array_from_process_local_data(sharding, local, batch.shape)
    back = np.asarray(multihost_utils.process_allgather(arr, tiled=True))
    return {"fed": local[:, 0].astype(int).tolist() if local.ndim == 2 else None,
            "fed_shape": list(local.shape),
            "held": [r for s in held for r in range(s, s + block)],
            "assembled": back[:, 0].astype(int).tolist(),
            "process_index": jax.process_index()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Chapter 6 multi-process worker: DP training "
                                 "of an MLP block with jax.distributed.")
    ap.add_argument("--coordinator", default=None, help="host:port of process 0 (omit on a TPU pod)")
    ap.add_argument("--num-processes", type=int, default=None)
    ap.add_argument("--process-id", type=int, default=None)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--checkpoint-dir", default=None, help="where process 0 writes the weights")
    ap.add_argument("--rows-from", default=None, help="lab 6: a file defining process_rows")
    ap.add_argument("--rows-name", default="process_rows")
    ap.add_argument("--rows-mesh", default="interleaved")
    ap.add_argument("--rows", type=int, default=16)
    a = ap.parse_args(argv)
    if a.rows_from is None:
        out = worker(a.coordinator, a.num_processes, a.process_id, a.steps, a.checkpoint_dir)
    else:
        if os.environ.get("JAX_PLATFORMS", "") == "cpu":
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(a.coordinator, a.num_processes, a.process_id)
        out = check_rows(a.rows_from, a.rows_name, a.rows_mesh, a.rows)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
