"""``tpu-course preflight``: does the course run on this runtime? One row per chapter.

The day before a workshop, run it on the runtime the room will use (a Colab TPU, a
Kaggle v5e-8, a laptop CPU) and file its JSON record. It runs the *core* of each
chapter, not the notebooks, so the whole check takes well under a minute on a CPU:

====  ====================================================================================
ch1   a small systolic-array simulation (``systolic.simulate``) checked against numpy
ch2   device placement and a timed matmul through the harness (``bench.benchmark``)
ch3   ``jit``, ``grad`` and ``vmap`` against references, and a parity check (``parity``)
ch4   ``hlo.inspect`` on this backend and, when the TPU compiler is installed, on a
      compile-only ``v5e:1x1`` target
ch5   a few training steps and an evaluation on Fashion-MNIST, the data lab 5 and its
      grading use (``train.fit``)
ch6   a mesh of 8 simulated devices, one sharded step checked against one device, and its
      collectives; with ``--multihost`` also the two-process run (``multihost.launch_local``)
ch7   a tiny Pallas kernel run in TPU interpret mode against ``jnp``, and compiled for a
      compile-only ``v5e:1x1`` target when the TPU compiler is installed
====  ====================================================================================

Each row is ``ok``, ``failed`` (the reason and the fix) or ``skipped`` (why), with its
seconds; the exit status is 1 when any chapter failed. An ``XLA_FLAGS`` that XLA would
refuse (it kills the process as JAX starts) is the first row, ``XLA_FLAGS failed``, and
the chapters that need JAX are skipped. ``--json PATH`` is checked before anything runs
(a folder, a path under a file, a folder that cannot be written, an existing file that
is not an earlier preflight record: each refused by name), and the table is printed
before the record is written, so a path that fails at the end loses nothing. Command line::

    tpu-course preflight [--json PATH] [--multihost] [--chapters 1,5]
    python -m tpu_course preflight --json bench/results/preflight-colab-v5e1.json

From a notebook cell (Colab: the kernel holds the TPU, so everything but the simulated
mesh runs in the kernel itself)::

    from tpu_course import preflight
    preflight.run(json_path="preflight.json")     # shows the table

Simulated devices must be asked for before JAX starts. The command line does that first
(8 CPU devices). In a kernel where JAX already started with fewer CPU devices, chapter 6
runs in a separate CPU-only process (``JAX_PLATFORMS=cpu`` and the device-count flag), so
it never competes with the kernel for the TPU; its row says so.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.metadata
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Callable, Sequence

from tpu_course import errors

CHAPTERS = (1, 2, 3, 4, 5, 6, 7, 8)
#: Chapters whose check runs without JAX (numpy only): they run even when JAX cannot start.
_WITHOUT_JAX = (1,)
OK, FAILED, SKIPPED = "ok", "failed", "skipped"
#: Simulated CPU devices for chapter 6 (as the chapter uses).
MESH_DEVICES = 8
#: A chapter-6 subprocess that takes longer than this is reported as failed.
SUBPROCESS_TIMEOUT_S = 180.0
_PACKAGES = ("jax", "jaxlib", "libtpu", "flax", "optax", "orbax-checkpoint", "numpy")


class Skip(Exception):
    """Raised by a chapter's check when this runtime cannot run it; the message says why."""


class Failure(Exception):
    """A chapter's check found a problem; ``fix`` says what to do about it."""

    def __init__(self, reason: str, fix: str = "") -> None:
        super().__init__(reason)
        self.fix = fix


class RecordPathError(errors.CourseValueError):
    """``--json PATH`` (``json_path``) cannot take the record; the message says why.

    Raised before any chapter runs, or, when writing fails at the end anyway (a full
    disk), after the table was printed; then ``report`` holds the whole result."""

    def __init__(self, message: str, report: "Report | None" = None) -> None:
        super().__init__(message)
        self.report = report


#: The row that reports an ``XLA_FLAGS`` XLA would refuse, before the chapters.
FLAGS_ROW = "XLA_FLAGS"


@dataclasses.dataclass
class Row:
    """One chapter's outcome (``chapter`` is :data:`FLAGS_ROW` for the flags' row)."""

    chapter: int | str
    status: str  # "ok" | "failed" | "skipped"
    seconds: float
    detail: str
    fix: str = ""

    def to_dict(self) -> dict[str, Any]:
        out = {"chapter": self.chapter, "status": self.status,
               "seconds": round(self.seconds, 2), "detail": self.detail}
        if self.fix:
            out["fix"] = self.fix
        return out


@dataclasses.dataclass
class Report:
    """The preflight's result: the rows and the runtime they ran on. ``print`` shows the
    table; :meth:`to_dict` is the JSON record."""

    rows: list[Row]
    banner: str
    device_kind: str
    device_count: int
    platform: str
    versions: dict[str, str]
    date: str
    seconds: float

    @property
    def ok(self) -> bool:
        """True when no chapter failed."""
        return all(r.status != FAILED for r in self.rows)

    def to_dict(self) -> dict[str, Any]:
        return {
            "tool": "tpu-course preflight",
            "date": self.date,
            "ok": self.ok,
            "seconds": round(self.seconds, 1),
            "versions": self.versions,
            "python": sys.version.split()[0],
            "runtime": self.banner,
            "platform": self.platform,
            "device_kind": self.device_kind,
            "device_count": self.device_count,
            "chapters": [r.to_dict() for r in self.rows],
        }

    def table(self) -> str:
        width = max([8] + [len(str(r.chapter)) + 1 for r in self.rows])
        lines = [f"tpu-course preflight: {self.banner}",
                 f"  {'chapter':<{width}}{'status':<9}{'seconds':>8}  detail"]
        for r in self.rows:
            lines.append(f"  {r.chapter!s:<{width}}{r.status:<9}{r.seconds:>8.1f}  {r.detail}")
            if r.fix:
                lines.append(f"  {'':<{width + 17}}  fix: {r.fix}")
        failed = [str(r.chapter) for r in self.rows if r.status == FAILED]
        lines.append(f"  {'FAILED: chapter(s) ' + ', '.join(failed) if failed else 'OK'} "
                     f"({self.seconds:.1f} s)")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()

    __repr__ = __str__


def _version(pkg: str) -> str:
    try:
        return importlib.metadata.version(pkg)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


# -- the chapters -------------------------------------------------------------------------


def _ch1() -> str:
    import numpy as np

    from tpu_course import systolic

    rng = np.random.default_rng(0)
    a = rng.integers(-8, 8, size=(6, 5))
    b = rng.integers(-8, 8, size=(5, 7))
    run = systolic.simulate(a, b, rows=4, cols=4)
    if not np.array_equal(run.result, a @ b):
        raise Failure("the simulated systolic array's product differs from numpy's a @ b",
                      "reinstall the course package (pip install -U tpu-course) and report it")
    return f"6x5 @ 5x7 on a 4x4 array: equals numpy, {run.cycles} cycles, {run.folds} folds"


def _ch2() -> str:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from tpu_course import bench

    device = jax.devices()[0]
    x = jax.device_put(np.ones((256, 256), np.float32), device)
    if set(x.devices()) != {device}:
        raise Failure(f"an array put on {device} lives on {x.devices()}",
                      "check JAX_PLATFORMS and run `tpu-course doctor`")
    matmul = jax.jit(jnp.matmul)
    got = np.asarray(matmul(x, x))
    if not np.allclose(got, 256.0):
        raise Failure("a 256x256 matmul of ones did not give 256 everywhere",
                      "run `tpu-course doctor`; reinstall matching jax and jaxlib")
    res = bench.benchmark(matmul, x, x, warmup=1, repeats=3, min_time=0.05, max_time=2.0,
                          warn=False, name="matmul 256")
    what = "CPU timing" if device.platform == "cpu" else f"on {device.device_kind}"
    return (f"placed on {device}; 256x256 matmul median {res.median_s * 1e6:.0f} us "
            f"({what})")


def _ch3() -> str:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from tpu_course import parity

    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    xs = rng.standard_normal((5, 4)).astype(np.float32)

    def f(w, x):
        return jnp.sum(jnp.tanh(x @ w) ** 2)

    with jax.default_matmul_precision("highest"):
        eager, jitted = f(w, xs[0]), jax.jit(f)(w, xs[0])
        grad = jax.grad(f)(w, xs[0])
        batched = jax.vmap(f, in_axes=(None, 0))(w, xs)
    t = np.tanh(xs[0] @ w)
    want_grad = np.outer(xs[0], 2 * t * (1 - t ** 2))  # d/dW sum(tanh(xW)^2)
    problems = []
    if not np.allclose(eager, jitted, rtol=1e-5):
        problems.append("jit changed the value")
    if not np.allclose(grad, want_grad, rtol=1e-4, atol=1e-5):
        problems.append("jax.grad differs from the analytic gradient")
    if not np.allclose(batched, [f(w, x) for x in xs], rtol=1e-5):
        problems.append("vmap differs from a Python loop")
    # Parity: a JAX layer against a numpy reference, through the chapter's comparison.
    ref = {"forward/layer": np.tanh(xs @ w)}
    with jax.default_matmul_precision("highest"):
        got = {"forward/layer": np.asarray(jnp.tanh(jnp.asarray(xs) @ w))}
    report = parity.compare(ref, got)
    if not report.passed:
        problems.append(f"parity: {report.summary()}")
    if problems:
        raise Failure("; ".join(problems), "reinstall matching jax and jaxlib "
                      "(pip install -U jax), then run `tpu-course doctor`")
    return "jit, grad, vmap match their references; parity check passed"


def _ch4() -> str:
    import jax
    import jax.numpy as jnp

    from tpu_course import hlo

    def f(x, w):
        return jax.nn.relu(x @ w)

    x = jax.ShapeDtypeStruct((128, 256), jnp.float32)
    w = jax.ShapeDtypeStruct((256, 128), jnp.float32)
    local = hlo.inspect(f, x, w)
    want = 2 * 128 * 256 * 128
    if local.flops is not None and not (0.9 * want <= local.flops <= 1.2 * want):
        raise Failure(f"XLA's cost analysis counts {local.flops:.3g} FLOPs for a matmul of "
                      f"{want:.3g}", "report this with `tpu-course doctor`'s output")
    detail = f"inspect on {local.target}: {local.flops or 0:.3g} FLOPs"
    problem = hlo.tpu_compiler_problem()
    if problem:
        return detail + f"; TPU target not tried: {problem.split('. ')[0]}"
    tpu = hlo.inspect(f, x, w, target="v5e:1x1")
    return detail + f"; compiled for {tpu.target} ({tpu.device_kind})"


def _ch5() -> str:
    import types

    from tpu_course import data

    try:
        ds = data.load_fashion_mnist()
    except data.DataError as err:
        # The whole message, on one line: the download error's first line ends in "from
        # any mirror:", and what to set is on its last.
        said = " ".join(str(err).split())
        names = ", ".join(spec.name for spec in data.FASHION_FILES.values())
        raise Failure(f"Fashion-MNIST, which lab 5 and its grading train on, cannot be "
                      f"loaded: {said[:600]}",
                      f"it needs the four Fashion-MNIST IDX files ({names}) in one folder: "
                      "set TPU_COURSE_DATA to that folder (without internet, copy them from "
                      "a machine that has it), or install Debian's dataset-fashion-mnist "
                      f"({', '.join(data.SYSTEM_DIRS['fashion_mnist'])}), or unset "
                      "TPU_COURSE_DATA on a runtime with internet access to download them "
                      "into the cache") from None
    from tpu_course import train  # after the data: a missing folder fails without flax

    n_train, n_test = 512, 500
    subset = types.SimpleNamespace(
        name="fashion_mnist", train_set=f"first {n_train} images",
        train_images=ds.train_images[:n_train], train_labels=ds.train_labels[:n_train],
        test_images=ds.test_images[:n_test], test_labels=ds.test_labels[:n_test])
    config = train.TrainConfig.quick(model="mlp", epochs=1, batch_size=64, eval_batch_size=n_test,
                                     progress=False)
    history = train.fit(config, data=subset)
    rec = history.epochs[-1]
    acc = history.test_accuracy[-1]
    if not 0.3 <= acc <= 1.0:
        raise Failure(f"after {n_train // 64} steps the test accuracy is {acc:.2f} (expected "
                      "well above chance, 0.1)", "run `tpu-course doctor`; check the data files")
    loss = getattr(rec, "train_loss", None)
    return (f"{n_train // 64} MLP steps on fashion_mnist, test accuracy {acc:.2f} on {n_test}"
            " images" + (f", train loss {loss:.2f}" if isinstance(loss, float) else "")
            + f" (read from {ds.source})")


def _mesh_check() -> str:
    """One sharded step on 8 simulated CPU devices, against one device, and its collectives."""
    import jax
    import numpy as np

    from tpu_course import hlo, multihost, parallel

    mesh = parallel.cpu_mesh((MESH_DEVICES,), ("data",))
    params, xs_all, ys_all = multihost.multihost_problem()
    x, y = xs_all[0], ys_all[0]  # one step's batch of 32
    step = parallel.mlp_block_step("fsdp", mesh)
    specs, batch_spec = parallel.mlp_block_specs("fsdp")
    placed = parallel.place(params, mesh, specs)
    xs, ys = parallel.place((x, y), mesh, (batch_spec, batch_spec))
    with jax.default_matmul_precision("highest"):
        new, loss = step(placed, xs, ys)
        ref_new, ref_loss = parallel.mlp_block_reference_step()(params, x, y)
    if not np.allclose(float(loss), float(ref_loss), rtol=1e-4) or not all(
            np.allclose(np.asarray(new[k]), np.asarray(ref_new[k]), rtol=1e-4, atol=1e-6)
            for k in ref_new):
        raise Failure("the FSDP step on 8 devices differs from the single-device step",
                      "reinstall matching jax and jaxlib, then run `tpu-course doctor`")
    report = hlo.inspect(step, placed, xs, ys)
    kinds = report.by_kind()
    if not kinds:
        raise Failure("the compiled sharded step has no collectives",
                      "report this with `tpu-course doctor`'s output")
    seen = ", ".join(f"{n} {k}" for k, (n, _) in sorted(kinds.items()))
    return f"FSDP step on {MESH_DEVICES} simulated devices matches 1 device; collectives: {seen}"


def _ch6_in_subprocess() -> str:
    from tpu_course import runtime

    env = runtime.cpu_subprocess_env(MESH_DEVICES)
    code = ("import json, tpu_course.preflight as p\n"
            "try:\n    print(json.dumps({'ok': p._mesh_check()}))\n"
            "except p.Failure as e:\n    print(json.dumps({'failed': str(e), 'fix': e.fix}))\n")
    try:
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, timeout=SUBPROCESS_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise Failure(f"the CPU-only chapter-6 process ran past {SUBPROCESS_TIMEOUT_S:.0f} s",
                      "run `tpu-course doctor --simulate 8` to see what the CPU tier does"
                      ) from None
    lines = proc.stdout.strip().splitlines()
    try:
        result = json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:]) or "(nothing on stderr)"
        raise Failure(f"the CPU-only chapter-6 process ended with exit code {proc.returncode}: "
                      f"{tail}", "run `tpu-course doctor --simulate 8`") from None
    if "failed" in result:
        raise Failure(result["failed"], result.get("fix", ""))
    return result["ok"] + " (in a separate CPU-only process: this one's JAX started without " \
                          f"{MESH_DEVICES} CPU devices)"


def _ch6(two_processes: bool) -> str:
    from tpu_course import runtime

    if len(runtime.cpu_devices()) >= MESH_DEVICES:
        detail = _mesh_check()
    else:
        detail = _ch6_in_subprocess()
    if two_processes:
        from tpu_course import multihost

        try:
            results = multihost.launch_local(num_processes=2, local_devices=2, steps=3,
                                             timeout_s=120)
        except multihost.LaunchError as err:
            raise Failure(f"two-process jax.distributed run failed: {str(err).splitlines()[0]}",
                          "check that 127.0.0.1 ports can be opened and that jax supports "
                          "gloo CPU collectives (jax >= 0.7.2)") from None
        detail += f"; two-process jax.distributed run: {len(results)} ranks agreed"
    else:
        detail += "; two-process run not asked for (--multihost)"
    return detail


def _ch7() -> str:
    import jax
    import jax.numpy as jnp
    import numpy as np

    try:
        from jax.experimental import pallas as pl
        from jax.experimental.pallas import tpu as pltpu
    except ImportError as err:
        raise Skip(f"Pallas is not importable with jax {jax.__version__}: {err}") from None
    from tpu_course import jax_floor, pallas_tools

    if not hasattr(pltpu, "InterpretParams"):
        raise Skip(f"jax {jax.__version__} has no Pallas TPU interpret mode "
                   f"(pltpu.InterpretParams); chapter 7 needs jax >= {jax_floor()}")

    def add_kernel(x_ref, y_ref, o_ref):
        o_ref[...] = x_ref[...] + 2.0 * y_ref[...]

    def build(interpret: Any) -> Callable:
        return pl.pallas_call(add_kernel, out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
                              interpret=interpret)

    x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
    y = jnp.ones((8, 128), jnp.float32)
    got = np.asarray(jax.jit(build(pallas_tools.interpret_mode("cpu")))(x, y))
    if not np.array_equal(got, np.asarray(x + 2.0 * y)):
        raise Failure("the Pallas kernel in TPU interpret mode differs from jnp",
                      "reinstall matching jax and jaxlib (pip install -U jax)")
    detail = "Pallas kernel in TPU interpret mode equals jnp"
    from tpu_course import hlo

    problem = hlo.tpu_compiler_problem()
    if problem:
        return detail + f"; v5e compile not tried: {problem.split('. ')[0]}"
    sds = jax.ShapeDtypeStruct((8, 128), jnp.float32)
    report = hlo.inspect(build(False), sds, sds, target="v5e:1x1")
    return detail + f"; compiled for {report.target} ({report.device_kind})"


def _ch8() -> str:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from tpu_course import lm, textdata

    config = lm.LMConfig(d_model=32, heads=2, layers=2, d_ff=64, context=32,
                         compute_dtype="float32")
    model = lm.LM(config, rngs=nnx.Rngs(0))
    # the head starts at zero (all logits 0): a random one makes the comparison real
    model.head[...] = jax.random.normal(jax.random.key(1), model.head.shape)
    graphdef, params = nnx.split(model)
    count = sum(x.size for x in jax.tree.leaves(params))
    if count != lm.param_count(config):
        raise Failure(f"the model has {count:,} parameters, lm.param_count says "
                      f"{lm.param_count(config):,}", "reinstall the course (pip install -U)")
    tokens = jnp.asarray(np.arange(24).reshape(2, 12) % 256, jnp.int32)
    forward = jax.jit(lambda p, x: nnx.merge(graphdef, p)(x))
    decode = jax.jit(lambda p, x, c: nnx.merge(graphdef, p).decode(x, c))
    logits, cache = decode(params, tokens[:, :6], lm.init_cache(config, 2))  # prefill
    last, _ = decode(params, tokens[:, 6:], cache)  # the same shapes: one compile
    gap = float(jnp.abs(jnp.concatenate([logits, last], 1) - forward(params, tokens)).max())
    if gap > 1e-5:
        raise Failure(f"KV-cache decoding differs from the full forward pass by {gap:.1e}",
                      "reinstall matching jax, jaxlib and flax (pip install -U jax flax)")
    corpus = textdata.load()
    x, y = textdata.batch_at(corpus.train, 0, 2, 12)  # the shapes compiled above
    log_p = jax.nn.log_softmax(forward(params, jnp.asarray(x)))
    loss = -float(jnp.take_along_axis(log_p, jnp.asarray(y)[..., None], -1).mean())
    return (f"LM ({count:,} parameters): cached decode == full forward (gap {gap:.0e}); "
            f"a random model's loss {textdata.bits_per_byte(loss):.1f} bits per byte on "
            f"a {corpus.size_bytes / 1e6:.1f} MB corpus")


# -- running them -------------------------------------------------------------------------


def _run_one(chapter: int, multihost: bool) -> Row:
    checks: dict[int, Callable[[], str]] = {
        1: _ch1, 2: _ch2, 3: _ch3, 4: _ch4, 5: _ch5, 6: lambda: _ch6(multihost), 7: _ch7,
        8: _ch8}
    start = time.perf_counter()
    try:
        detail = checks[chapter]()
        status, fix = OK, ""
    except Skip as why:
        status, detail, fix = SKIPPED, str(why), ""
    except Failure as err:
        status, detail, fix = FAILED, str(err), err.fix
    except Exception as err:  # noqa: BLE001 - the preflight reports, it never raises
        where = traceback.extract_tb(err.__traceback__)[-1]
        status = FAILED
        said = str(err).splitlines()[0][:300] if str(err) else ""
        detail = (f"{type(err).__name__}: {said} "
                  f"(at {pathlib.Path(where.filename).name}:{where.lineno})")
        fix = ("run `tpu-course doctor` and fix what it reports; if it reports nothing, "
               "reinstall the course with matching jax and jaxlib, and report this line")
    return Row(chapter, status, time.perf_counter() - start, detail, fix)


def parse_chapters(text: str | Sequence[int] | None) -> tuple[int, ...]:
    """``"1,5"`` (or ``[1, 5]``, or None for all) as a checked tuple of chapter numbers."""
    if text is None:
        return CHAPTERS
    items = text.split(",") if isinstance(text, str) else list(text)
    out = []
    for item in items:
        try:
            n = int(str(item).strip())
        except ValueError:
            raise errors.CourseValueError(
                f"chapters={text!r}: {item!r} is not a chapter number; give numbers from "
                f"{CHAPTERS[0]} to {CHAPTERS[-1]} separated by commas, e.g. 1,5") from None
        if n not in CHAPTERS:
            raise errors.CourseValueError(
                f"chapters={text!r}: there is no chapter {n}; the chapters are "
                f"{CHAPTERS[0]} to {CHAPTERS[-1]}")
        if n not in out:
            out.append(n)
    if not out:
        raise errors.CourseValueError("chapters is empty; give e.g. 1,5 or leave it out")
    return tuple(sorted(out))


#: A file larger than this is not an earlier record (those are a few kB).
_RECORD_MAX_BYTES = 1 << 20


def _is_record(path: pathlib.Path) -> bool:
    """Whether ``path`` holds an earlier preflight record (which may be replaced)."""
    try:
        if path.stat().st_size > _RECORD_MAX_BYTES:
            return False
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and record.get("tool") == "tpu-course preflight"


def check_json_path(path: str | os.PathLike) -> pathlib.Path:
    """Where the JSON record will go, checked before anything runs: the path (symbolic
    links resolved), with its missing folders created; else :class:`RecordPathError`
    naming what is wrong.

    Refused: an empty path, a folder, a path under a file, a folder that cannot be
    created or written, and an existing file that is not an earlier preflight record
    (the preflight replaces its own records, nothing else).
    """
    given = path
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str):
        raise RecordPathError(f"json_path={given!r}: expected a file path (a string), "
                              f"got a {type(given).__name__}")
    if not path.strip():
        raise RecordPathError("the record's path is empty: give a file name such as "
                              "preflight.json, or leave --json out")
    try:
        return _checked_path(path, pathlib.Path(path).expanduser())
    except OSError as err:  # a name too long, a loop of links ...
        raise RecordPathError(f"{path} cannot be written: {err.strerror or err}; give a "
                              "path in a folder you can write to") from None


def _checked_path(path: str, p: pathlib.Path) -> pathlib.Path:
    if p.is_dir():
        raise RecordPathError(f"{path} is a folder, not a file: give a file inside it, e.g. "
                              f"{p / 'preflight.json'}")
    ancestor = p.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if ancestor.exists() and not ancestor.is_dir():
        raise RecordPathError(f"{path} cannot be created: {ancestor} is a file, not a "
                              "folder; give a path in a folder")
    if p.exists() or p.is_symlink():
        if not p.is_file():
            raise RecordPathError(f"{path} exists and is not a regular file: give another "
                                  "path")
        if not _is_record(p):
            raise RecordPathError(
                f"{path} exists and is not an earlier preflight record: the preflight "
                "replaces only its own records. Give another path, or move that file "
                "away first")
    p = p.resolve()
    p.parent.mkdir(parents=True, exist_ok=True)  # an OSError here is reported by the caller
    if p.exists():  # an earlier record: it is replaced by a rename in its folder
        fd, probe = tempfile.mkstemp(dir=p.parent, prefix=".preflight-", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    else:  # try the very name (too long, not allowed there ...); remove only what we made
        with open(p, "x"):
            pass
        p.unlink()
    return p


def write_record(report: Report, path: str | os.PathLike) -> pathlib.Path:
    """Write ``report``'s JSON record to ``path`` (checked by :func:`check_json_path`):
    into a temporary file beside it, then renamed over it, so the path holds either the
    old file or the whole new record, never half of one. Returns the path written."""
    target = check_json_path(path)
    umask = os.umask(0)
    os.umask(umask)
    mode = target.stat().st_mode & 0o777 if target.exists() else 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".preflight-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(json.dumps(report.to_dict(), indent=2) + "\n")
        os.chmod(tmp, mode)  # as an ordinary new file (or the record it replaces) would be
        os.replace(tmp, target)
    except BaseException:
        pathlib.Path(tmp).unlink(missing_ok=True)  # ours: the temporary file only
        raise
    return target


class _NotStarted(Exception):
    """JAX was not started on purpose (the flags' row says why)."""


def _flags_row() -> Row | None:
    """A failed row when ``XLA_FLAGS`` holds what XLA would refuse as JAX starts (it would
    kill this process: no table at all); None when the flags are fine or JAX already
    started (the flags no longer matter then)."""
    from tpu_course import runtime

    if runtime._backends_started():
        return None
    start = time.perf_counter()
    try:
        runtime.check_xla_flags()
    except runtime.XlaFlagsError as err:
        return Row(FLAGS_ROW, FAILED, time.perf_counter() - start, " ".join(err.problem.split()),
                   err.fix)
    return None


def run(json_path: str | os.PathLike | None = None, *, chapters: str | Sequence[int] | None = None,
        multihost: bool = False, verbose: bool = False) -> Report:
    """Run the chapters' checks here and return the :class:`Report` (its repr is the table).

    ``json_path``: also write the JSON record there; the path is checked first
    (:func:`check_json_path`, :class:`RecordPathError` before anything runs). If writing
    fails at the end all the same, the table is printed and the error carries the
    report. ``verbose``: print each row as it finishes. Never raises for a failing
    chapter: it is a row of the report; so is an ``XLA_FLAGS`` that XLA would refuse.
    """
    wanted = parse_chapters(chapters)
    target = check_json_path(json_path) if json_path is not None else None
    start = time.perf_counter()
    from tpu_course import runtime

    flags = _flags_row()
    try:
        if flags is not None:
            raise _NotStarted(f"XLA_FLAGS would stop it (see the {FLAGS_ROW} row)")
        rt = runtime.describe()
        banner, kind, count, platform = rt.banner(), rt.device_kind, rt.device_count, rt.platform
        if platform == "cpu" and getattr(rt, "simulated", False):  # say where they come from
            banner += (f" (the {count} CPU devices are simulated: this machine's CPU split "
                       "by XLA_FLAGS=--xla_force_host_platform_device_count, which preflight "
                       "sets for chapter 6's mesh check; it is one device otherwise)")
    except _NotStarted as why:
        banner = f"JAX not started: {why}"
        kind, count, platform = "unknown", 0, "none"
    except Exception as err:  # noqa: BLE001 - no backend: every row will say so too
        banner = f"JAX did not start: {type(err).__name__}: {err}"
        kind, count, platform = "unknown", 0, "none"
    rows = [flags] if flags is not None else []
    for chapter in wanted:
        if flags is not None and chapter not in _WITHOUT_JAX:
            row = Row(chapter, SKIPPED, 0.0, f"not run: JAX cannot start with this XLA_FLAGS "
                      f"(see the {FLAGS_ROW} row)")
        else:
            row = _run_one(chapter, multihost)
        rows.append(row)
        if verbose:
            print(f"  chapter {row.chapter}: {row.status} ({row.seconds:.1f} s)", flush=True)
    report = Report(rows, banner, kind, count, platform,
                    {p: _version(p) for p in _PACKAGES},
                    datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                    time.perf_counter() - start)
    if target is not None:
        try:
            write_record(report, target)
        except (OSError, RecordPathError) as err:
            print(report.table())
            raise RecordPathError(f"the record was not written to {json_path}: "
                                  f"{getattr(err, 'strerror', None) or err}; the table above "
                                  "is the whole result (also in this error's .report)",
                                  report) from None
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """``tpu-course preflight``: print the table, write ``--json``, exit 1 on a failure."""
    import argparse

    parser = argparse.ArgumentParser(prog="tpu-course preflight",
                                     description=__doc__.split("\n")[0].replace("``", ""))
    parser.add_argument("--json", metavar="PATH", help="write the JSON record here")
    parser.add_argument("--multihost", action="store_true",
                        help="also run the two-process jax.distributed run (chapter 6)")
    parser.add_argument("--chapters", metavar="LIST", help="e.g. 1,5 (default: all)")
    args = parser.parse_args(argv)
    try:
        chapters = parse_chapters(args.chapters)
        target = check_json_path(args.json) if args.json is not None else None
    except errors.CourseValueError as err:
        parser.error(str(err))  # before anything runs
    from tpu_course import runtime

    # Simulated devices must be asked for before JAX starts: here, first thing.
    if "jax" not in sys.modules and runtime.requested_cpu_devices() is None and 6 in chapters:
        try:
            runtime.simulate_devices(MESH_DEVICES)
        except runtime.XlaFlagsError:
            pass  # run() reports it as the first row
    report = run(None, chapters=chapters, multihost=args.multihost)
    print(report.table(), flush=True)  # first: a path that fails below loses nothing
    if target is not None:
        try:
            write_record(report, target)
        except (OSError, RecordPathError) as err:
            print(f"tpu-course preflight: the record was not written to {args.json}: "
                  f"{getattr(err, 'strerror', None) or err}; the table above is the whole "
                  "result", file=sys.stderr)
            return 1
        print(f"  record written to {args.json}")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
