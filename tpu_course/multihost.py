"""Several processes, one program: chapter 6's multi-process run on one machine.

:func:`launch_local` runs this module's worker (``python -m tpu_course.multihost``) as
several processes on 127.0.0.1, joined by ``jax.distributed`` with gloo CPU
collectives, under a hard timeout; :func:`train_data_parallel` is what each process
runs: data-parallel training of ``tpu_course.parallel``'s MLP block, each process
feeding only its slice of every global batch. ``python -m tpu_course.parallel`` still
starts the same worker. Importing this module imports JAX but starts no backend.
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
from jax.sharding import Mesh, NamedSharding

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
            lines = out.strip().splitlines()
            try:
                results.append(json.loads(lines[-1]))
            except (IndexError, ValueError):
                raise LaunchError(f"rank {i} exited cleanly but printed no JSON result; its "
                                  f"stderr ends:\n{_tail(err) or '(nothing)'}", rank=i,
                                  exit_code=0, stderr_tail=_tail(err),
                                  pids=[p.pid for p in procs]) from None
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
    """DP training of the MLP block over every device of ``mesh`` (all processes).

    Each process holds only its slice of every global batch and hands it to
    ``jax.make_array_from_process_local_data``, which assembles the global array.
    """
    params, x, y = multihost_problem(steps=steps)
    axis = mesh.axis_names[0]
    pspec, xspec = parallel.mlp_block_specs("dp", axis)
    step = parallel.mlp_block_step("dp", mesh, lr)
    p = parallel.place(params, mesh, pspec)
    sharding = NamedSharding(mesh, xspec)
    per = x.shape[1] // process_count
    rows = slice(process_index * per, (process_index + 1) * per)
    losses = []
    for t in range(steps):
        xb = jax.make_array_from_process_local_data(sharding, x[t, rows], x.shape[1:])
        yb = jax.make_array_from_process_local_data(sharding, y[t, rows], y.shape[1:])
        p, loss = step(p, xb, yb)
        losses.append(float(loss))
    from jax.experimental import multihost_utils

    w1 = np.asarray(multihost_utils.process_allgather(p["w1"], tiled=True))
    return {"losses": losses, "w1_sum": float(np.sum(w1, dtype=np.float64))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Chapter 6 multi-process worker: DP training "
                                 "of an MLP block with jax.distributed.")
    ap.add_argument("--coordinator", default=None, help="host:port of process 0 (omit on a TPU pod)")
    ap.add_argument("--num-processes", type=int, default=None)
    ap.add_argument("--process-id", type=int, default=None)
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args(argv)
    if os.environ.get("JAX_PLATFORMS", "") == "cpu":
        # CPU devices of different processes talk through gloo (JAX's default on recent
        # versions; set explicitly for older ones).
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(a.coordinator, a.num_processes, a.process_id)
    mesh = parallel.make_mesh((jax.device_count(),), ("data",))
    out = train_data_parallel(mesh, a.steps, jax.process_index(), jax.process_count())
    out.update(process_index=jax.process_index(), process_count=jax.process_count(),
               local_devices=jax.local_device_count(), global_devices=jax.device_count())
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
