"""tpu_course.lm: the byte-level transformer, its counts and its decode roofline."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from tpu_course import errors, hardware, lm

TINY = lm.LMConfig(d_model=32, heads=4, layers=2, d_ff=64, context=16,
                   compute_dtype="float32")


def tokens(batch, length, seed=0):
    return jax.random.randint(jax.random.key(seed), (batch, length), 0, 256)


class Jitted:
    """The tiny model's forward and decode, compiled (eager NNX calls are slow)."""

    def __init__(self, model):
        self.config = model.config
        graphdef, state = nnx.split(model)
        self.model = model
        self._call = jax.jit(lambda s, x: nnx.merge(graphdef, s)(x))
        self._decode = jax.jit(lambda s, x, c: nnx.merge(graphdef, s).decode(x, c))
        self.state = state

    def __call__(self, x):
        return self._call(self.state, x)

    def decode(self, x, cache):
        return self._decode(self.state, x, cache)


def randomized(model, seed=9):
    """The model with a random output head: it starts at zero (every logit 0), which
    would make any comparison of logits pass."""
    model.head[...] = jax.random.normal(jax.random.key(seed), model.head.shape)
    return model


@pytest.fixture(scope="module")
def tiny():
    return randomized(lm.LM(TINY, rngs=nnx.Rngs(0)))


def test_the_head_starts_at_zero_so_every_byte_is_equally_likely():
    model = lm.LM(TINY, rngs=nnx.Rngs(0))
    assert not np.asarray(model.head[...]).any()
    logits = Jitted(model)(tokens(1, 4))
    np.testing.assert_allclose(jax.nn.log_softmax(logits), -np.log(256), rtol=1e-6)


@pytest.fixture(scope="module")
def fast(tiny):
    return Jitted(tiny)


def test_shapes_and_dtypes(tiny, fast):
    logits = fast(tokens(3, 10))
    assert logits.shape == (3, 10, 256) and logits.dtype == jnp.float32
    params = jax.tree.leaves(nnx.state(tiny, nnx.Param))
    assert all(p.dtype == jnp.float32 for p in params)  # master weights stay float32


@pytest.mark.parametrize("config", [TINY, lm.LMConfig.cpu(), lm.LMConfig.tpu(),
                                    lm.LMConfig(d_model=48, heads=3, layers=3, d_ff=80,
                                                context=7)])
def test_param_count_equals_the_models_real_count(config):
    model = nnx.eval_shape(lambda: lm.LM(config, rngs=nnx.Rngs(0)))
    real = sum(math.prod(p.shape) for p in jax.tree.leaves(nnx.state(model, nnx.Param)))
    assert lm.param_count(config) == real


def test_causality_a_later_token_never_changes_an_earlier_logit(fast):
    x = tokens(2, 12)
    before = fast(x)
    for i in (0, 5, 11):
        changed = x.at[:, i].set((x[:, i] + 7) % 256)
        after = fast(changed)
        np.testing.assert_array_equal(np.asarray(after[:, :i]), np.asarray(before[:, :i]))
        assert not np.allclose(after[:, i], before[:, i])  # the token itself does matter


def test_cached_decoding_equals_full_recomputation(fast):
    x = tokens(2, 16, seed=3)
    full = fast(x)
    cache = lm.init_cache(TINY, batch=2)
    pieces = []
    logits, cache = fast.decode(x[:, :9], cache)  # prefill
    pieces.append(logits)
    for i in range(9, 16):  # one token at a time
        logits, cache = fast.decode(x[:, i:i + 1], cache)
        pieces.append(logits)
    assert int(cache.length) == 16
    np.testing.assert_allclose(np.concatenate(pieces, 1), full, atol=1e-5, rtol=0)


def test_bf16_compute_stays_close_to_float32():
    config = lm.LMConfig(**{**TINY.__dict__, "compute_dtype": "bfloat16"})
    x = tokens(2, 16)
    low = Jitted(randomized(lm.LM(config, rngs=nnx.Rngs(0))))(x)
    high = Jitted(randomized(lm.LM(TINY, rngs=nnx.Rngs(0))))(x)
    assert low.dtype == jnp.float32 and np.abs(high).max() > 1
    # bf16 keeps 8 bits of mantissa: logits within 1 % of the largest one
    np.testing.assert_allclose(low, high, atol=0.01 * float(np.abs(high).max()))
    assert not np.array_equal(low, high)  # and it did compute in bf16


def test_generate_greedy_equals_repeated_argmax_of_the_full_model(tiny, fast):
    prompt = tokens(2, 4, seed=5)
    out = lm.generate(tiny, prompt, steps=6)
    ref = prompt
    for _ in range(6):
        nxt = jnp.argmax(fast(ref)[:, -1], axis=-1).astype(ref.dtype)
        ref = jnp.concatenate([ref, nxt[:, None]], axis=1)
    np.testing.assert_array_equal(out, ref)
    sampled = lm.generate(tiny, prompt, steps=6, temperature=1.0, seed=1)
    np.testing.assert_array_equal(sampled, lm.generate(tiny, prompt, steps=6,
                                                       temperature=1.0, seed=1))
    assert sampled.shape == (2, 10) and (sampled[:, :4] == prompt).all()


def test_flops_per_token_against_xlas_cost_analysis():
    # XLA counts the matmuls the formula counts plus norms, softmax, GELU and the
    # optimizer-free loss: measured 4-14 % above 6N + 12 L d T on jax 0.7.2 and 0.12.
    config = lm.LMConfig(d_model=64, heads=4, layers=2, d_ff=256, context=32,
                         compute_dtype="float32")
    graphdef, params = nnx.split(lm.LM(config, rngs=nnx.Rngs(0)))

    def loss(params, x):
        logits = nnx.merge(graphdef, params)(x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, x).mean()

    x = jnp.zeros((2, config.context), jnp.int32)
    cost = jax.jit(jax.grad(loss)).lower(params, x).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    ratio = cost["flops"] / (2 * config.context) / lm.flops_per_token(config)
    assert 1.0 <= ratio <= 1.2, ratio


def test_decode_cost_and_ridge_batch():
    config = lm.LMConfig.cpu()
    one = lm.decode_cost(config, batch=1, position=63)
    eight = lm.decode_cost(config, batch=8, position=63)
    # by hand: 2 x 1,017,216 + 4 x 5 x 128 x 64 FLOPs; 2 bytes a parameter; 64 positions
    # x 2 (keys, values) x 5 layers x 128 x 2 bytes
    assert (one.flops, one.weight_bytes, one.cache_bytes) == (
        2 * 1_017_216 + 4 * 5 * 128 * 64, 2 * 1_066_368, 64 * 2 * 5 * 128 * 2)
    assert eight.flops == 8 * one.flops and eight.cache_bytes == 8 * one.cache_bytes
    assert eight.weight_bytes == one.weight_bytes  # weights are read once per step
    for name in ("v5e", "v5p", "v6e"):
        chip = hardware.get(name)
        b = lm.decode_ridge_batch(config, chip, position=0)
        assert math.isfinite(b)
        at = lm.decode_cost(config, batch=round(b), position=0)
        assert at.intensity == pytest.approx(chip.critical_intensity(), rel=0.01)
        below = lm.decode_cost(config, batch=math.floor(b) - 1, position=0)
        assert below.intensity < chip.critical_intensity()
    # a long cache read per sequence keeps decode memory-bound at any batch
    long = lm.LMConfig(d_model=128, heads=4, layers=5, d_ff=512, context=8192)
    assert lm.decode_ridge_batch(long, "v6e", position=8000) == math.inf


def test_bad_input_gets_a_course_error(tiny):
    with pytest.raises(errors.CourseValueError, match="heads"):
        lm.LMConfig(d_model=30, heads=4)
    with pytest.raises(errors.CourseTypeError, match="integer array"):
        tiny(jnp.ones((2, 3)))
    with pytest.raises(errors.CourseValueError, match="context"):
        tiny(tokens(1, TINY.context + 1))
    with pytest.raises(errors.CourseValueError, match="steps"):
        lm.generate(tiny, tokens(1, 10), steps=TINY.context)
    with pytest.raises(errors.CourseValueError, match="position"):
        lm.decode_cost(TINY, 1, position=TINY.context)


def test_run_resumes_from_its_checkpoint_with_the_same_losses(tmp_path):
    config = lm.LMConfig(d_model=16, heads=2, layers=1, d_ff=32, context=16)

    class Preempted(Exception):
        pass

    def stop_at_3(record):
        if record["step"] == 3:
            raise Preempted  # after step 2's checkpoint, like a kill

    whole = lm.run(config, 4, batch=2)
    with pytest.raises(Preempted):
        lm.run(config, 4, batch=2, checkpoint_dir=str(tmp_path), checkpoint_every=2,
               log=stop_at_3)
    resumed = lm.run(config, 4, batch=2, checkpoint_dir=str(tmp_path),
                     checkpoint_every=2)
    assert resumed["resumed_from"] == 2 and resumed["steps"] == [3, 4]
    assert resumed["losses"] == whole["losses"][2:]  # bit for bit
    assert whole["losses"][0] == pytest.approx(math.log(256), abs=1e-3)  # zero head
