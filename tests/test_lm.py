"""tpu_course.lm: the byte-level transformer, its counts and its decode roofline."""

import json
import math
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from tpu_course import errors, hardware, lm, textdata

# d_ff and context equal to d_model: the parameters come in 4 shapes, not 6 (each new
# shape compiles its initialiser, about a second, once per process)
TINY = lm.LMConfig(d_model=32, heads=4, layers=1, d_ff=32, context=32,
                   compute_dtype="float32")


def tokens(batch, length, seed=0):
    """Random bytes, int32 (drawn by numpy: no JAX program to compile per shape)."""
    return jnp.asarray(np.random.default_rng(seed).integers(0, 256, (batch, length), np.int32))


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
    model.head[...] = jnp.asarray(np.random.default_rng(seed).normal(size=model.head.shape),
                                  jnp.float32)
    return model


@pytest.fixture(scope="module")
def tiny():
    return randomized(lm.LM(TINY, rngs=nnx.Rngs(0)))


@pytest.fixture(scope="module")
def fast(tiny):
    return Jitted(tiny)


#: The one batch shape every forward pass below has (compiled once): 2 sequences that fill
#: the context.
B, T = 2, TINY.context


def test_the_head_starts_at_zero_so_every_byte_is_equally_likely(fast):
    model = lm.LM(TINY, rngs=nnx.Rngs(0))
    assert not np.asarray(model.head[...]).any()
    logits = fast._call(nnx.state(model), tokens(B, T))  # the fixture's compiled forward
    np.testing.assert_allclose(jax.nn.log_softmax(logits), -np.log(256), rtol=1e-6)


def test_shapes_and_dtypes(tiny, fast):
    logits = fast(tokens(B, T))
    assert logits.shape == (B, T, 256) and logits.dtype == jnp.float32
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
    x = tokens(B, T)  # the shape test_shapes_and_dtypes compiled
    before = fast(x)
    for i in (0, 5, 9):
        changed = x.at[:, i].set((x[:, i] + 7) % 256)
        after = fast(changed)
        np.testing.assert_array_equal(np.asarray(after[:, :i]), np.asarray(before[:, :i]))
        assert not np.allclose(after[:, i], before[:, i])  # the token itself does matter


def test_cached_decoding_equals_full_recomputation(fast):
    x = tokens(B, T, seed=3)
    full = fast(x)
    cache = lm.init_cache(TINY, batch=2)
    pieces = []
    logits, cache = fast.decode(x[:, :9], cache)  # prefill
    pieces.append(logits)
    for i in range(9, T):  # one token at a time
        logits, cache = fast.decode(x[:, i:i + 1], cache)
        pieces.append(logits)
    assert int(cache.length) == T
    np.testing.assert_allclose(np.concatenate(pieces, 1), full, atol=1e-5, rtol=0)


def test_bf16_compute_stays_close_to_float32(fast):
    config = lm.LMConfig(**{**TINY.__dict__, "compute_dtype": "bfloat16"})
    x = tokens(B, T)
    low = Jitted(randomized(lm.LM(config, rngs=nnx.Rngs(0))))(x)
    high = fast(x)  # the same weights (seed 0, head seed 9), computed in float32
    assert low.dtype == jnp.float32 and np.abs(high).max() > 1
    # bf16 keeps 8 bits of mantissa: logits within 1 % of the largest one
    np.testing.assert_allclose(low, high, atol=0.01 * float(np.abs(high).max()))
    assert not np.array_equal(low, high)  # and it did compute in bf16


def test_generate_greedy_equals_repeated_argmax_of_the_full_model(tiny, fast):
    prompt = tokens(B, 4, seed=5)
    out = lm.generate(tiny, prompt, steps=T - 4)
    # (B, T), the shape compiled already; position i - 1 sees tokens 0..i - 1 only
    ref = jnp.concatenate([prompt, jnp.zeros((B, T - 4), prompt.dtype)], axis=1)
    for i in range(4, T):
        nxt = jnp.argmax(fast(ref)[:, i - 1], axis=-1).astype(ref.dtype)
        ref = ref.at[:, i].set(nxt)
    np.testing.assert_array_equal(out, ref)
    sampled = lm.generate(tiny, prompt, steps=T - 4, temperature=1.0, seed=1)
    np.testing.assert_array_equal(sampled, lm.generate(tiny, prompt, steps=T - 4,
                                                       temperature=1.0, seed=1))
    assert sampled.shape == (B, T) and (sampled[:, :4] == prompt).all()


def test_generate_top_k_samples_only_the_k_most_likely_bytes(tiny, fast):
    prompt = tokens(B, 4, seed=5)
    # the shapes and temperatures of the test above: nothing new to compile (top_k is
    # traced). top_k=1 keeps the argmax alone: sampling is then greedy
    np.testing.assert_array_equal(
        lm.generate(tiny, prompt, steps=T - 4, temperature=1.0, top_k=1, seed=3),
        lm.generate(tiny, prompt, steps=T - 4))
    # top_k=3: every sampled byte is among the 3 largest logits of the full model there
    out = lm.generate(tiny, prompt, steps=T - 4, temperature=1.0, top_k=3, seed=4)
    logits = np.asarray(fast(out))
    for i in range(4, T):
        top3 = np.argsort(logits[:, i - 1], axis=-1)[:, -3:]
        assert all(int(out[b, i]) in top3[b] for b in range(B)), (i, out[:, i], top3)
    # top_k=256 (the whole vocabulary) is plain sampling, draw for draw
    np.testing.assert_array_equal(
        lm.generate(tiny, prompt, steps=T - 4, temperature=1.0, top_k=256, seed=1),
        lm.generate(tiny, prompt, steps=T - 4, temperature=1.0, seed=1))
    for bad in (0, 257, 2.0):
        with pytest.raises(errors.CourseError, match="top_k"):
            lm.generate(tiny, prompt, steps=2, temperature=1.0, top_k=bad)


def test_flops_per_token_against_xlas_cost_analysis():
    # XLA counts the matmuls the formula counts plus norms, softmax, GELU and the
    # optimizer-free loss: measured 4-14 % above 6N + 12 L d T on jax 0.7.2 and 0.12
    # (compiled); the lowered program's analysis (2.7 % above on jax 0.12) needs no
    # compile, a seventh of the time, so it is read where the jax has it.
    config = lm.LMConfig(d_model=64, heads=4, layers=2, d_ff=256, context=32,
                         compute_dtype="float32")
    # shapes only: nothing is initialised (lowering needs no values)
    graphdef, params = nnx.split(nnx.eval_shape(lambda: lm.LM(config, rngs=nnx.Rngs(0))))

    def loss(params, x):
        logits = nnx.merge(graphdef, params)(x)
        return optax.softmax_cross_entropy_with_integer_labels(logits, x).mean()

    x = jnp.zeros((2, config.context), jnp.int32)
    lowered = jax.jit(jax.grad(loss)).lower(params, x)
    cost = lowered.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    if not cost or "flops" not in cost:
        cost = lowered.compile().cost_analysis()
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
        tiny(jnp.zeros((1, TINY.context + 1), jnp.int32))
    with pytest.raises(errors.CourseValueError, match="steps"):
        lm.generate(tiny, jnp.zeros((1, 10), jnp.int32), steps=TINY.context)
    with pytest.raises(errors.CourseValueError, match="position"):
        lm.decode_cost(TINY, 1, position=TINY.context)


def test_tokens_outside_the_bytes_are_refused_not_clamped(tiny):
    # JAX would read row 255 for 300 and row 0 for -1, silently: refused by value, where
    # the values are known (outside jit)
    for bad, where in ((300, [0, 1]), (-1, [0, 1]), (8594, [0, 1])):
        with pytest.raises(errors.CourseValueError, match=rf"tokens hold {bad} \(at "
                           rf"{re.escape(str(where))}\): token values must be 0\.\.255"):
            tiny(jnp.array([[7, bad, 9]]))
    with pytest.raises(errors.CourseValueError, match=r"prompt hold 300 .* 0\.\.255"):
        lm.generate(tiny, [104, 300], steps=2)
    with pytest.raises(errors.CourseValueError, match=r"LMConfig.vocab=100: the model reads "
                       r"bytes.* Leave vocab at 256"):
        lm.LMConfig(vocab=100)


@pytest.mark.parametrize("prompt, message", [
    ("hello", r"prompt='hello' is text: generate reads byte values\. Pass list\(b'hello'\)"),
    (b"hello", r"prompt=b'hello' is text: .* Pass list\(b'hello'\)"),
    ([], r"prompt of shape \(1, 0\) is empty: give at least one byte"),
    ([[1.5, 2.0]], r"expected prompt as an integer array"),
    ([[1, 2], [3]], r"prompt=\[\[1, 2\], \[3\]\]: expected byte values 0\.\.255"),
])
def test_generate_refuses_prompts_that_are_not_bytes(tiny, prompt, message):
    with pytest.raises(errors.CourseError, match=message):
        lm.generate(tiny, prompt, steps=2)


def test_models_text_and_empty_tokens_and_non_models_are_refused(tiny):
    with pytest.raises(errors.CourseTypeError, match=r"tokens='hello' is text.*"
                       r"jnp\.array\(\[list\(b'hello'\)\]\)"):
        tiny("hello")
    with pytest.raises(errors.CourseValueError, match=r"tokens of shape \(1, 0\) hold no token"):
        tiny(jnp.zeros((1, 0), jnp.int32))
    with pytest.raises(errors.CourseTypeError, match=r"model=None: expected an lm\.LM"):
        lm.generate(None, [1, 2], steps=2)
    with pytest.raises(errors.CourseTypeError, match=r"config='cpu': expected an lm\.LMConfig"):
        lm.param_count("cpu")
    with pytest.raises(errors.CourseValueError, match=r"peak_lr=-0\.001: expected a finite number > 0"):
        lm.run(TINY, 2, peak_lr=-1e-3)  # refused before the corpus is read


def test_decode_refuses_what_does_not_fit_its_cache(tiny):
    cache = lm.init_cache(TINY, batch=1)
    with pytest.raises(errors.CourseValueError, match=r"40 tokens do not fit a cache of 32"):
        tiny.decode(jnp.zeros((1, 40), jnp.int32), cache)
    with pytest.raises(errors.CourseValueError, match=r"tokens have a batch of 2 but the cache "
                       r"was made for a batch of 1: .*init_cache\(config, batch=2\)"):
        tiny.decode(jnp.zeros((2, 3), jnp.int32), cache)
    full = cache._replace(length=jnp.array(TINY.context, jnp.int32))  # 32 of 32 decoded
    with pytest.raises(errors.CourseValueError, match=r"the cache holds 32 of 32 positions: 1 "
                       r"more token\(s\) would run past its end"):
        tiny.decode(jnp.zeros((1, 1), jnp.int32), full)
    other = lm.init_cache(lm.LMConfig(**{**TINY.__dict__, "context": 8}), batch=1)
    with pytest.raises(errors.CourseValueError, match=r"make the cache for this model"):
        tiny.decode(jnp.zeros((1, 1), jnp.int32), other)


# ---------------------------------------------------------------- python -m tpu_course.lm

CLI_TINY = ["--d-model", "32", "--heads", "4", "--layers", "1", "--d-ff", "32",
            "--context", "32", "--batch", "2"]  # TINY's shapes: its initialisers are compiled
PROG = "python -m tpu_course.lm: "


def cli(capsys, *argv):
    """(exit code, stdout lines, stderr lines) of ``python -m tpu_course.lm ARGV``."""
    try:
        code = lm.main([*CLI_TINY, *argv])
    except SystemExit as exit_:  # argparse's own refusals
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out.splitlines(), err.splitlines()


@pytest.mark.parametrize("argv, said", [
    (["--steps", "0"], "error: --steps=0: expected an integer >= 1."),
    (["--steps", "2", "--batch", "0"], "error: --batch=0: expected an integer >= 1."),
    (["--steps", "2", "--checkpoint-every", "0"], "error: --checkpoint-every=0: expected an integer >= 1."),
    (["--steps", "2", "--eval-every", "-1"], "error: --eval-every=-1: expected an integer >= 1."),
    (["--steps", "2", "--heads", "3"], "error: LMConfig: --d-model=32 does not divide into --heads=3"),
    (["--steps", "abc"], "error: argument --steps: invalid int value: 'abc' (--help lists the flags)"),
    (["--stepz", "2"], "error: the following arguments are required: --steps"),
])
def test_cli_refuses_a_bad_flag_in_one_line_before_training(capsys, argv, said):
    code, out, err = cli(capsys, *argv)
    assert code == 2 and out == [] and len(err) == 1, err
    assert err[0].startswith(PROG + said), err[0]


def test_cli_refuses_a_checkpoint_dir_that_is_a_file(capsys, tmp_path):
    file = tmp_path / "ck"
    file.write_text("mine")
    code, out, err = cli(capsys, "--steps", "2", "--checkpoint-dir", str(file))
    assert code == 2 and out == [] and err == [
        f"{PROG}error: --checkpoint-dir='{file}' is a file, not a folder: checkpoints are "
        f"folders of steps. Pass a folder (it is created if missing), e.g. '{file}_checkpoints'."]
    assert file.read_text() == "mine"


class Stop(Exception):
    """Raised where the corpus would be read: the run's checks and news are done by then."""


def stop(*args, **kwargs):
    raise Stop


def test_cli_says_which_steps_it_saves_before_training(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(textdata, "load", stop)  # no training: only what is said first
    ck = str(tmp_path / "ck")
    for argv, said in ((["--steps", "3"], "saving only the last step, 3 (--checkpoint-every=50 "
                                          "is more than the 3 step(s) to train)"),
                       (["--steps", "30", "--checkpoint-every", "20"], "saving steps 20, 30"),
                       (["--steps", "600"], "saving steps 50, 100, ..., 600")):
        with pytest.raises(Stop):
            lm.main([*CLI_TINY, *argv, "--checkpoint-dir", ck])
        out, err = capsys.readouterr()
        assert out == "" and err == f"{PROG}no checkpoint in {ck} yet: starting from step 0; {said}\n"


def test_cli_resumes_bit_for_bit_and_says_what_it_did(capsys, tmp_path):
    """What chapter 8 does (kill a run, start it again), and every way a resume can go."""
    ck = str(tmp_path / "ck")
    code, out, err = cli(capsys, "--steps", "4", "--checkpoint-every", "2", "--checkpoint-dir", ck)
    assert code == 0 and err == [f"{PROG}no checkpoint in {ck} yet: starting from step 0; "
                                 "saving steps 2, 4"]
    first = {r["step"]: r["loss"] for r in map(json.loads, out)}
    assert list(first) == [1, 2, 3, 4]
    assert first[1] == pytest.approx(math.log(256), abs=1e-2)  # the zero head: 8 bits
    for steps in ("4", "2"):  # the same run again, or fewer steps: nothing to train, exit 0
        code, out, err = cli(capsys, "--steps", steps, "--checkpoint-every", "2",
                             "--checkpoint-dir", ck)
        assert code == 0 and out == [] and len(err) == 1
        assert err[0].startswith(f"{PROG}{ck} holds step 4 already, at or past --steps={steps}: "
                                 "nothing to train")
    for argv, said in ((["--batch", "4"], "--batch=2 there, 4 here"),
                       (["--d-model", "16"], "--d-model=32 there, 16 here"),
                       (["--seed", "1"], "--seed=0 there, 1 here")):
        code, out, err = cli(capsys, "--steps", "4", *argv, "--checkpoint-dir", ck)
        assert code == 2 and out == [] and len(err) == 1, err
        assert err[0].startswith(f"{PROG}error: the checkpoint in {ck} (step 4) was written by "
                                 "a run with other settings: ") and said in err[0]
    # the function says the same: nothing to train is a warning, the saved state comes back
    config = lm.LMConfig(d_model=32, heads=4, layers=1, d_ff=32, context=32)
    with pytest.warns(UserWarning, match=r"holds step 4 already, at or past steps=4"):
        done = lm.run(config, 4, batch=2, checkpoint_dir=ck)
    assert done["steps"] == [] and done["resumed_from"] == 4
    shutil.rmtree(tmp_path / "ck" / "4")  # preempted after step 2's save
    code, out, err = cli(capsys, "--steps", "6", "--checkpoint-dir", ck)
    assert code == 2 and "belongs to a run of --steps=4, and this one asks for --steps=6" in err[0]
    code, out, err = cli(capsys, "--steps", "4", "--checkpoint-every", "2", "--checkpoint-dir", ck)
    assert code == 0 and err == [f"{PROG}resuming from step 2 of 4 saved in {ck}; saving steps 4"]
    second = {r["step"]: r["loss"] for r in map(json.loads, out)}
    assert second == {3: first[3], 4: first[4]}  # the same state and data: bit for bit
    (tmp_path / "ck" / "4" / "tpu_course.json").unlink()  # a manifest lost: never passed over
    code, out, err = cli(capsys, "--steps", "4", "--checkpoint-every", "2", "--checkpoint-dir", ck)
    assert code == 2 and out == [] and len(err) == 1
    assert "holds 4/ without the course's manifest" in err[0] and "Nothing was trained" in err[0]


MEMORY_ON_8 = """
import json
import jax, jax.numpy as jnp, optax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P
from tpu_course import hlo, lm

config = lm.LMConfig(d_model=32, heads=2, layers=2, d_ff=64, context=16,
                     compute_dtype="float32")
from jax.sharding import AxisType
mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
graphdef, params = nnx.split(nnx.eval_shape(lambda: lm.LM(config, rngs=nnx.Rngs(0))))

def shard(path, leaf):
    name = [k.key for k in path if isinstance(getattr(k, "key", None), str)][-1]
    return NamedSharding(mesh, P(*lm.CHAPTER_SPECS[name]))

shardings = jax.tree_util.tree_map_with_path(shard, params)
abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        params, shardings)
seqs = jax.ShapeDtypeStruct((8, 16), jnp.int32, sharding=NamedSharding(mesh, P("data")))
grad = hlo.inspect(jax.jit(jax.grad(lm.make_loss(graphdef)), out_shardings=shardings),
                   abstract, seqs, seqs)
tx = lm.make_optimizer(10)
moments = optax.tree_map_params(tx, lambda _, s: s, jax.eval_shape(tx.init, params),
                                shardings,
                                transform_non_params=lambda _: NamedSharding(mesh, P()))
init = hlo.inspect(jax.jit(tx.init, out_shardings=moments), abstract)
budget = lm.memory_budget(config, {"data": 4, "model": 2}, batch=8)
print(json.dumps({"rows": budget.rows(grad, init), "table": budget.table(grad)}))
"""


def test_memory_budget_against_xlas_memory_analysis_on_8_devices(subprocess_runner):
    out = subprocess_runner(MEMORY_ON_8, devices=8, timeout_s=300)
    rows = {name: (predicted, xla) for name, predicted, xla in out["rows"]}
    for name in ("parameters (f32)", "gradients (f32)", "optimizer state"):
        assert rows[name][1] == pytest.approx(rows[name][0], rel=0.01), name  # within 1 %
    assert rows["activations, no remat"][1] > 0 and "XLA / predicted" in out["table"]
    assert rows["activations, nothing_saveable"][0] < rows["activations, no remat"][0]


def test_memory_budget_by_hand_and_bad_inputs():
    b = lm.memory_budget(TINY, {"data": 1, "model": 1}, batch=2)
    assert b.params_bytes == 4 * lm.param_count(TINY)  # one device holds everything
    assert b.optimizer_bytes == 2 * b.params_bytes + 8 and b.batch_bytes == 2 * 2 * 32 * 4
    d, f, h, t = 32, 32, 4, 32
    per_token = 4 * (4 * d + 4 * d + 2 * f) + 4 * h * t + (4 * d + 4 * 256)
    assert b.activations_bytes == 2 * t * per_token
    with pytest.raises(errors.CourseValueError, match="axes 'data' and 'model'"):
        lm.memory_budget(TINY, {"x": 8})
    with pytest.raises(errors.CourseError, match="batch"):
        lm.memory_budget(TINY, batch=0)
    with pytest.raises(errors.CourseTypeError, match="hlo.inspect"):
        b.rows(grad=object())


def test_decode_table_is_the_roofline_per_chip():
    table = lm.decode_table(lm.LMConfig.cpu(), ("v5e", "h200"), (1, 64), position=64)
    for chip in ("v5e", "h200"):
        for batch in (1, 64):
            cost = lm.decode_cost(lm.LMConfig.cpu(), batch, 64)
            assert table.tokens_per_s(chip, batch) == pytest.approx(
                batch / cost.time_s(hardware.get(chip)))
    text = str(table.beside("[CPU] measured", {1: 123.0}))
    assert "[CPU] measured" in text and "123" in text and "h200 (bound)" in text
    with pytest.raises(errors.CourseTypeError, match="chips"):
        lm.decode_table(lm.LMConfig.cpu(), "v5e")
    with pytest.raises(errors.CourseValueError, match="no row"):
        table.tokens_per_s("v6e", 1)
