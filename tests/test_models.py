"""Tests for tpu_course.models: parameter counts, a reference forward pass, FLOP counts."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from tpu_course import models


def cnn_params_closed_form(c1: int, c2: int, hidden: int, classes: int = 10) -> int:
    # conv k*k*in*out + out; dense in*out + out. Two 2x2 poolings take 28 -> 7.
    return (9 * 1 * c1 + c1) + (9 * c1 * c2 + c2) + (49 * c2 * hidden + hidden) \
        + (hidden * classes + classes)


def images(n: int, seed: int = 0) -> jax.Array:
    """``n`` images of uniform floats in [0, 1), drawn by numpy (no JAX program to compile)."""
    return jnp.asarray(np.random.default_rng(seed).uniform(size=(n, 28, 28)), jnp.float32)


@pytest.fixture(scope="module")
def defaults():
    """The default CNN and MLP, initialised once: each new parameter shape compiles its
    initialiser (about a second each), so the tests below share these two real models."""
    return models.CNN(rngs=nnx.Rngs(0)), models.MLP(rngs=nnx.Rngs(0))


def test_default_parameter_counts(defaults):
    cnn, mlp = defaults
    assert models.count_params(cnn) == 206_922 == cnn_params_closed_form(16, 32, 128)
    assert models.count_params(mlp) == \
        784 * 256 + 256 + 256 * 256 + 256 + 256 * 10 + 10 == 269_322


@settings(max_examples=8, deadline=None)
@given(c1=st.integers(1, 8), c2=st.integers(1, 8), hidden=st.integers(1, 16))
def test_cnn_parameter_count_matches_closed_form(c1, c2, hidden):
    # Shapes only (nnx.eval_shape): initialising each size for real compiles its
    # initialisers, seconds per example; test_default_parameter_counts counts real models.
    model = nnx.eval_shape(lambda: models.CNN((c1, c2), hidden, rngs=nnx.Rngs(0)))
    assert models.count_params(model) == cnn_params_closed_form(c1, c2, hidden)


def test_cnn_matches_reference_forward_pass(defaults):
    # the default CNN (its initialisers compiled once) on the batch shape the next test
    # calls it with: its forward pass is compiled once too
    model = defaults[0]
    x = images(2, seed=1)[..., None]

    def conv(x, layer):
        y = jax.lax.conv_general_dilated(x, layer.kernel[...], (1, 1), "SAME",
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return y + layer.bias[...]

    def pool(x):  # the textbook avg pool, via reduce_window
        return nnx.avg_pool(x, window_shape=(2, 2), strides=(2, 2))

    h = pool(jax.nn.relu(conv(x, model.conv1)))
    h = pool(jax.nn.relu(conv(h, model.conv2))).reshape(2, -1)
    h = jax.nn.relu(h @ model.dense.kernel[...] + model.dense.bias[...])
    want = h @ model.out.kernel[...] + model.out.bias[...]
    np.testing.assert_allclose(model(x), want, rtol=1e-5, atol=1e-5)


def test_inputs_with_and_without_channel_axis_agree(defaults):
    x = images(2)
    for model in defaults:
        out = model(x)
        assert out.shape == (2, 10)
        np.testing.assert_array_equal(out, model(x[..., None]))


def test_prepare_images_scales_uint8_and_rejects_bad_shapes():
    x = np.full((2, 28, 28), 255, np.uint8)
    y = models.prepare_images(x)
    assert y.shape == (2, 28, 28, 1) and y.dtype == jnp.float32 and float(y.max()) == 1.0
    with pytest.raises(ValueError, match="28, 28"):
        models.prepare_images(np.zeros((2, 32, 32), np.uint8))


def test_create_by_name():
    assert isinstance(models.create("CNN"), models.CNN)
    with pytest.raises(ValueError, match="unknown model"):
        models.create("resnet")


def _padding_taps_flops(model) -> int:
    """FLOPs of the 3x3 'SAME' taps that land on zero padding (XLA does not count them).

    Per spatial axis of size h, a 3-tap window has 3h - 2 taps on real pixels, not 3h.
    """
    if not isinstance(model, models.CNN):
        return 0
    total = 0
    for conv, h in ((model.conv1, 28), (model.conv2, 14)):
        _, _, cin, cout = conv.kernel.shape
        total += 2 * ((3 * h) ** 2 - (3 * h - 2) ** 2) * cin * cout
    return total


@pytest.mark.parametrize("name", ["cnn", "mlp"])
def test_forward_flops_close_to_xla_cost_analysis(name):
    # Ours counts every tap of a 'SAME' convolution (the work a padded matrix unit does);
    # XLA's cost analysis skips taps on the padding but adds biases, ReLUs and poolings.
    model = models.create(name)
    graphdef, params = nnx.split(model)
    fn = jax.jit(lambda p, x: nnx.merge(graphdef, p)(x))
    cost = fn.lower(params, jnp.zeros((1, 28, 28, 1))).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    want = models.forward_flops_per_image(model) - _padding_taps_flops(model)
    assert want <= cost["flops"] <= 1.05 * want, (want, cost["flops"])


def test_cnn_docstring_states_the_default_features():
    import inspect

    default = inspect.signature(models.CNN.__init__).parameters["features"].default
    assert default == (16, 32)
    assert f"default {default[0]} and {default[1]}" in models.CNN.__doc__
