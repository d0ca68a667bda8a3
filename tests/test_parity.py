"""tpu_course.parity: a correct port passes; each planted porting mistake is named.

The comparison logic runs everywhere against the stored reference; the tests marked
``torch`` rebuild the reference live and skip cleanly without torch.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpu_course import parity

jax = pytest.importorskip("jax")
jnp = jax.numpy


# ---------------------------------------------------------------- a port of the lab model

def conv(p, x):
    y = jax.lax.conv_general_dilated(x, p["kernel"], (1, 1), "SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return y + p["bias"]


def dense(p, x):
    return x @ p["kernel"] + p["bias"]


def forward(params, x):
    c = conv(params["conv"], x)
    h = jax.nn.relu(c).transpose(0, 3, 1, 2).reshape(x.shape[0], -1)  # PyTorch's C,H,W order
    f1 = dense(params["fc1"], h)
    f2 = dense(params["fc2"], jax.nn.relu(f1))
    return {"conv": c, "fc1": f1, "fc2": f2}


def loss_fn(params, x, y, forward=forward, reduce=jnp.mean):
    logits = forward(params, x)["fc2"]
    logp = jax.nn.log_softmax(logits)
    return reduce(-jnp.take_along_axis(logp, y[:, None], axis=1))


def sgd(loss, lr=0.1):
    def step(params, x, y):
        g = jax.grad(loss)(params, x, y)
        return jax.tree.map(lambda p, d: p - lr * d, params, g)
    return step


@pytest.fixture(scope="module")
def ref():
    return parity.load_reference()


def trace(ref, params=None, fwd=forward, loss=loss_fn, x=None):
    params = params if params is not None else parity.unflatten(
        {k[len("params/"):]: jnp.asarray(v) for k, v in ref.arrays.items()
         if k.startswith("params/")})
    x = jnp.asarray(parity.nchw_to_nhwc(ref["input/x"])) if x is None else x
    y = jnp.asarray(ref["input/y"])
    return parity.jax_trace(params, x, y, forward=fwd, loss_fn=loss, step=sgd(loss))


# ----------------------------------------------------------------------- correct port

def test_correct_port_passes(ref):
    report = parity.compare(ref.expected, trace(ref))
    assert report.passed, str(report)
    assert len(report.rows) == len(ref.expected) == 22
    assert "all 22 arrays match" in report.summary()


def test_converters_rebuild_the_stored_params(ref):
    sd = ref.torch_state_dict
    ours = {}
    ours["conv"] = parity.conv2d_to_jax(sd["conv.weight"], sd["conv.bias"])
    ours["fc1"] = parity.linear_to_jax(sd["fc1.weight"], sd["fc1.bias"])
    ours["fc2"] = parity.linear_to_jax(sd["fc2.weight"], sd["fc2.bias"])
    flat = parity.flatten(ours)
    for k, v in flat.items():
        np.testing.assert_array_equal(v, ref[f"params/{k}"])


def test_loss_matches_closed_form(ref):
    # Cross-entropy of the stored logits, by hand in float64.
    z = ref["forward/fc2"].astype(np.float64)
    y = ref["input/y"]
    lse = np.log(np.exp(z - z.max(1, keepdims=True)).sum(1)) + z.max(1)
    np.testing.assert_allclose(np.mean(lse - z[np.arange(len(y)), y]), ref["loss"], rtol=1e-6)


def test_sgd_step_is_param_minus_lr_grad(ref):
    lr = ref.meta["lr"]
    for k in ("conv.kernel", "fc1.bias", "fc2.kernel"):
        np.testing.assert_allclose(ref[f"step/{k}"], ref[f"params/{k}"] - lr * ref[f"grad/{k}"],
                                   rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------------- planted mistakes

def first(report):
    assert not report.passed
    return report.first_failure


def test_transposed_weight_is_named(ref):
    p = parity.unflatten({k[7:]: jnp.asarray(v) for k, v in ref.arrays.items()
                          if k.startswith("params/")})
    p["fc1"]["kernel"] = jnp.asarray(ref.torch_state_dict["fc1.weight"])  # forgot .T
    got = {f"params/{k}": v for k, v in parity.flatten(p).items()}
    f = first(parity.compare(ref.expected, got, names=[n for n in ref.expected
                                                       if n.startswith("params/")]))
    assert f.name == "params/fc1.kernel" and f.layer == "fc1"
    assert f.diagnosis.startswith("transposed")


def test_oihw_kernel_is_named(ref):
    got = dict(trace(ref))
    got["params/conv.kernel"] = ref.torch_state_dict["conv.weight"]
    f = first(parity.compare(ref.expected, got))
    assert f.name == "params/conv.kernel"
    assert "OIHW" in f.diagnosis


def test_nchw_activations_are_named(ref):
    def fwd_nchw(params, x):
        out = forward(params, x)
        return dict(out, conv=out["conv"].transpose(0, 3, 1, 2))
    got = parity.jax_trace({}, jnp.asarray(parity.nchw_to_nhwc(ref["input/x"])),
                           forward=lambda _, x: fwd_nchw(_params(ref), x))
    report = parity.compare(ref.expected, got, names=["forward/conv", "forward/fc1"])
    f = first(report)
    assert f.name == "forward/conv" and "NCHW" in f.diagnosis
    assert report.rows[1].passed  # the later layer is fine: only the layout is off


def _params(ref):
    return parity.unflatten({k[7:]: jnp.asarray(v) for k, v in ref.arrays.items()
                             if k.startswith("params/")})


def test_sum_instead_of_mean_is_named_at_the_loss(ref):
    def loss_sum(params, x, y):
        return loss_fn(params, x, y, reduce=jnp.sum)
    report = parity.compare(ref.expected, trace(ref, loss=loss_sum))
    f = first(report)
    assert f.name == "loss"
    assert "scaled by 8" in f.diagnosis and "sum" in f.diagnosis
    grad_rows = [r for r in report.rows if r.kind == "grad"]
    assert all("scaled by 8" in r.diagnosis for r in grad_rows)
    assert all(r.passed for r in report.rows if r.kind in ("params", "forward"))


def test_missing_bias_is_named_at_its_layer(ref):
    def fwd_nobias(params, x):
        c = conv(params["conv"], x)
        h = jax.nn.relu(c).transpose(0, 3, 1, 2).reshape(x.shape[0], -1)
        f1 = h @ params["fc1"]["kernel"]  # bias forgotten
        return {"conv": c, "fc1": f1, "fc2": dense(params["fc2"], jax.nn.relu(f1))}
    report = parity.compare(ref.expected, trace(ref, fwd=fwd_nobias,
                                                loss=lambda p, x, y: loss_fn(p, x, y, fwd_nobias)))
    f = first(report)
    assert f.name == "forward/fc1" and f.layer == "fc1"
    assert "bias" in f.diagnosis
    assert "first at layer 'fc1'" in report.summary()


def test_wrong_flatten_order_is_caught_at_fc1(ref):
    def fwd_hwc(params, x):
        c = conv(params["conv"], x)
        h = jax.nn.relu(c).reshape(x.shape[0], -1)  # NHWC flatten, PyTorch used C,H,W
        f1 = dense(params["fc1"], h)
        return {"conv": c, "fc1": f1, "fc2": dense(params["fc2"], jax.nn.relu(f1))}
    f = first(parity.compare(ref.expected, trace(ref, fwd=fwd_hwc)))
    assert f.name == "forward/fc1"


def test_missing_layer_output_is_reported(ref):
    got = dict(trace(ref))
    del got["forward/fc1"]
    f = first(parity.compare(ref.expected, got))
    assert f.name == "forward/fc1" and f.diagnosis.startswith("missing")


def test_bf16_port_fails_fp32_tolerance_but_passes_bf16(ref):
    params = jax.tree.map(lambda a: a.astype(jnp.bfloat16), _params(ref))
    x = jnp.asarray(parity.nchw_to_nhwc(ref["input/x"])).astype(jnp.bfloat16)
    got = parity.jax_trace(params, x, forward=forward)
    names = ["forward/conv", "forward/fc1", "forward/fc2"]
    assert parity.compare(ref.expected, got, names=names).passed  # bf16 tolerance chosen
    strict = parity.compare(ref.expected, got, names=names,
                            tolerance=parity.tolerance_for("float32"))
    assert not strict.passed


# ------------------------------------------------------------------------- diagnose

@settings(max_examples=30, deadline=None)
@given(st.integers(2, 6), st.integers(2, 6), st.integers(2, 64), st.integers(0, 2**31 - 1))
def test_diagnose_names_each_mistake_for_any_shape(rows, cols, n, seed):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    if rows != cols:
        assert diagnose_startswith(w, w.T, "transposed")
    assert diagnose_startswith(np.float32(0.7), np.float32(0.7 * n), f"scaled by {n}:")
    assert diagnose_startswith(np.float32(0.7 * n), np.float32(0.7), f"scaled by 1/{n}:")
    b = rng.standard_normal(cols).astype(np.float32) + 3.0
    assert "bias" in parity.diagnose(w + b, w)
    a = rng.standard_normal((2, rows, cols, 3)).astype(np.float32)
    assert "NCHW" in parity.diagnose(a, a.transpose(0, 3, 1, 2))
    assert parity.diagnose(w, w) == ""


def diagnose_startswith(ref, got, prefix):
    d = parity.diagnose(ref, got)
    assert d.startswith(prefix), d
    return True


def test_diagnose_does_not_invent_a_pattern():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((2, 4, 5))
    assert parity.diagnose(a, b).startswith("values differ")
    assert parity.diagnose(a, np.full_like(a, np.nan)) == "contains NaN or inf"
    assert "sign flipped" in parity.diagnose(a, -a)


def test_tolerance_rule_matches_numpy_allclose():
    ref = np.array([1.0, 100.0], np.float32)
    tol = parity.tolerance_for("float32")
    for got in (ref * (1 + 0.9 * tol.rtol), ref * (1 + 3 * tol.rtol)):
        row = parity.compare({"loss": ref}, {"loss": got.astype(np.float32)}).rows[0]
        assert row.passed == np.allclose(got, ref, rtol=tol.rtol, atol=tol.atol)


def test_flatten_unflatten_round_trip():
    tree = {"a": {"b": np.ones(2), "c": {"d": np.zeros(1)}}, "e": np.arange(3)}
    back = parity.unflatten(parity.flatten(tree))
    assert parity.flatten(back).keys() == parity.flatten(tree).keys()


def test_converters_reject_wrong_rank():
    with pytest.raises(ValueError, match="4-D OIHW"):
        parity.conv2d_to_jax(np.zeros((3, 3)))
    with pytest.raises(FileNotFoundError, match="make_parity_reference"):
        parity.load_reference("nope")


def test_stored_reference_is_small():
    path = parity.REFERENCE_DIR / "parity_cnn.npz"
    assert path.stat().st_size < 200_000


# ---------------------------------------------------------------------- live torch

def test_torch_trace_of_other_layers_matches_a_jax_port():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(11, 6), torch.nn.LayerNorm(6),
                                torch.nn.Linear(6, 3))
    tokens = torch.randint(0, 11, (4, 5))
    y = torch.randn(4, 5, 3)
    arrays = parity.torch_trace(model, tokens, y, loss_fn=torch.nn.functional.mse_loss)
    p = parity.unflatten({k[7:]: jnp.asarray(v) for k, v in arrays.items()
                          if k.startswith("params/")})

    def fwd(p, t):
        e = p["0"]["embedding"][t]
        mu = e.mean(-1, keepdims=True)
        var = ((e - mu) ** 2).mean(-1, keepdims=True)
        n = (e - mu) / jnp.sqrt(var + 1e-5) * p["1"]["scale"] + p["1"]["bias"]
        return {"0": e, "1": n, "2": n @ p["2"]["kernel"] + p["2"]["bias"]}

    def loss(p, t, y):
        return jnp.mean((fwd(p, t)["2"] - y) ** 2)

    got = parity.jax_trace(p, jnp.asarray(tokens.numpy()), jnp.asarray(y.numpy()),
                           forward=fwd, loss_fn=loss)
    report = parity.compare(arrays, got)
    assert report.passed, str(report)
    assert {r.layer for r in report.rows} == {"0", "1", "2", "loss"}


def test_torch_trace_rejects_unknown_layers():
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.BatchNorm1d(3))
    with pytest.raises(TypeError, match="BatchNorm1d"):
        parity.torch_trace(model, torch.zeros(2, 3))


def test_report_renders_every_row_as_text_and_html(ref):
    got = dict(trace(ref))
    got["loss"] = got["loss"] * 8
    report = parity.compare(ref.expected, got)
    text = str(report)
    assert len(text.splitlines()) == 1 + len(ref.expected)
    assert text.splitlines()[0] == report.summary()
    page = report._repr_html_()
    assert page.count("<tr>") == 1 + len(ref.expected)
    assert "scaled by 8" in page


def test_plot_reports_colours_each_array_by_its_error_over_the_tolerance(ref):
    import matplotlib

    matplotlib.use("Agg")
    good = parity.compare(ref.expected, trace(ref))
    got = dict(trace(ref))
    del got["forward/fc1"]
    missing = parity.compare(ref.expected, got)
    ax = parity.plot_reports({"port": good, "no fc1": missing})
    grid = ax.images[0].get_array()
    names = [r.name for r in good.rows]
    assert grid.shape == (2, len(names))
    assert np.all(grid[0] <= 1)  # the correct port: every array within its tolerance
    col = names.index("forward/fc1")
    assert np.ma.is_masked(grid[1, col]) or np.isnan(grid[1, col])  # missing: a cross
    assert [t.get_text() for t in ax.texts] == ["x"]
    with pytest.raises(ValueError, match="at least one"):
        parity.plot_reports({})
