"""Meshes and shardings: data parallelism, FSDP and tensor parallelism, and the rest of chapter 6.

What is here:

* :func:`make_mesh` / :func:`cpu_mesh`: a ``jax.sharding.Mesh`` for the runtime at hand.
  The axis types are chosen on purpose: ``explicit=False`` (the default here) gives
  ``AxisType.Auto`` axes, where ``jit`` with ``in_shardings``/``out_shardings`` lets XLA's
  partitioner decide the collectives (the classic "GSPMD" mode the chapter inspects);
  ``explicit=True`` gives ``AxisType.Explicit`` axes (JAX 0.8+'s ``jax.make_mesh``
  default), where shardings are part of each array's type.
* :func:`param_specs` / :func:`state_shardings` / :func:`make_sharded_train_step`:
  the ``PartitionSpec`` of every parameter (and optimizer moment) under ``"dp"``
  (replicated), ``"fsdp"`` (first divisible axis sharded) or ``"tp"`` (Megatron:
  alternate layers split by columns then rows), and the chapter-5 train step jitted
  with those shardings. The step is unchanged: only the layouts differ.
  :func:`train_chapter5` runs chapter 5's own loop (``train.fit``) under a strategy
  (:func:`strategy_placement`).
* :func:`sharded_block_step`: one SGD step of a two-matrix MLP block under DP, FSDP or
  TP by annotations only (``jax.jit`` shardings; XLA inserts the collectives), and
  :func:`mlp_block_step`: the same three strategies written by hand with the public
  ``jax.shard_map``, so that every collective is one we asked for. Chapter 6 shows both
  and checks their HLO against ``tpu_course.plans.collective_bytes``.
* :func:`ring_all_reduce`: an all-reduce built from ``ppermute`` (reduce-scatter then
  all-gather around a ring), equal to ``psum``; :func:`ring_schedule` is its step-by-step
  picture in numpy.
* :func:`gpipe_forward`: a GPipe forward pass over a ``stage`` axis, returning the
  timeline of which stage worked on which micro-batch at each tick (the bubble).
* ``launch_local``, ``LaunchError``, ``train_data_parallel``: served from
  :mod:`tpu_course.multihost` (several processes with ``jax.distributed``).

Importing this module imports JAX but starts no backend.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from tpu_course import errors
from tpu_course.plans import STRATEGIES


# ------------------------------------------------------------------------------ meshes


def _axis_types(n: int, explicit: bool) -> dict:
    axis_type = getattr(jax.sharding, "AxisType", None)
    if axis_type is None:  # very old JAX: every axis is what is now called Auto
        if explicit:
            raise RuntimeError(f"jax {jax.__version__} has no explicit sharding; upgrade JAX")
        return {}
    return {"axis_types": ((axis_type.Explicit if explicit else axis_type.Auto),) * n}


def make_mesh(shape: Sequence[int], names: Sequence[str], devices: Sequence[Any] | None = None,
              *, explicit: bool = False) -> Mesh:
    """A mesh of ``shape`` named ``names`` over ``devices`` (default: ``jax.devices()``).

    With no ``devices`` this is ``jax.make_mesh`` (which orders real TPU chips so that
    mesh axes follow the torus); with ``devices`` (e.g. compile-only TPU devices, or the
    simulated CPU devices beside a real accelerator) they are used in the order given.

    Raises:
        ValueError: the shape needs more devices than there are.
    """
    shape, names = tuple(shape), tuple(names)
    if len(shape) != len(names):
        raise errors.CourseValueError(f"mesh shape {shape} and axis names {names} differ in length")
    kwargs = _axis_types(len(shape), explicit)
    n = int(np.prod(shape))
    if devices is None:
        have = jax.device_count()
        if n > have:
            raise errors.CourseValueError(f"a {shape} mesh needs {n} devices, JAX sees {have}. On a CPU call "
                                          "tpu_course.runtime.simulate_devices(8) before JAX starts.")
        return jax.make_mesh(shape, names, **kwargs)
    devices = list(devices)
    if n > len(devices):
        raise errors.CourseValueError(f"a {shape} mesh needs {n} devices, {len(devices)} were given")
    return Mesh(np.asarray(devices[:n], dtype=object).reshape(shape), names, **kwargs)


def cpu_mesh(shape: Sequence[int] = (8,), names: Sequence[str] = ("data",), *,
             explicit: bool = False) -> Mesh:
    """A mesh of the (simulated) CPU devices: the tier that runs everywhere.

    On a TPU or GPU runtime the simulated devices sit on the CPU platform beside the
    accelerator; this picks them explicitly.
    """
    return make_mesh(shape, names, jax.devices("cpu"), explicit=explicit)


def layout(array: jax.Array) -> np.ndarray:
    """Which device holds each block of a 1D or 2D array: an array of device ids per block.

    The blocks are the shards of ``array.sharding``; a replicated block lists the lowest id.
    """
    index_map = array.sharding.devices_indices_map(array.shape)
    starts: dict[tuple, int] = {}
    for dev, idx in index_map.items():
        key = tuple((s.start or 0) for s in idx)
        starts[key] = min(starts.get(key, dev.id), dev.id)
    rows = sorted({k[0] for k in starts})
    if array.ndim == 1:
        return np.array([starts[(r,)] for r in rows])
    cols = sorted({k[1] for k in starts})
    return np.array([[starts[(r, c)] for c in cols] for r in rows])


# ---------------------------------------------------------------- shardings of a model


def _key(entry: Any) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(entry, attr):
            return str(getattr(entry, attr))
    return str(entry)


def param_specs(strategy: str, params: Any, axis: str = "data", axis_size: int | None = None) -> Any:
    """The ``PartitionSpec`` of every leaf of ``params`` under a strategy.

    * ``"dp"``: every parameter replicated, ``P()``.
    * ``"fsdp"``: the first axis divisible by ``axis_size`` sharded over ``axis``
      (parameters too small to split stay replicated).
    * ``"tp"``: Megatron. The 2D kernels in order alternate column-split
      ``P(None, axis)`` and row-split ``P(axis, None)``; a column layer's bias is split
      with it, a row layer's bias replicated. The last layer is left replicated when the
      count of 2D kernels is odd (its width is usually the 10 classes).
    """
    if strategy not in STRATEGIES:
        raise errors.CourseValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")
    leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
    n = axis_size or 1
    if strategy == "dp":
        return jax.tree_util.tree_unflatten(treedef, [P() for _ in leaves])
    if strategy == "fsdp":
        specs = []
        for _, x in leaves:
            dims = [d for d, s in enumerate(np.shape(x)) if s % n == 0 and s >= n]
            specs.append(P(*([None] * dims[0] + [axis])) if dims and n > 1 else P())
        return jax.tree_util.tree_unflatten(treedef, specs)
    parents = []  # layers in order of their 2D kernel
    for path, x in leaves:
        if np.ndim(x) == 2:
            parents.append(tuple(_key(p) for p in path[:-1]))
    usable = len(parents) - (len(parents) % 2)
    role = {p: ("col" if i % 2 == 0 else "row") for i, p in enumerate(parents[:usable])}
    specs = []
    for path, x in leaves:
        r = role.get(tuple(_key(p) for p in path[:-1]))
        if r is None:
            specs.append(P())
        elif np.ndim(x) == 2:
            specs.append(P(None, axis) if r == "col" else P(axis, None))
        else:
            specs.append(P(axis) if r == "col" else P())
    return jax.tree_util.tree_unflatten(treedef, specs)


def _specs_like(tree: Any, params: Any, pspecs: Any) -> Any:
    """Specs for an optimizer state: a leaf whose path ends with a parameter's path (and has
    its shape) gets that parameter's spec; everything else (counters) is replicated."""
    table = {}
    for (path, x), spec in zip(jax.tree_util.tree_flatten_with_path(params)[0],
                               jax.tree_util.tree_leaves(pspecs, is_leaf=lambda s: isinstance(s, P))):
        table[tuple(_key(p) for p in path)] = (np.shape(x), spec)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
    out = []
    for path, x in leaves:
        keys = tuple(_key(p) for p in path)
        spec = P()
        for k in range(len(keys)):
            hit = table.get(keys[k:])
            if hit and hit[0] == np.shape(x):
                spec = hit[1]
                break
        out.append(spec)
    return jax.tree_util.tree_unflatten(treedef, out)


def state_shardings(strategy: str, state: Any, mesh: Mesh, axis: str | None = None) -> Any:
    """``NamedSharding`` for every leaf of a chapter-5 ``TrainState`` (params and moments)."""
    axis = axis or mesh.axis_names[0]
    pspecs = param_specs(strategy, state.params, axis, mesh.shape[axis])
    specs = type(state)(P(), pspecs, _specs_like(state.opt_state, state.params, pspecs))
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda s: isinstance(s, P))


def batch_spec(strategy: str, axis: str) -> P:
    """DP and FSDP split the batch over ``axis``; TP gives every device the whole batch."""
    return P() if strategy == "tp" else P(axis)


def strategy_placement(strategy: str | None, mesh: Mesh | None,
                       axis: str | None = None) -> Callable[[Any], Any]:
    """Where a run under ``strategy`` keeps its state, batches and metrics on ``mesh``.

    Returns ``placement(state) -> train.Placement``, the ``placement`` argument of
    ``train.fit``. ``strategy=None`` is the single-device reference: everything on the
    first device of ``mesh`` (or the default device without one), so that it runs on the
    same platform as the sharded runs it is compared with.
    """
    from tpu_course.train import Placement

    if strategy is None:
        device = mesh.devices.flat[0] if mesh is not None else jax.devices()[0]
        one = jax.sharding.SingleDeviceSharding(device)
        return lambda state: Placement(one, one, one)
    if mesh is None:
        raise errors.CourseValueError(f"a {strategy!r} run needs a mesh (parallel.make_mesh)")
    axis = axis or mesh.axis_names[0]
    batch, scalars = NamedSharding(mesh, batch_spec(strategy, axis)), NamedSharding(mesh, P())
    return lambda state: Placement(state_shardings(strategy, state, mesh, axis), batch, scalars)


def make_sharded_train_step(step: Callable, strategy: str, state: Any, mesh: Mesh,
                            axis: str | None = None) -> tuple[Callable, Any, Any]:
    """Jit a pure ``(state, batch) -> (state, metrics)`` step with a strategy's
    shardings.

    Returns ``(jitted_step, state_sharding, batch_sharding)``; place the state with
    ``jax.device_put(state, state_sharding)`` and each batch with ``batch_sharding``.
    The step itself is unchanged. Under ``"fsdp"`` the parameters and the optimizer's
    moments are stored sharded (``strategy_placement``), and inside the step the
    parameters are constrained to be whole where the step uses them: that is FSDP's
    "gather before use", so XLA all-gathers each weight and sums each gradient back to
    its shard. Without that constraint XLA is free to keep the weights sharded and move
    the activations instead (all-to-alls), which is not FSDP.
    """
    place = strategy_placement(strategy, mesh, axis)(state)
    whole = NamedSharding(mesh, P())

    def fsdp_step(state, batch):  # gather the parameters, then the unchanged step
        params = jax.lax.with_sharding_constraint(state.params, whole)
        return step(state._replace(params=params), batch)

    jitted = jax.jit(fsdp_step if strategy == "fsdp" else step,
                     in_shardings=(place.state, place.batch),
                     out_shardings=(place.state, place.scalars))
    return jitted, place.state, place.batch


def train_chapter5(strategy: str | None, mesh: Mesh | None, images: np.ndarray,
                   labels: np.ndarray, *, steps: int = 5, batch_size: int = 64,
                   hidden: Sequence[int] = (128, 64), lr: float = 0.05, seed: int = 0) -> list[float]:
    """Train the chapter-5 ``models.MLP`` for ``steps`` SGD steps; return the losses.

    Chapter 5's model and train step (``train.make_train_step``) with plain SGD, on the
    first ``steps x batch_size`` images in order, so every run sees the same data.
    ``strategy=None`` is the single-device reference (on the first device of ``mesh``:
    comparing a TPU run with a CPU mesh would compare bf16 matmul passes with fp32
    ones); otherwise the step is ``make_sharded_train_step(step, strategy, ...)`` on
    ``mesh``. The losses must agree to float rounding.
    """
    import optax
    from flax import nnx

    from tpu_course import models, train

    steps = errors.check_int("steps", steps, low=1)
    batch_size = errors.check_int("batch_size", batch_size, low=1)
    if steps * batch_size > len(images):
        raise errors.CourseValueError(f"{steps} steps of {batch_size} need {steps * batch_size} "
                                      f"images, {len(images)} were given")
    tx = optax.sgd(lr)
    graphdef, state = train.init_state(models.MLP(tuple(hidden), rngs=nnx.Rngs(seed)), tx)
    step = train.make_train_step(graphdef, tx)
    if strategy is None:
        device = mesh.devices.flat[0] if mesh is not None else jax.devices()[0]
        s_state = s_batch = jax.sharding.SingleDeviceSharding(device)
        jitted = jax.jit(step)
    else:
        if mesh is None:
            raise errors.CourseValueError(f"a {strategy!r} run needs a mesh (parallel.make_mesh)")
        jitted, s_state, s_batch = make_sharded_train_step(step, strategy, state, mesh)
    state = jax.device_put(state, s_state)
    losses = []
    for i in range(steps):
        rows = slice(i * batch_size, (i + 1) * batch_size)
        batch = train.Batch(np.asarray(images[rows]), np.asarray(labels[rows], np.int32),
                            np.ones((batch_size,), np.float32))
        state, metrics = jitted(state, jax.device_put(batch, s_batch))
        losses.append(float(metrics["loss"]))
    return losses


# ------------------------------------------------- the MLP block, collectives by hand


def mlp_block_params(d_model: int, d_ff: int, seed: int = 0, dtype: Any = jnp.float32) -> dict:
    """Parameters ``{'w1': [D, F], 'w2': [F, D]}`` of a two-matrix MLP block (numpy, seeded)."""
    rng = np.random.default_rng(seed)
    return {"w1": (rng.standard_normal((d_model, d_ff)) / np.sqrt(d_model)).astype(dtype),
            "w2": (rng.standard_normal((d_ff, d_model)) / np.sqrt(d_ff)).astype(dtype)}


def mlp_block(w1: jax.Array, w2: jax.Array, x: jax.Array,
              precision: Any = jax.lax.Precision.HIGHEST) -> jax.Array:
    """``relu(x @ w1) @ w2``: the feed-forward block of a transformer layer.

    The matmuls ask for ``Precision.HIGHEST`` (true fp32) so that every strategy's
    result equals the single-device one. With ``precision=None`` (JAX's default) the TPU
    compiler feeds the matrix units bf16 and moves that conversion before FSDP's
    all-gathers, which then move half the bytes (chapter 6 shows it in the HLO).
    """
    hidden = jax.nn.relu(jnp.matmul(x, w1, precision=precision))
    return jnp.matmul(hidden, w2, precision=precision)


def block_loss(params: dict, x: jax.Array, y: jax.Array,
               precision: Any = jax.lax.Precision.HIGHEST) -> jax.Array:
    """The mean squared error of ``mlp_block`` on one batch."""
    return jnp.mean((mlp_block(params["w1"], params["w2"], x, precision) - y) ** 2)


def mlp_block_specs(strategy: str, axis: str = "data") -> tuple[dict, P]:
    """(parameter specs, batch spec) of the MLP block under a strategy.

    ``w1`` is ``[D, F]``, ``w2`` is ``[F, D]``, the batch ``x`` is ``[B, D]``.
    """
    if strategy == "dp":  # replicate the weights, split the batch
        return {"w1": P(), "w2": P()}, P(axis)
    if strategy == "fsdp":  # split the weights (first axis) and the batch
        return {"w1": P(axis), "w2": P(axis)}, P(axis)
    if strategy == "tp":  # Megatron: w1 by columns, w2 by rows; batch on every device
        return {"w1": P(None, axis), "w2": P(axis, None)}, P()
    raise ValueError(f"strategy must be one of {STRATEGIES}, got {strategy!r}")


def sharded_block_step(strategy: str, mesh: Mesh, lr: float = 0.1,
                       axis: str | None = None,
                       precision: Any = jax.lax.Precision.HIGHEST) -> Callable:
    """One SGD step of the MLP block, sharded by annotations only: XLA writes the
    collectives.

    The step is the single-device one; ``jax.jit``'s ``in_shardings`` and
    ``out_shardings`` say where each array lives. FSDP adds one more annotation: inside
    the loss each weight is constrained to be whole (replicated), which is FSDP's
    "gather the weight before using it"; the gradient then flows back to the shards.
    """
    axis = axis or mesh.axis_names[0]
    param_specs, batch_spec = mlp_block_specs(strategy, axis)
    param_sharding = {name: NamedSharding(mesh, spec)
                      for name, spec in param_specs.items()}
    batch_sharding = NamedSharding(mesh, batch_spec)
    replicated = NamedSharding(mesh, P())

    def loss(params, x, y):
        if strategy == "fsdp":  # use each weight whole: XLA all-gathers the shards here
            params = jax.lax.with_sharding_constraint(params, replicated)
        return block_loss(params, x, y, precision)

    def step(params, x, y):
        loss_value, grads = jax.value_and_grad(loss)(params, x, y)
        return jax.tree.map(lambda p, g: p - lr * g, params, grads), loss_value

    return jax.jit(step, in_shardings=(param_sharding, batch_sharding, batch_sharding),
                   out_shardings=(param_sharding, replicated))


def mlp_block_step(strategy: str, mesh: Mesh, lr: float = 0.1,
                   axis: str | None = None) -> Callable:
    """The same SGD step with every collective written by hand, under ``jax.shard_map``.

    Inside ``shard_map`` each device sees only its own block of every array and talks to
    the others only through the collectives written here:

    * ``"dp"``: the loss is ``pmean``-ed (an all-reduce of a scalar); differentiating
      through it sums the replicated weights' gradients over devices (one all-reduce).
    * ``"fsdp"``: each weight ``all_gather``-ed before use; JAX's transpose of that
      all-gather is a ``psum_scatter``, so the gradients come back as reduce-scatters.
    * ``"tp"``: ``w1`` split by columns, ``w2`` by rows; one ``psum`` (all-reduce) of
      the ``[batch, d_model]`` partial outputs. The batch is replicated.
    """
    axis = axis or mesh.axis_names[0]
    param_specs, batch_spec = mlp_block_specs(strategy, axis)

    def local_loss(p, x, y):  # p, x, y: this device's blocks
        if strategy == "fsdp":
            w1 = jax.lax.all_gather(p["w1"], axis, tiled=True)
            w2 = jax.lax.all_gather(p["w2"], axis, tiled=True)
            out = mlp_block(w1, w2, x)
        elif strategy == "tp":
            out = jax.lax.psum(mlp_block(p["w1"], p["w2"], x), axis)
        else:
            out = mlp_block(p["w1"], p["w2"], x)
        loss = jnp.mean((out - y) ** 2)
        return loss if strategy == "tp" else jax.lax.pmean(loss, axis)

    def local_step(p, x, y):
        # No explicit pmean of the gradients: the parameters are replicated (the same
        # on every device) while the loss came from sharded data, so JAX's transpose of
        # that broadcast is a psum: the all-reduce of data parallelism appears by
        # itself.
        loss, g = jax.value_and_grad(local_loss)(p, x, y)
        return jax.tree.map(lambda a, b: a - lr * b, p, g), loss

    return jax.jit(jax.shard_map(local_step, mesh=mesh,
                                 in_specs=(param_specs, batch_spec, batch_spec),
                                 out_specs=(param_specs, P())))


def mlp_block_reference_step(lr: float = 0.1) -> Callable:
    """The single-device step that :func:`mlp_block_step` must match."""

    def step(p, x, y):
        loss, g = jax.value_and_grad(block_loss)(p, x, y)
        return jax.tree.map(lambda a, b: a - lr * b, p, g), loss

    return jax.jit(step)


def mlp_block_abstract(strategy: str, mesh: Mesh, batch: int, d_model: int, d_ff: int,
                       dtype: Any = jnp.float32) -> tuple[dict, Any, Any]:
    """``ShapeDtypeStruct`` arguments ``(params, x, y)`` of :func:`mlp_block_step`, with their
    shardings: enough to compile it (``tpu_course.hlo.inspect``) without any data."""
    pspec, xspec = mlp_block_specs(strategy, mesh.axis_names[0])

    def sds(shape, spec):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))

    params = {"w1": sds((d_model, d_ff), pspec["w1"]), "w2": sds((d_ff, d_model), pspec["w2"])}
    return params, sds((batch, d_model), xspec), sds((batch, d_model), xspec)


def place(tree: Any, mesh: Mesh, specs: Any) -> Any:
    """``jax.device_put`` every leaf of ``tree`` with the matching ``PartitionSpec``."""
    return jax.tree.map(lambda x, s: jax.device_put(x, NamedSharding(mesh, s)), tree, specs,
                        is_leaf=lambda s: isinstance(s, P))


# -------------------------------------------------------------- a ring from ppermute


def ring_all_reduce(x: jax.Array, axis: str, axis_size: int) -> jax.Array:
    """Sum ``x`` over ``axis`` with a ring of ``ppermute``s (call inside ``shard_map``).

    The array is cut into ``n`` chunks. Reduce-scatter: for ``n-1`` steps every device
    sends one chunk to its right-hand neighbour, which adds it to its own copy; after
    that device ``i`` holds the full sum of chunk ``(i+1) mod n``. All-gather: ``n-1``
    more steps pass the finished chunks around. Each device sends ``2 (n-1)/n`` of the
    array in all: the ring all-reduce's cost.
    """
    n = axis_size
    if n == 1:
        return x
    flat = x.reshape(-1)
    pad = (-flat.size) % n
    chunks = jnp.pad(flat, (0, pad)).reshape(n, -1)
    me = jax.lax.axis_index(axis)
    right = [(i, (i + 1) % n) for i in range(n)]
    for s in range(n - 1):  # reduce-scatter
        send = chunks[(me - s) % n]
        got = jax.lax.ppermute(send, axis, right)
        chunks = chunks.at[(me - 1 - s) % n].add(got)  # the chunk index travels with it
    for s in range(n - 1):  # all-gather
        send = chunks[(me + 1 - s) % n]
        got = jax.lax.ppermute(send, axis, right)
        chunks = chunks.at[(me - s) % n].set(got)
    return chunks.reshape(-1)[: flat.size].reshape(x.shape)


def ring_schedule(n: int) -> list[np.ndarray]:
    """The ring all-reduce step by step, in numpy: what each device holds of each chunk.

    Device ``i`` starts with value ``10**i`` in every chunk (so a sum shows who
    contributed). Returns ``2(n-1)+1`` arrays ``[device, chunk]``: the start, then one per
    step. At the end every entry is ``sum(10**i)``.

    >>> ring_schedule(3)[-1]
    array([[111, 111, 111],
           [111, 111, 111],
           [111, 111, 111]])
    """
    state = np.array([[10**i] * n for i in range(n)], dtype=np.int64)
    frames = [state.copy()]
    for s in range(n - 1):
        new = state.copy()
        for i in range(n):
            new[(i + 1) % n, (i - s) % n] += state[i, (i - s) % n]
        state = new
        frames.append(state.copy())
    for s in range(n - 1):
        new = state.copy()
        for i in range(n):
            new[(i + 1) % n, (i + 1 - s) % n] = state[i, (i + 1 - s) % n]
        state = new
        frames.append(state.copy())
    return frames


# ------------------------------------------------------------------- a GPipe pipeline


def gpipe_forward(stage_fn: Callable, stage_params: jax.Array, microbatches: jax.Array,
                  mesh: Mesh, axis: str = "stage") -> tuple[jax.Array, jax.Array]:
    """Run a GPipe forward pass: stage ``s`` (device ``s`` on ``axis``) applies its
    layer.

    ``stage_params`` has a leading axis of size ``p`` (one slice per stage),
    ``microbatches`` is ``[m, ...]``. At tick ``t`` stage ``s`` works on micro-batch
    ``t - s`` when ``0 <= t - s < m``, then passes its output to stage ``s + 1`` with a
    ``ppermute``. There are ``m + p - 1`` ticks.

    Returns ``(outputs [m, ...], timeline [p, m + p - 1])`` where the timeline holds the
    micro-batch each stage worked on at each tick, or ``-1`` when it sat idle: the
    bubble, ``(p-1)/(m+p-1)`` of the cells (``tpu_course.comms.pipeline_bubble``).
    """
    p = mesh.shape[axis]
    m = microbatches.shape[0]
    ticks = m + p - 1

    def local(w, mbs):
        w = w[0]
        s = jax.lax.axis_index(axis)
        carry = jnp.zeros_like(mbs[0])
        outs = jnp.zeros_like(mbs)
        line = []
        for t in range(ticks):
            k = t - s
            active = (k >= 0) & (k < m)
            inp = jnp.where(s == 0, mbs[jnp.clip(t, 0, m - 1)], carry)
            y = jnp.where(active, stage_fn(w, inp), jnp.zeros_like(inp))
            last = active & (s == p - 1)
            outs = jnp.where(last, outs.at[jnp.clip(k, 0, m - 1)].set(y), outs)
            line.append(jnp.where(active, k, -1))
            carry = jax.lax.ppermute(y, axis, [(i, i + 1) for i in range(p - 1)])
        # only the last stage wrote: the sum is its outputs
        outs = jax.lax.psum(outs, axis)
        return outs, jnp.stack(line)[None]

    fn = jax.shard_map(local, mesh=mesh, in_specs=(P(axis), P()),
                       out_specs=(P(), P(axis)))
    return jax.jit(fn)(stage_params, microbatches)
