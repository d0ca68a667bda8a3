"""Tests for tpu_course.hlo: XLA's own analyses and hand counts as references."""

from __future__ import annotations

import textwrap
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpu_course import hardware, hlo
from tpu_course.hlo import aot

# --------------------------------------------------------------------------------------
# Pure parsing
# --------------------------------------------------------------------------------------


def test_replica_groups_explicit_iota_and_mesh_forms():
    assert hlo.parse_replica_groups("replica_groups={{0,1,2,3},{4,5,6,7}}, x") == (
        (0, 1, 2, 3), (4, 5, 6, 7))
    # iota: reshape iota(8) to [2,4], transpose, 4 groups of 2 -> the column groups
    assert hlo.parse_replica_groups("replica_groups=[4,2]<=[2,4]T(1,0), to_apply=%a") == (
        (0, 4), (1, 5), (2, 6), (3, 7))
    assert hlo.parse_replica_groups("replica_groups=[1,8]<=[8], x") == (tuple(range(8)),)
    # mesh axes: devices numbered row-major over the mesh, groups vary the named axes
    assert hlo.parse_replica_groups("replica_groups=mesh['a'=2,'b'=4] {'b'}, y") == (
        (0, 1, 2, 3), (4, 5, 6, 7))
    assert hlo.parse_replica_groups("replica_groups=mesh['a'=2,'b'=4] {'a'}, y") == (
        (0, 4), (1, 5), (2, 6), (3, 7))
    assert hlo.parse_replica_groups("replica_groups=mesh['a'=2,'b'=4] {'a','b'}") == (
        tuple(range(8)),)
    assert hlo.parse_replica_groups("channel_id=1") is None


@given(st.lists(st.integers(1, 4), min_size=1, max_size=3), st.data())
@settings(max_examples=30, deadline=None)
def test_mesh_form_agrees_with_numpy_for_any_mesh(sizes, data):
    names = [f"x{i}" for i in range(len(sizes))]
    chosen = data.draw(st.lists(st.sampled_from(names), min_size=1, unique=True))
    chosen = [n for n in names if n in chosen]  # XLA lists them in mesh order
    text = "replica_groups=mesh[" + ",".join(f"'{n}'={s}" for n, s in zip(names, sizes)) + \
        "] {" + ",".join(f"'{n}'" for n in chosen) + "}"
    groups = hlo.parse_replica_groups(text)
    ids = np.arange(np.prod(sizes)).reshape(sizes)
    group_size = int(np.prod([sizes[names.index(n)] for n in chosen]))
    assert all(len(g) == group_size for g in groups)
    assert sorted(x for g in groups for x in g) == list(range(int(np.prod(sizes))))
    for g in groups:  # members of a group agree on every coordinate not chosen
        coords = [np.unravel_index(i, ids.shape) for i in g]
        for axis, name in enumerate(names):
            if name not in chosen:
                assert len({c[axis] for c in coords}) == 1


#: The reducer every collective below applies.
ADD_HLO = """
%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}
"""

TUPLE_HLO = """
HloModule m

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %main (p0: f32[512,256], p1: bf16[256]) -> (f32[512,256], bf16[256]) {
  %p0 = f32[512,256]{1,0:T(8,128)} parameter(0)
  %p1 = bf16[256]{0} parameter(1)
  %all-reduce.2 = (f32[512,256]{1,0:T(8,128)S(1)}, bf16[256]{0}) all-reduce(%p0, %p1), channel_id=1, replica_groups=[2,4]<=[8], to_apply=%add
  %ag-start = (f32[64,128]{1,0}, f32[256,128]{1,0}) all-gather-start(%gte), channel_id=2, replica_groups={{0,1,2,3},{4,5,6,7}}, dimensions={0}
  %gte = f32[64,128]{1,0} get-tuple-element(%all-reduce.2), index=0
  %ag-done = f32[256,128]{1,0} all-gather-done(%ag-start)
  %rs = f32[16,128]{1,0} reduce-scatter(%ag-done), replica_groups={{0,1,2,3},{4,5,6,7}}, dimensions={0}, to_apply=%add
  ROOT %cp = bf16[256]{0} collective-permute(%p1), source_target_pairs={{0,1},{1,2},{2,3},{3,0}}
}
"""


def test_collectives_from_text_with_tuples_async_and_hand_sizes():
    got = hlo.parse_collectives(TUPLE_HLO)
    kinds = [(c.kind, c.shape, c.dtype, c.bytes) for c in got]
    assert kinds == [
        ("all-reduce", (512, 256), "float32", 512 * 256 * 4),  # combined: one item per operand
        ("all-reduce", (256,), "bfloat16", 256 * 2),
        ("all-gather", (64, 128), "float32", 64 * 128 * 4),  # operand = the local shard
        ("reduce-scatter", (256, 128), "float32", 256 * 128 * 4),  # operand = the full array
        ("collective-permute", (256,), "bfloat16", 512),
    ]
    assert got[2].result_shape == (256, 128) and got[2].is_async and got[2].group_size == 4
    assert got[3].result_shape == (16, 128)
    assert got[4].source_target_pairs == ((0, 1), (1, 2), (2, 3), (3, 0))
    assert got[0].replica_groups == ((0, 1, 2, 3), (4, 5, 6, 7))


def test_tpu_all_reduce_scatter_fusion_is_reported_as_a_reduce_scatter():
    # how the TPU compiler spells a reduce-scatter: an all-reduce sliced in one fusion
    text = ADD_HLO + """
%all-reduce-scatter (input: f32[1024,512]) -> f32[128,512] {
  %input = f32[1024,512]{1,0:T(8,128)} parameter(0)
  %all-reduce = f32[1024,512]{1,0:T(8,128)} all-reduce(%input), channel_id=2, replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=%add
  %multiply = s32[] constant(0)
  %constant = s32[] constant(0)
  ROOT %dynamic-slice = f32[128,512]{1,0:T(8,128)} dynamic-slice(%all-reduce, %multiply, %constant), dynamic_slice_sizes={128,512}
}

ENTRY %main (g: f32[1024,512]) -> f32[128,512] {
  %g = f32[1024,512]{1,0:T(8,128)} parameter(0)
  ROOT %fusion = f32[128,512]{1,0:T(8,128)} fusion(%g), kind=kCustom, calls=%all-reduce-scatter
}
"""
    (c,) = hlo.parse_collectives(text)
    assert (c.kind, c.shape, c.result_shape, c.bytes) == (
        "reduce-scatter", (1024, 512), (128, 512), 1024 * 512 * 4)
    assert c.fused_in == "all-reduce-scatter" and c.group_size == 8


def test_one_gather_spread_over_several_compute_fusions_counts_once():
    # the TPU compiler (v5e, chapter 8's FSDP step) starts a weight's gather, then lets
    # it progress inside the matmul fusions that follow: every fusion holds a copy of
    # the all-gather with the same channel_id. It is one gather; a second channel is a
    # second gather (the backward pass gathering the weight again).
    def piece(n: int, channel: int) -> str:
        return f"""
%async_collective_fusion.{n} (w: bf16[32,256], x: bf16[8,128]) -> (bf16[8,128], bf16[128,256]) {{
  %w = bf16[32,256]{{1,0}} parameter(0)
  %x = bf16[8,128]{{1,0}} parameter(1)
  %neg = bf16[8,128]{{1,0}} negate(%x)
  %all-gather.{n} = bf16[128,256]{{1,0}} all-gather(%w), channel_id={channel}, replica_groups=[2,4]<=[4,2]T(1,0), dimensions={{0}}
  ROOT %t = (bf16[8,128]{{1,0}}, bf16[128,256]{{1,0}}) tuple(%neg, %all-gather.{n})
}}
"""
    text = piece(1, 20) + piece(2, 20) + piece(3, 20) + piece(4, 21) + """
ENTRY %main (w: bf16[32,256], x: bf16[8,128]) -> bf16[8,128] {
  %w = bf16[32,256]{1,0} parameter(0)
  %x = bf16[8,128]{1,0} parameter(1)
  %f1 = (bf16[8,128]{1,0}, bf16[128,256]{1,0}) fusion(%w, %x), kind=kCustom, calls=%async_collective_fusion.1
  %f2 = (bf16[8,128]{1,0}, bf16[128,256]{1,0}) fusion(%w, %x), kind=kCustom, calls=%async_collective_fusion.2
  %f3 = (bf16[8,128]{1,0}, bf16[128,256]{1,0}) fusion(%w, %x), kind=kCustom, calls=%async_collective_fusion.3
  %f4 = (bf16[8,128]{1,0}, bf16[128,256]{1,0}) fusion(%w, %x), kind=kCustom, calls=%async_collective_fusion.4
  %p1 = bf16[8,128]{1,0} collective-permute(%x), channel_id=30, source_target_pairs={{0,1},{1,0}}
  ROOT %p2 = bf16[8,128]{1,0} collective-permute(%p1), channel_id=30, source_target_pairs={{0,1},{1,0}}
}
"""
    got = [(c.kind, c.shape, c.result_shape, c.group_size) for c in hlo.parse_collectives(text)]
    # outside fusions a channel may repeat (the CPU backend's unrolled ring): each counts
    assert got == ([("all-gather", (32, 256), (128, 256), 4)] * 2
                   + [("collective-permute", (8, 128), (8, 128), 1)] * 2)


def test_combined_all_reduce_scatter_names_each_sliced_operand_a_reduce_scatter():
    # two gradients reduced by one combined all-reduce, each result sliced to the shard
    text = ADD_HLO + """
%all-reduce-scatter.1 (g1: f32[64,32], g2: f32[32,64]) -> (f32[8,32], f32[4,64]) {
  %g1 = f32[64,32]{1,0} parameter(0)
  %g2 = f32[32,64]{1,0} parameter(1)
  %ar = (f32[64,32]{1,0}, f32[32,64]{1,0}) all-reduce(%g1, %g2), channel_id=3, replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=%add
  %gte.0 = f32[64,32]{1,0} get-tuple-element(%ar), index=0
  %gte.1 = f32[32,64]{1,0} get-tuple-element(%ar), index=1
  %z = s32[] constant(0)
  %ds.0 = f32[8,32]{1,0} dynamic-slice(%gte.0, %z, %z), dynamic_slice_sizes={8,32}
  %ds.1 = f32[4,64]{1,0} dynamic-slice(%gte.1, %z, %z), dynamic_slice_sizes={4,64}
  ROOT %t = (f32[8,32]{1,0}, f32[4,64]{1,0}) tuple(%ds.0, %ds.1)
}

ENTRY %main (p1: f32[64,32], p2: f32[32,64]) -> (f32[8,32], f32[4,64]) {
  %p1 = f32[64,32]{1,0} parameter(0)
  %p2 = f32[32,64]{1,0} parameter(1)
  %ar.top = f32[64,32]{1,0} all-reduce(%p1), channel_id=4, replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=%add
  ROOT %fusion = (f32[8,32]{1,0}, f32[4,64]{1,0}) fusion(%p1, %p2), kind=kCustom, calls=%all-reduce-scatter.1
}
"""
    got = [(c.kind, c.shape, c.result_shape) for c in hlo.parse_collectives(text)]
    assert got == [("reduce-scatter", (64, 32), (8, 32)), ("reduce-scatter", (32, 64), (4, 64)),
                   ("all-reduce", (64, 32), (64, 32))]  # the unfused one stays what it is


def test_module_parser_separates_fusions_and_reducers():
    text = """
%fused (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  %e = f32[8]{0} exponential(%p)
  ROOT %n = f32[8]{0} negate(%e)
}

ENTRY %main (x: f32[8]) -> f32[8] {
  %x = f32[8]{0} parameter(0)
  ROOT %fusion.7 = f32[8]{0} fusion(%x), kind=kLoop, calls=%fused
}
"""
    module = hlo.parse_module(text)
    assert module.entry == "main" and module.fused == {"fused"}
    (fusion,) = hlo.parse_fusions(module)
    assert fusion.kind == "kLoop" and fusion.ops == {"exponential": 1, "negate": 1}


def test_normalise_cost_and_memory_across_versions():
    assert hlo.normalise_cost({"flops": 4, "x": "text"}) == {"flops": 4.0}
    assert hlo.normalise_cost([{"flops": 4.0}]) == {"flops": 4.0}
    assert hlo.normalise_cost([]) == {}
    stats = types.SimpleNamespace(argument_size_in_bytes=10, output_size_in_bytes=4,
                                  alias_size_in_bytes=0, temp_size_in_bytes=2,
                                  generated_code_size_in_bytes=None)
    assert hlo.normalise_memory(stats) == {"argument_bytes": 10, "output_bytes": 4,
                                           "alias_bytes": 0, "temp_bytes": 2, "code_bytes": None}
    assert hlo.normalise_memory([stats])["temp_bytes"] == 2
    assert hlo.normalise_memory({"temp_size_in_bytes": 7})["temp_bytes"] == 7


# --------------------------------------------------------------------------------------
# inspect on the local CPU
# --------------------------------------------------------------------------------------


@given(st.integers(2, 96), st.integers(2, 96), st.integers(2, 96))
@settings(max_examples=8, deadline=None)
def test_matmul_flops_match_2mkn_on_cpu(m, k, n):
    r = hlo.inspect(jnp.matmul, jax.ShapeDtypeStruct((m, k), jnp.float32),
                    jax.ShapeDtypeStruct((k, n), jnp.float32))
    assert r.flops == 2 * m * k * n


def test_report_texts_memory_and_fusion_of_an_elementwise_chain():
    def chain(x):
        return jnp.tanh(jnp.exp(x) * 2.0 + 1.0)

    r = hlo.inspect(chain, jnp.ones((256, 128), jnp.float32))
    assert "exp" in r.jaxpr and "stablehlo.exponential" in r.stablehlo
    assert "\x1b[" not in r.jaxpr  # no terminal colour codes
    assert "ENTRY" in r.hlo
    # one fused loop: exp, multiply, add and tanh in a single kernel
    assert r.compute_ops == {"fusion": 1}
    ops = r.fusions[0].ops
    assert {"exponential", "multiply", "add", "tanh"} <= set(ops)
    # memory analysis against the hand count: one f32 input and one f32 output
    assert r.argument_bytes == 256 * 128 * 4 and r.output_bytes == 256 * 128 * 4
    assert r.peak_bytes >= 2 * 256 * 128 * 4
    assert r.platform == jax.devices()[0].platform and not r.compile_only
    assert r.compile_time_s > 0
    assert r.collectives == ()
    assert "fusion" in r.summary() and "<table>" in r._repr_html_()


def test_diff_shows_a_fusion_broken_by_an_optimization_barrier():
    def fused(x):
        return jnp.sin(x) * 2.0 + 1.0

    def broken(x):
        return jax.lax.optimization_barrier(jnp.sin(x)) * 2.0 + 1.0

    x = jnp.ones((128, 128))
    a, b = hlo.inspect(fused, x), hlo.inspect(broken, x)
    d = a.diff(b)
    rows = {label: (before, after) for label, before, after in d.rows}
    assert rows["fusions"] == (str(len(a.fusions)), str(len(b.fusions)))
    assert rows["bytes accessed"] == (f"{a.bytes_accessed:,.0f}", f"{b.bytes_accessed:,.0f}")
    assert d.names == ("fused", "broken")
    if len(b.fusions) == len(a.fusions):
        pytest.xfail("this XLA's CPU backend fuses across optimization_barrier (jax 0.10)")
    assert len(b.fusions) > len(a.fusions)
    assert b.bytes_accessed > a.bytes_accessed  # the intermediate goes through memory
    assert d.hlo_diff  # the cleaned HLO lines differ


def test_lines_are_cleaned_and_show_hlo_highlights():
    # An elementwise chain: every XLA CPU version fuses it (jax 0.7's does not fuse a dot
    # with its tanh).
    r = hlo.inspect(lambda a, b: jnp.tanh(a * b) * 2 + 1, jnp.ones((32, 16)), jnp.ones((32, 16)))
    assert r.lines("fusion")
    for line in r.lines("fusion"):
        assert "metadata" not in line and not any(f"%fusion.{i}" in line for i in range(10))
    text = str(r.show_hlo(highlight=("fusion",)))
    assert any(l.startswith(">>") and "fusion(" in l for l in text.splitlines())
    assert "FileNames" not in text and "<pre" in r.show_hlo()._repr_html_()


def test_untraceable_function_gets_a_plain_words_error():
    def branchy(x):
        return x if x.sum() > 0 else -x

    with pytest.raises(hlo.HloTraceError, match="jnp.where / lax.cond"):
        hlo.inspect(branchy, jnp.ones(3))


def test_jitted_function_with_static_argument():
    f = jax.jit(lambda x, n: x * n, static_argnums=1)
    r = hlo.inspect(f, jnp.ones(4), 3)
    assert r.flops == 4


def test_unknown_topology_lists_the_valid_ones():
    with pytest.raises(ValueError, match="v5e:2x2"):
        hlo.tpu_topology("v9:2x2")
    with pytest.raises(ValueError, match="generation:shape"):
        hlo.inspect(jnp.sin, jnp.ones(3), target="v5e")


def test_missing_tpu_extra_says_how_to_install(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "libtpu" else real(name, *a))
    monkeypatch.setattr(aot, "_CACHE", {})
    assert not hlo.compile_only_available()
    with pytest.raises(hlo.TpuCompilerMissing, match=r"tpu-course\[aot\]"):
        hlo.inspect(jnp.sin, jnp.ones(3), target="v5e:2x2")


# --------------------------------------------------------------------------------------
# Data-parallel gradient on 8 simulated CPU devices (subprocess)
# --------------------------------------------------------------------------------------

DP_CODE = """
import json, jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from tpu_course import hardware, hlo
mesh = Mesh(np.array(jax.devices()).reshape({shape}), {axes})
S = lambda s, spec: jax.ShapeDtypeStruct(s, jnp.float32, sharding=NamedSharding(mesh, spec))
def loss(w, b, x):
    return jnp.mean((x @ w + b) ** 2)
r = hlo.inspect(jax.grad(loss, argnums=(0, 1)), S((512, 256), P()), S((256,), P()),
                S((64, 512), P({batch})))
print(json.dumps({{"c": [[c.kind, sorted(c.shape), c.dtype, c.bytes, c.replica_groups]
                         for c in r.collectives], "flops": r.flops, "n": r.device_count}}))
"""


@pytest.fixture(scope="module")
def dp_gradients(subprocess_runner):
    """DP_CODE on a (8,) mesh and on a (2, 4) mesh, in one fresh interpreter with 8
    simulated CPU devices (one JAX start-up for both): {"1d": out, "2d": out}."""
    meshes = {"1d": DP_CODE.format(shape="(8,)", axes="('data',)", batch="'data'"),
              "2d": DP_CODE.format(shape="(2, 4)", axes="('data', 'model')", batch="'data'")}
    code = "import json\nRESULTS = {}\n"
    for name, script in meshes.items():
        body = script.replace("print(json.dumps(", "return json.loads(json.dumps(").strip()
        code += f"def dp_{name}():\n{textwrap.indent(body, '    ')}\nRESULTS[{name!r}] = dp_{name}()\n"
    return subprocess_runner(code + "print(json.dumps(RESULTS))\n")


def test_data_parallel_gradient_all_reduce_on_8_cpu_devices(dp_gradients):
    out = dp_gradients["1d"]
    assert out["n"] == 8
    kinds = {c[0] for c in out["c"]}
    assert kinds == {"all-reduce"}
    # hand count: the gradient of w is f32[512,256] = 524288 bytes, of b f32[256] = 1024
    # bytes, each summed over all 8 devices (one group).
    by_size = sorted(c[3] for c in out["c"])
    assert by_size == [256 * 4, 512 * 256 * 4]
    assert all(c[2] == "float32" and c[4] == [list(range(8))] for c in out["c"])
    # per device: each holds 64/8 = 8 rows, forward + weight-gradient matmuls 2 x 2*8*512*256
    assert out["flops"] >= 2 * (2 * 8 * 512 * 256)


def test_data_parallel_over_one_axis_of_a_2d_mesh_groups_by_that_axis(dp_gradients):
    out = dp_gradients["2d"]
    groups = {tuple(map(tuple, c[4])) for c in out["c"]}
    # batch split over 'data' (size 2): devices i and i+4 hold the two halves
    assert groups == {((0, 4), (1, 5), (2, 6), (3, 7))}
    assert sorted(c[3] for c in out["c"]) == [256 * 4, 512 * 256 * 4]



def test_by_shape_splits_by_kind_by_array_largest_first():
    import dataclasses

    def c(kind, shape, dtype, groups):
        n = int(np.prod(shape)) * {"bfloat16": 2, "float32": 4}[dtype]
        return hlo.Collective(kind, shape, dtype, n, groups, shape, f"{kind}.{n}")

    pairs, quads = ((0, 1), (2, 3)), ((0, 1, 2, 3),)
    moved = (c("all-gather", (8, 4), "bfloat16", quads), c("all-reduce", (2,), "float32", pairs),
             c("all-gather", (8, 4), "bfloat16", quads), c("all-gather", (8, 4), "float32", quads),
             c("all-gather", (8, 4), "bfloat16", pairs))
    r = dataclasses.replace(hlo.inspect(lambda x: x * 2, jnp.ones(3)), collectives=moved)
    assert list(r.by_shape().items()) == [  # by hand: 64 bytes per bf16 (8, 4), 128 per f32
        (("all-gather", "bfloat16", (8, 4), 4), (2, 128)),  # a tie: program order
        (("all-gather", "float32", (8, 4), 4), (1, 128)),
        (("all-gather", "bfloat16", (8, 4), 2), (1, 64)),
        (("all-reduce", "float32", (2,), 2), (1, 8))]
    totals = {}  # the same arrays and bytes as by_kind, split finer
    for (kind, *_), (arrays, nbytes) in r.by_shape().items():
        a, b = totals.get(kind, (0, 0))
        totals[kind] = (a + arrays, b + nbytes)
    assert totals == r.by_kind() == {"all-gather": (4, 320), "all-reduce": (1, 8)}

# --------------------------------------------------------------------------------------
# Compile-only TPU targets (need the aot extra)
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def libtpu():
    if not hlo.tpu_compiler_available():
        pytest.skip(hlo.tpu_compiler_problem())


V5E_8 = "v5e:2x4"


def _v5e_mesh():
    """The one way the course builds a compile-only mesh (as chapter 6 does)."""
    return jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,),
                         devices=hlo.tpu_topology(V5E_8).devices)


@pytest.mark.aot
def test_compile_only_available_with_the_extra(libtpu):
    assert hlo.compile_only_available("v6e:1x1")
    assert not hlo.compile_only_available("v6e:3x3")


@pytest.mark.aot
@pytest.mark.parametrize("name", hlo.valid_topologies())
def test_every_verified_topology_builds_and_names_its_row(libtpu, name):
    """A generation added to the hardware table with compile-only topologies must compile
    here, and its devices must map back to its row."""
    topo = hlo.tpu_topology(name)
    assert topo.name == name and str(topo) == name
    assert topo.devices and hardware.lookup(topo.devices[0].device_kind) is topo.chip


@pytest.mark.aot
def test_matmul_flops_match_2mkn_for_a_tpu_target(libtpu):
    for m, k, n in ((128, 256, 512), (100, 300, 70)):
        r = hlo.inspect(jnp.matmul, jax.ShapeDtypeStruct((m, k), jnp.bfloat16),
                        jax.ShapeDtypeStruct((k, n), jnp.bfloat16), target="v5e:2x2")
        assert r.flops == 2 * m * k * n
        assert r.compile_only and r.platform == "tpu" and r.target == "v5e:2x2"
        assert r.device_kind == "TPU v5 lite" and r.device_count == 1
        assert "T(8,128)" in r.hlo or "T(16,128)" in r.hlo  # TPU tiled layouts
        assert r.argument_bytes >= (m * k + k * n) * 2


@pytest.mark.aot
def test_data_parallel_gradient_all_reduce_on_v5e_2x4(libtpu):
    from jax.sharding import NamedSharding, PartitionSpec as P

    mesh = _v5e_mesh()
    S = lambda s, spec: jax.ShapeDtypeStruct(s, jnp.float32, sharding=NamedSharding(mesh, spec))

    def loss(w, b, x):
        return jnp.mean((x @ w + b) ** 2)

    r = hlo.inspect(jax.grad(loss, argnums=(0, 1)), S((512, 256), P()), S((256,), P()),
                    S((64, 512), P("data")), target=V5E_8)
    assert r.target == "v5e:2x4" and r.device_count == 8 and r.compile_only
    assert {c.kind for c in r.collectives} == {"all-reduce"}
    assert sorted(c.bytes for c in r.collectives) == [256 * 4, 512 * 256 * 4]
    assert all(c.replica_groups == (tuple(range(8)),) for c in r.collectives)
    assert r.collective_bytes == 256 * 4 + 512 * 256 * 4


@pytest.mark.aot
def test_sharded_weight_all_gather_or_all_reduce_on_v5e_2x4(libtpu):
    from jax.sharding import NamedSharding, PartitionSpec as P

    mesh = _v5e_mesh()
    S = lambda s, spec: jax.ShapeDtypeStruct(s, jnp.bfloat16, sharding=NamedSharding(mesh, spec))
    w, x = S((1024, 256), P("data")), S((16, 1024), P())
    # left to itself, the compiler contracts each device's 128 rows locally and sums the
    # bf16[16,256] partial products: 16 * 256 * 2 = 8192 bytes per device
    (ar,) = hlo.inspect(lambda w, x: x @ w, w, x, target=V5E_8).collectives
    assert (ar.kind, ar.shape, ar.dtype, ar.bytes) == ("all-reduce", (16, 256), "bfloat16", 8192)
    # asked for the whole weight (FSDP style), it gathers the 128-row shards instead
    full = NamedSharding(mesh, P())
    (ag,) = hlo.inspect(lambda w, x: x @ jax.lax.with_sharding_constraint(w, full), w, x,
                        target=hlo.tpu_topology(V5E_8)).collectives
    assert (ag.kind, ag.shape, ag.result_shape) == ("all-gather", (128, 256), (1024, 256))
    assert ag.bytes == 128 * 256 * 2 and ag.group_size == 8


@pytest.mark.aot
def test_fsdp_gradient_gathers_weights_and_reduce_scatters_grads_on_v5e_2x4(libtpu):
    from jax.sharding import NamedSharding, PartitionSpec as P

    mesh = _v5e_mesh()
    S = lambda s, spec: jax.ShapeDtypeStruct(s, jnp.float32, sharding=NamedSharding(mesh, spec))
    full, shard = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))

    def loss(w, x):
        return jnp.mean((x @ jax.lax.with_sharding_constraint(w, full)) ** 2)

    def step(w, x):  # FSDP: weights sharded at rest, gathered to use, grads scattered
        return jax.lax.with_sharding_constraint(jax.grad(loss)(w, x), shard)

    r = hlo.inspect(step, S((1024, 512), P("data")), S((64, 1024), P("data")), target=V5E_8)
    assert r.by_kind() == {"all-gather": (1, 128 * 512 * {"float32": 4, "bfloat16": 2}[
        r.collectives[[c.kind for c in r.collectives].index("all-gather")].dtype]),
        "reduce-scatter": (1, 1024 * 512 * 4)}
    kinds = sorted(c.kind for c in r.collectives)
    assert kinds == ["all-gather", "reduce-scatter"]
    ag = next(c for c in r.collectives if c.kind == "all-gather")
    rs = next(c for c in r.collectives if c.kind == "reduce-scatter")
    # gather: each device contributes its 1024/8 = 128 rows (the compiler may gather the
    # bf16 copy the MXU will use: itemsize from the reported dtype)
    assert ag.shape == (128, 512) and ag.result_shape == (1024, 512)
    assert ag.bytes == 128 * 512 * {"float32": 4, "bfloat16": 2}[ag.dtype]
    # scatter: the full f32 gradient goes in, each device keeps 128 rows of the sum
    assert rs.shape == (1024, 512) and rs.result_shape == (128, 512)
    assert rs.bytes == 1024 * 512 * 4 and rs.group_size == 8


@pytest.mark.aot
def test_bad_topology_shape_is_rejected_with_the_list(libtpu):
    with pytest.raises(ValueError, match="Verified targets"):
        hlo.tpu_topology("v5e:3x3")
    topo = hlo.tpu_topology("V5E:2x4 ")
    assert (topo.name, topo.chip.name, len(topo.devices)) == ("v5e:2x4", "v5e", 8)
    assert hlo.tpu_topology("v5e:2x4") is topo  # cached: the name travels with it
    with pytest.raises(TypeError, match="'v5e:2x2'"):
        hlo.inspect(jnp.sin, jnp.ones(3), target=8)


def test_a_libtpu_jax_does_not_pin_is_refused_before_it_can_crash(monkeypatch):
    """Colab's TPU runtime (Aug 2026): jax 0.7.2 pins libtpu 0.0.23 but 0.0.21.1 is there;
    compiling for a topology with it segfaults, so the course refuses with the fix."""
    import importlib.metadata as md
    import importlib.util

    real_spec, real_version, real_requires = importlib.util.find_spec, md.version, md.requires
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "libtpu" else real_spec(name, *a))
    monkeypatch.setattr(md, "version", lambda p: {"libtpu": "0.0.21.1", "jax": "0.7.2"}.get(
        p) or real_version(p))
    monkeypatch.setattr(md, "requires", lambda p: ['libtpu==0.0.23; extra == "tpu"']
                        if p == "jax" else real_requires(p))
    monkeypatch.setattr(aot, "_CACHE", {})
    problem = hlo.tpu_compiler_problem()
    assert "libtpu 0.0.21.1" in problem and "libtpu==0.0.23" in problem
    assert not hlo.tpu_compiler_available() and not hlo.compile_only_available()
    with pytest.raises(hlo.TpuCompilerMissing, match="pip install 'libtpu==0.0.23'"):
        hlo.tpu_topology("v5e:2x2")
    monkeypatch.setattr(md, "version", lambda p: {"libtpu": "0.0.23", "jax": "0.7.2"}.get(
        p) or real_version(p))
    assert hlo.tpu_compiler_problem() is None
