"""Time chapter 8's sharded train step with bf16 and with float32 matmuls on this CPU.

Chapter 8 trains in float32 on a CPU and in bf16 on a chip, and says why: XLA:CPU has
no bf16 matrix unit, so bf16 matmuls cost it more than float32 ones. This measures
that on the chapter's own step (``LMConfig.cpu()``, batch 32 x 128, the (4, 2) mesh of
8 simulated devices with its FSDP and tensor-parallel shardings) with the course's
benchmark harness, and writes ``bench/results/lm-dtypes-cpu-jax<version>.json``. Run
it once per stack (a minute each)::

    .venv/bin/python -m tools.lm_dtypes
    .venv-colab/bin/python -m tools.lm_dtypes
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import platform

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args(argv)

    from tpu_course import runtime

    runtime.simulate_devices(8)
    import jax
    import optax
    from flax import nnx
    from jax.sharding import AxisType, NamedSharding
    from jax.sharding import PartitionSpec as P

    from tpu_course import bench, lm, textdata

    if jax.default_backend() != "cpu":
        parser.error("this compares dtypes on a CPU; run it where JAX_PLATFORMS=cpu")
    mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    specs = {  # chapter 8, section 5
        "embed": P("data", None), "positions": P("data", None),
        "wq": P("data", "model", None), "wk": P("data", "model", None),
        "wv": P("data", "model", None), "wo": P("model", None, "data"),
        "w_in": P("data", "model"), "w_out": P("model", "data"),
        "head": P("data", None), "scale": P(),
    }

    def sharding_of(path, leaf):
        name = [k.key for k in path if isinstance(getattr(k, "key", None), str)][-1]
        return NamedSharding(mesh, specs[name])

    corpus = textdata.load()
    x, y = textdata.batch_at(corpus.train, 0, batch=32, length=128)
    replicated = NamedSharding(mesh, P())
    rows = []
    for dtype in ("bfloat16", "float32"):
        graphdef, params = nnx.split(lm.LM(lm.LMConfig.cpu(compute_dtype=dtype),
                                           rngs=nnx.Rngs(0)))
        tx = lm.make_optimizer(100)
        param_shardings = jax.tree_util.tree_map_with_path(sharding_of, params)
        opt_shardings = optax.tree_map_params(
            tx, lambda _, s: s, jax.eval_shape(tx.init, params), param_shardings,
            transform_non_params=lambda _: replicated)
        batch = NamedSharding(mesh, P("data", None))
        step = jax.jit(lm.make_train_step(graphdef, tx),
                       in_shardings=(param_shardings, opt_shardings, batch, batch),
                       out_shardings=(param_shardings, opt_shardings, replicated))
        with jax.set_mesh(mesh):
            params = jax.device_put(params, param_shardings)
            opt_state = jax.jit(tx.init, out_shardings=opt_shardings)(params)
            r = bench.benchmark(step, params, opt_state, x, y, warmup=1, repeats=5,
                                min_time=0.0, number=1, name=f"train step, {dtype}",
                                warn=False)
        rows.append({"compute_dtype": dtype, "median_s": round(r.median_s, 4),
                     "min_s": round(r.min_s, 4), "spread": round(r.spread, 3),
                     "compile_s": round(r.compile_time_s or 0.0, 2)})
        print(f"{dtype:>9}: {r.median_s:.3f} s a step (median of {len(r.times_s)})",
              flush=True)
    ratio = rows[0]["median_s"] / rows[1]["median_s"]
    print(f"bf16 / float32 step time: {ratio:.2f}")
    result = {
        "what": "chapter 8's train step (LMConfig.cpu(), batch 32 x 128, (4, 2) mesh of "
                "8 simulated CPU devices, FSDP + tensor parallel) with bf16 and with "
                "float32 matmuls",
        "written_by": "python -m tools.lm_dtypes",
        "date": datetime.date.today().isoformat(),
        "runtime": runtime.describe().banner(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "rows": rows,
        "bf16_over_float32": round(ratio, 2),
    }
    out = args.out or RESULTS / f"lm-dtypes-cpu-jax{jax.__version__}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
