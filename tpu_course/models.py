"""The models the course trains: a multilayer perceptron and a small CNN, in Flax NNX.

Both take a batch of 28 x 28 grey images, ``(N, 28, 28)`` or ``(N, 28, 28, 1)``, as
floats (already scaled to [0, 1]; see :func:`prepare_images`) and return ``(N, 10)``
logits. Both hold trainable parameters only (no batch statistics, no dropout), so the
whole model state is one tree of ``nnx.Param`` arrays: that keeps the train step of
``tpu_course.train`` a pure function of (parameters, optimizer state, batch), which is
also what chapter 6 shards over a mesh.

Parameter counts of the defaults (weights + biases, checked in ``tests/test_models.py``):

* ``MLP``: 784 -> 256 -> 256 -> 10, that is 784*256+256 + 256*256+256 + 256*10+10 =
  269,322 parameters.
* ``CNN``: conv 3x3 (1 -> 16) + ReLU + 2x2 average pool, conv 3x3 (16 -> 32) + ReLU +
  2x2 average pool, dense 7*7*32 -> 128 + ReLU, dense 128 -> 10:
  (9*1*16+16) + (9*16*32+32) + (1568*128+128) + (128*10+10) = 206,922 parameters.

The CNN has the shape of Flax's MNIST example (two 3x3 convolutions, two poolings, two
dense layers) at half its widths by default: the dense layer's 1,568 x 128 weights are
most of the parameters, while the second convolution is most of the arithmetic
(14*14*9*16*32*2 = 1.8 MFLOP of the 2.4 MFLOP forward pass per image, see
:func:`forward_flops_per_image`). The narrower default keeps a CPU epoch of 10,000
images to seconds (XLA's CPU convolutions, and their gradients above all, are slow);
``CNN(features=(32, 64))`` is the wider original.

>>> from flax import nnx
>>> count_params(CNN(rngs=nnx.Rngs(0))), count_params(MLP(rngs=nnx.Rngs(0)))
(206922, 269322)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from tpu_course import errors

NUM_CLASSES = 10
IMAGE_SHAPE = (28, 28)


def prepare_images(images: Any, dtype: Any = jnp.float32) -> jax.Array:
    """uint8 images ``(N, 28, 28)`` -> floats in [0, 1] of shape ``(N, 28, 28, 1)``.

    Called inside the jitted step, so it runs on the chip: the host sends uint8 (one
    byte a pixel, a quarter of what float32 would cost to copy) and the conversion is a
    few cheap element-wise operations there. Float images pass through, already scaled.
    """
    x = jnp.asarray(images)
    if x.ndim == 3:  # (N, 28, 28) -> (N, 28, 28, 1): one channel, channels last
        x = x[..., None]
    if x.ndim != 4 or x.shape[1:3] != (28, 28):
        raise ValueError(
            f"expected images of shape (N, 28, 28) or (N, 28, 28, 1), got {x.shape}; "
            "pass a batch of MNIST-sized images (add a leading batch axis for one "
            "image)"
        )
    if jnp.issubdtype(x.dtype, jnp.integer):  # pixels 0..255
        return x.astype(dtype) / 255.0
    return x.astype(dtype)


def _as_nhwc(x: jax.Array) -> jax.Array:
    if x.ndim == 3:
        x = x[..., None]
    if x.ndim != 4:
        raise errors.CourseValueError(
            f"expected a batch of images (N, 28, 28) or (N, 28, 28, 1), got shape {x.shape}"
        )
    return x


def check_widths(model: str, name: str, widths: Any, count: int | None = None) -> tuple[int, ...]:
    """``widths`` as a tuple of positive layer widths, else a course error naming it."""
    expected = f"{count} positive integers" if count else "a sequence of positive integers"
    if isinstance(widths, (str, bytes)) or not isinstance(widths, Sequence) or (
            count is not None and len(widths) != count):
        raise errors.CourseTypeError(f"{model}.{name}={widths!r}: expected {expected}, "
                                     f"e.g. {name}=(16, 32).")
    return tuple(errors.check_int(f"{name}[{i}]", w, low=1, where=model)
                 for i, w in enumerate(widths))


class MLP(nnx.Module):
    """A multilayer perceptron: flatten, ``len(hidden)`` ReLU layers, a 10-way output.

    Args:
        hidden: widths of the hidden layers (default two layers of 256).
        num_classes: output logits (10 for MNIST).
        dtype: compute dtype of the layers (None: that of the inputs and parameters);
            parameters stay float32 either way.
        rngs: ``nnx.Rngs`` for the initialisation, e.g. ``nnx.Rngs(0)``.
    """

    def __init__(self, hidden: Sequence[int] = (256, 256), num_classes: int = NUM_CLASSES,
                 *, dtype: Any = None, rngs: nnx.Rngs):
        hidden = check_widths("MLP", "hidden", hidden)
        widths = [IMAGE_SHAPE[0] * IMAGE_SHAPE[1], *hidden]
        # Flax 0.12 wants a list of sub-modules wrapped in nnx.List; 0.11 has no nnx.List
        # and takes the plain list.
        layers = getattr(nnx, "List", list)
        self.hidden = layers([nnx.Linear(a, b, dtype=dtype, rngs=rngs)
                              for a, b in zip(widths[:-1], widths[1:])])
        self.out = nnx.Linear(widths[-1], num_classes, dtype=dtype, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = _as_nhwc(x)
        x = x.reshape(x.shape[0], -1)
        for layer in self.hidden:
            x = nnx.relu(layer(x))
        return self.out(x)


class CNN(nnx.Module):
    """A small convolutional network for 28 x 28 images: 206,922 parameters by default.

    conv 3x3 -> ReLU -> pool 2x2 -> conv 3x3 -> ReLU -> pool 2x2 -> dense -> ReLU ->
    dense. 'SAME' padding keeps each convolution's map size, so the poolings take
    28 -> 14 -> 7.
    An ``nnx.Module`` is a plain Python object: ``__init__`` creates the layers (and
    their parameters, from ``rngs``), ``__call__`` is the forward pass.

    Args:
        features: output channels of the two convolutions (default 16 and 32).
        hidden: width of the dense hidden layer (default 128).
        num_classes: output logits (10 for MNIST and Fashion-MNIST).
        dtype: compute dtype of the layers (None: that of the inputs and parameters).
        rngs: ``nnx.Rngs`` for the initialisation, e.g. ``nnx.Rngs(0)``.
    """

    def __init__(self, features=(16, 32), hidden=128, num_classes=10, *, dtype=None,
                 rngs: nnx.Rngs):
        for i, width in enumerate(features):  # every layer needs at least one channel
            if isinstance(width, bool) or not isinstance(width, int) or width < 1:
                raise ValueError(f"CNN.features[{i}]={width!r}: "
                                 "expected an integer >= 1")
        c1, c2 = features
        self.conv1 = nnx.Conv(1, c1, kernel_size=(3, 3), dtype=dtype, rngs=rngs)
        self.conv2 = nnx.Conv(c1, c2, kernel_size=(3, 3), dtype=dtype, rngs=rngs)
        self.dense = nnx.Linear(7 * 7 * c2, hidden, dtype=dtype, rngs=rngs)
        self.out = nnx.Linear(hidden, num_classes, dtype=dtype, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        if x.ndim == 3:  # (N, 28, 28) -> (N, 28, 28, 1): one channel, channels last
            x = x[..., None]
        x = self.pool(nnx.relu(self.conv1(x)))  # (N, 14, 14, c1)
        x = self.pool(nnx.relu(self.conv2(x)))  # (N, 7, 7, c2)
        x = x.reshape(x.shape[0], -1)  # flatten: (N, 7 * 7 * c2)
        x = nnx.relu(self.dense(x))
        return self.out(x)  # (N, num_classes) logits, no softmax

    @staticmethod
    def pool(x: jax.Array) -> jax.Array:
        """2 x 2 average pooling, stride 2, written as a reshape and a mean.

        The same numbers as ``nnx.avg_pool(x, (2, 2), strides=(2, 2))``, but its
        gradient is a broadcast rather than a windowed reduction, which XLA's CPU
        backend runs several times faster (on a TPU or GPU both are cheap).
        """
        n, h, w, c = x.shape
        return x.reshape(n, h // 2, 2, w // 2, 2, c).mean(axis=(2, 4))


MODELS = {"cnn": CNN, "mlp": MLP}


def create(name: str, seed: int = 0, **kwargs: Any) -> nnx.Module:
    """A model by name (``'cnn'`` or ``'mlp'``), initialised from ``seed``.

    >>> type(create("mlp")).__name__
    'MLP'
    """
    cls = MODELS.get(name.lower()) if isinstance(name, str) else None
    if cls is None:
        raise errors.CourseValueError(f"unknown model {name!r}; choose one of {sorted(MODELS)}")
    return cls(rngs=nnx.Rngs(seed), **kwargs)


def count_params(model: nnx.Module) -> int:
    """Number of trainable scalars (every ``nnx.Param`` element) in ``model``."""
    params = nnx.state(model, nnx.Param)
    return int(sum(x.size for x in jax.tree.leaves(params)))


def forward_flops_per_image(model: nnx.Module) -> int:
    """Multiply-adds x 2 of one image's forward pass, counted layer by layer.

    A convolution with 'SAME' padding on an H x W map costs H*W*k*k*C_in*C_out
    multiply-adds; a dense layer In*Out. Biases, ReLUs and poolings are ignored (they
    are O(activations), not O(weights x positions)). A training step costs about three
    times this (forward, and a backward pass that computes two products per layer).

    >>> from flax import nnx
    >>> forward_flops_per_image(CNN(rngs=nnx.Rngs(0)))
    2436096
    """
    flops = 0
    if all(hasattr(model, a) for a in ("conv1", "conv2", "dense", "out")):  # a CNN's layout
        h = IMAGE_SHAPE[0]
        for conv in (model.conv1, model.conv2):
            k = conv.kernel.shape  # (kh, kw, in, out)
            flops += 2 * h * h * k[0] * k[1] * k[2] * k[3]
            h //= 2
        layers = [model.dense, model.out]
    elif isinstance(model, MLP):
        layers = [*model.hidden, model.out]
    else:
        raise errors.CourseTypeError(f"forward_flops_per_image knows CNN and MLP, got {type(model).__name__}")
    for layer in layers:
        a, b = layer.kernel.shape
        flops += 2 * a * b
    return int(flops)
