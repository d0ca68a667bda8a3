"""Lab 3 checkers: honest answers written unlike the course's pass (also on the grader's
unseen inputs), every mistake and shortcut fails with a hint naming it, and the course's
own answers are refused."""

from __future__ import annotations


import numpy as np
import pytest

from tpu_course import checks, parity
from tpu_course.checks import _core, ch03
from tpu_course.checks._answers import ch03 as answers

jax = pytest.importorskip("jax")
jnp = jax.numpy
optax = pytest.importorskip("optax")
lax = jax.lax

LR = 0.1
SEEDS = [checks.grading_seed(who, 3) for who in ("ada", "bob")]


def hidden(exercise: int, answer, seed: int = SEEDS[0]):
    """The grader's verdict (visible check, then the hidden inputs) on one exercise."""
    ex = ch03.LAB.exercises[exercise - 1]
    namespace = dict(zip(ex.names, answer if isinstance(answer, tuple) else (answer,)))
    result = ex.grade(namespace)
    return ex.grade_hidden(namespace, seed) if result.passed else result


def expect(result, *words, status="failed"):
    """``result`` has ``status`` and every word in its message or hint."""
    text = f"{result.message} | {result.hint}"
    assert result.status == status, str(result)
    for word in words:
        assert word in text, f"{word!r} not in {text!r}"


def test_references_are_not_public_names():
    for name in ("per_example_norms_reference", "clipped_update_reference",
                 "decayed_update_reference"):
        assert not hasattr(ch03, name), name
    for keep in ("LR", "HALVING", "STEPS", "COMPILE_QUIZ", "mlp_loss", "mlp_batch",
                 "run_compile_quiz", "reference", "LAB_CONFIG"):
        assert hasattr(ch03, keep), keep


def test_scorecard_of_an_empty_namespace():
    assert ch03.LAB.scorecard({}).total() == "Lab 3: 0 of 5 passed"


# ------------------------------------------------------------------ Exercise 1: jit fix

def clip_minimum(w, g, max_norm):  # the course's form
    norm = jnp.sqrt(jnp.sum(g ** 2))
    return w - ch03.LR * g * jnp.minimum(1.0, max_norm / norm)


def clip_where(w, g, max_norm):  # another form: select between the two outcomes
    norm = jnp.linalg.norm(g.ravel())
    safe = jnp.where(norm > 0, norm, 1.0)
    return w - ch03.LR * jnp.where(norm > max_norm, g * (max_norm / safe), g)


def clip_cond(w, g, max_norm):
    norm = jnp.sqrt(jnp.vdot(g, g))
    g = lax.cond(norm > max_norm, lambda g: g * (max_norm / norm), lambda g: g, g)
    return w - ch03.LR * g


def clip_optax(w, g, max_norm):  # a library's clip is an honest answer, not the course's
    return w - ch03.LR * g * jnp.minimum(1.0, max_norm / optax.tree.norm(g))


@pytest.mark.parametrize("honest", [clip_minimum, clip_where, clip_cond, clip_optax])
def test_jit_fix_accepts_honest_answers_also_on_unseen_shapes(honest):
    r = hidden(1, honest)
    assert r, str(r)
    assert "unseen" in r.message


def clip_python_if(w, g, max_norm):
    norm = jnp.sqrt(jnp.sum(g ** 2))
    if norm > max_norm:
        g = g * (max_norm / norm)
    return w - ch03.LR * g


def clip_float(w, g, max_norm):
    return w - ch03.LR * g * min(1.0, float(max_norm) / float(jnp.linalg.norm(g)))


def clip_always(w, g, max_norm):
    return w - ch03.LR * g * (max_norm / jnp.sqrt(jnp.sum(g ** 2)))


def clip_by_value(w, g, max_norm):
    return w - ch03.LR * jnp.clip(g, -max_norm, max_norm)


def clip_no_lr(w, g, max_norm):
    return w - g * jnp.minimum(1.0, max_norm / jnp.sqrt(jnp.sum(g ** 2)))


def clip_nan_at_zero(w, g, max_norm):
    norm = jnp.sqrt(jnp.sum(g ** 2))
    return w - ch03.LR * g / norm * jnp.minimum(norm, max_norm)


def clip_per_row(w, g, max_norm):  # right for a vector, wrong for a matrix
    norm = jnp.linalg.norm(g, axis=-1, keepdims=True)
    return w - ch03.LR * g * jnp.minimum(1.0, max_norm / norm)


@pytest.mark.parametrize("wrong, words", [
    (clip_python_if, ("Python `if`", "jnp.where")),
    (clip_float, ("concrete", "jnp.where")),
    (clip_always, ("even when its norm is below", "min(1, max_norm / norm)")),
    (clip_by_value, ("clipping by value", "global norm")),
    (clip_no_lr, ("not multiplied by LR",)),
    (clip_nan_at_zero, ("a zero gradient", "NaN")),
    (lambda w, g, m: w, ("differs",)),
    (lambda w, g, m: jnp.zeros(3), ("shape",)),
])
@pytest.mark.mistake
def test_jit_fix_names_each_mistake(wrong, words):
    r = ch03.check_jit_fix(wrong)
    expect(r, *words)
    assert "[" not in r.message  # the expected update is only in r.answer


@pytest.mark.mistake
def test_jit_fix_catches_a_per_row_norm_on_an_unseen_matrix():
    assert ch03.check_jit_fix(clip_per_row)  # the notebook's gradient is a vector
    r = hidden(1, clip_per_row)
    expect(r, "does not show (a 2-D gradient", "EVERY element")
    assert not r.answer


@pytest.mark.mistake
def test_jit_fix_refuses_the_course_reference():
    for answer in (answers.clipped_update_reference,
                   lambda w, g, m: answers.clipped_update_reference(w, g, m)):
        expect(ch03.check_jit_fix(answer), "course's own function")


# ------------------------------------------------------------ Exercise 2: prediction


def test_compile_quiz_counts_with_jax_and_grades_the_prediction():
    added = ch03.run_compile_quiz()
    assert added[0] == 1 and added[1] == 0 and added[-1] == 0  # a new value is cached
    want = sum(added)
    assert ch03.check_compile_prediction(want)
    assert ch03.check_compile_prediction(float(want))
    r = ch03.check_compile_prediction(len(ch03.COMPILE_QUIZ))  # "every call compiles"
    expect(r, "too high", "VALUE")
    assert r.answer and str(want) not in r.message
    r = ch03.check_compile_prediction(1)  # "jit compiles once"
    expect(r, "too low", "shape AND dtype")
    assert str(want) not in r.message
    expect(ch03.check_compile_prediction(want + 1), "too high", "repeat an earlier call")
    expect(ch03.check_compile_prediction(str(want)), "string")
    expect(ch03.check_compile_prediction(None), "should be a number")
    expect(ch03.check_compile_prediction(2.5), "cannot be a count")
    expect(ch03.check_compile_prediction(0), "cannot be a count")
    expect(ch03.check_compile_prediction(checks.NotWritten("Exercise 2")), status="not written")


def test_compile_prediction_is_locked_once_the_count_is_shown(capsys):
    lab, want = ch03.LAB, sum(ch03.run_compile_quiz())
    assert not lab.predicted("Exercise 2")  # the lab's Run all shows no count
    assert "once your prediction is recorded" in capsys.readouterr().out
    lab.predict("Exercise 2", 7)
    assert lab.predicted("Exercise 2")
    r = ch03.check_compile_prediction(want)  # edited after seeing the count
    expect(r, "recorded before the measurement", "VALUE")
    assert not lab.scorecard({"predicted_compiles": want}).results[1]


# -------------------------------------------------------- Exercise 3: the planted cause


@jax.jit
def decay_course(w, g, lr, step):
    return w - lr * 0.5 ** (step // ch03.HALVING) * g


def decay_exp2(w, g, lr, step):  # another form, jitted by a call, not a decorator
    halvings = jnp.floor_divide(step, ch03.HALVING)
    return w - g * (lr * jnp.exp2(-halvings.astype(jnp.float32)))


def decay_right_shift(w, g, lr, step):  # halving as a divide by a power of two
    return w - (lr / (2.0 ** (step // 100))) * g


@pytest.mark.parametrize("honest", [decay_course, jax.jit(decay_exp2),
                                    jax.jit(decay_right_shift)])
def test_recompile_fix_accepts_honest_answers_also_on_unseen_schedules(honest):
    r = hidden(3, honest)
    assert r, str(r)


def _body(w, g, lr, step):
    return w - lr * 0.5 ** (step // ch03.HALVING) * g


@pytest.mark.mistake
def test_recompile_fix_names_the_argument_still_static():
    lr_static = jax.jit(_body, static_argnames=("lr",))  # the issue: fixing only step
    r = ch03.check_recompile_fix(lr_static)
    expect(r, "lr is still static", "like step")
    step_static = jax.jit(_body, static_argnames=("step",))
    expect(ch03.check_recompile_fix(step_static), "step is still static", "like lr")
    planted = jax.jit(_body, static_argnames=("lr", "step"))
    expect(ch03.check_recompile_fix(planted), "lr and step are still static",
           "static_argnames")
    by_number = jax.jit(_body, static_argnums=(2,))
    expect(ch03.check_recompile_fix(by_number), "lr is still static")


def test_recompile_fix_counts_from_an_empty_cache():
    """A static version that already compiled every call of the check still fails."""
    lr_static = jax.jit(_body, static_argnames=("lr",))
    w = jnp.zeros(4)
    for lr, step in zip(ch03.LRS, ch03.STEPS):
        lr_static(w, w, lr, step)
    expect(ch03.check_recompile_fix(lr_static), "lr is still static")
    assert ch03.check_recompile_fix(decay_course)  # twice in a row: still one version
    assert ch03.check_recompile_fix(decay_course)


@pytest.mark.parametrize("wrong, words", [
    (jax.jit(lambda w, g, lr, step: w - lr * g), ("does not decay",)),
    (jax.jit(lambda w, g, lr, step: w - lr * 0.5 ** (step / 100) * g), ("smoothly", "//")),
    (jax.jit(lambda w, g, lr, step: w - 0.1 * 0.5 ** (step // 100) * g),
     ("ignores the lr argument",)),
    (jax.jit(lambda w, g, lr, step: w - lr * 0.5 ** (int(step) // 100) * g),
     ("ConcretizationTypeError", "no int(step)")),
    (_body, ("not a jitted function",)),
    (jax.jit(answers.decayed_update_reference), ("course's own function",)),
])
@pytest.mark.mistake
def test_recompile_fix_names_each_mistake(wrong, words):
    expect(ch03.check_recompile_fix(wrong), *words)


def test_recompile_fix_stub_is_not_written():
    def stub(w, g, lr, step):  # what the lab holds: a plain function, not jitted
        raise NotImplementedError("Exercise 3: write your code here")
    assert ch03.check_recompile_fix(stub).status == "not written"
    assert ch03.check_recompile_fix(jax.jit(stub)).status == "not written"


# ------------------------------------------------------ Exercise 4: per-example norms


def norms_course(params, X, Y):
    grads = jax.vmap(jax.grad(ch03.mlp_loss), in_axes=(None, 0, 0))(params, X, Y)
    return jnp.sqrt(sum(jnp.sum(g.reshape(g.shape[0], -1) ** 2, axis=1)
                        for g in jax.tree.leaves(grads)))


def norms_vmap_of_norm(params, X, Y):  # vmap a function that returns one norm
    def one(x, y):
        return optax.tree.norm(jax.grad(ch03.mlp_loss)(params, x, y))
    return jax.vmap(one)(X, Y)


def norms_loop(params, X, Y):  # a Python loop of jax.grad, raveled with ravel_pytree
    from jax.flatten_util import ravel_pytree

    out = []
    for i in range(X.shape[0]):
        flat, _ = ravel_pytree(jax.grad(ch03.mlp_loss)(params, X[i], Y[i]))
        out.append(jnp.linalg.norm(flat))
    return jnp.stack(out)


def test_per_example_norms_accepts_honest_answers_also_on_unseen_batches():
    assert ch03.check_per_example_norms(norms_course)
    for honest in (norms_vmap_of_norm, norms_loop):
        r = hidden(4, honest)
        assert r, str(r)


def _per_example_grads(params, X, Y):
    return jax.vmap(jax.grad(ch03.mlp_loss), in_axes=(None, 0, 0))(params, X, Y)


def norms_batch_mean_broadcast(params, X, Y):  # the example
    g = jax.grad(lambda p: jax.vmap(ch03.mlp_loss, (None, 0, 0))(p, X, Y).mean())(params)
    return jnp.full(X.shape[0], optax.tree.norm(g))


def norms_batch_sum_broadcast(params, X, Y):
    g = jax.grad(lambda p: jax.vmap(ch03.mlp_loss, (None, 0, 0))(p, X, Y).sum())(params)
    return jnp.full(X.shape[0], optax.tree.norm(g))


def norms_batch_scalar(params, X, Y):
    g = jax.grad(lambda p: jax.vmap(ch03.mlp_loss, (None, 0, 0))(p, X, Y).mean())(params)
    return optax.tree.norm(g)


def norms_of_mean_loss(params, X, Y):  # each example's grad of loss / n
    n = X.shape[0]
    return norms_course(params, X, Y) / n


def norms_leaf_sum(params, X, Y):
    grads = _per_example_grads(params, X, Y)
    return sum(jnp.sqrt(jnp.sum(g.reshape(g.shape[0], -1) ** 2, axis=1))
               for g in jax.tree.leaves(grads))


def norms_weights_only(params, X, Y):
    grads = _per_example_grads(params, X, Y)
    return jnp.sqrt(sum(jnp.sum(grads[k].reshape(len(X), -1) ** 2, axis=1)
                        for k in ("w1", "w2")))


def norms_per_leaf(params, X, Y):
    grads = _per_example_grads(params, X, Y)
    return jnp.stack([jnp.sqrt(jnp.sum(g.reshape(g.shape[0], -1) ** 2, axis=1))
                      for g in jax.tree.leaves(grads)], axis=1)


def norms_hardcoded_six(params, X, Y):  # right on the notebook's batch of 6 only
    grads = _per_example_grads(params, X, Y)
    return jnp.sqrt(sum(jnp.sum(g.reshape(6, -1) ** 2, axis=1) for g in jax.tree.leaves(grads)))


@pytest.mark.parametrize("wrong, words", [
    (norms_batch_mean_broadcast, ("same number", "batch's mean gradient",
                                  "one norm for the whole batch, repeated", "vmap")),
    (norms_batch_sum_broadcast, ("batch's sum gradient", "not one per example")),
    (norms_batch_scalar, ("expected shape (6,)", "one number for the whole batch")),
    (norms_of_mean_loss, ("6x too small", "not of the batch mean")),
    (lambda p, X, Y: norms_course(p, X, Y) ** 2, ("squared",)),
    (norms_leaf_sum, ("added the norms", "sum of ALL squares")),
    (norms_weights_only, ("leave out b1, b2", "EVERY leaf")),
    (norms_per_leaf, ("one norm per parameter array",)),
    (lambda p, X, Y: norms_course(p, X, Y)[:, None], ("reshape to (6,)",)),
    (_per_example_grads, ("dict",)),
    (lambda p, X, Y: jnp.full(X.shape[0], jnp.nan), ("NaN",)),
])
@pytest.mark.mistake
def test_per_example_norms_names_each_mistake(wrong, words):
    r = ch03.check_per_example_norms(wrong)
    expect(r, *words)
    assert "norms [" not in r.message


@pytest.mark.mistake
def test_per_example_norms_catches_a_hardcoded_batch_on_unseen_inputs():
    assert ch03.check_per_example_norms(norms_hardcoded_six)
    expect(hidden(4, norms_hardcoded_six), "does not show (a batch of")


@pytest.mark.mistake
def test_per_example_norms_garbage_and_course_code():
    assert not ch03.check_per_example_norms(lambda p, X, Y: "1.0")
    for answer in (answers.per_example_norms_reference,
                   lambda p, X, Y: np.sqrt(sum(answers.per_example_squares(p, X, Y).values()))):
        expect(ch03.check_per_example_norms(answer), "course's own function")


# ------------------------------------------------------------------ Exercise 5: the port


def convert_good(sd):
    return {
        "conv": {"kernel": jnp.asarray(sd["conv.weight"].transpose(2, 3, 1, 0)),
                 "bias": jnp.asarray(sd["conv.bias"])},
        "fc1": {"kernel": jnp.asarray(sd["fc1.weight"].T), "bias": jnp.asarray(sd["fc1.bias"])},
        "fc2": {"kernel": jnp.asarray(sd["fc2.weight"].T), "bias": jnp.asarray(sd["fc2.bias"])},
    }


def make_forward(flatten_nchw=True, fc1_bias=True):
    def forward(params, x):
        c = lax.conv_general_dilated(x, params["conv"]["kernel"], (1, 1), "SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
        c = c + params["conv"]["bias"]
        h = jax.nn.relu(c)
        if flatten_nchw:
            h = h.transpose(0, 3, 1, 2)
        h = h.reshape(h.shape[0], -1)
        f1 = h @ params["fc1"]["kernel"] + (params["fc1"]["bias"] if fc1_bias else 0.0)
        f2 = jax.nn.relu(f1) @ params["fc2"]["kernel"] + params["fc2"]["bias"]
        return {"conv": c, "fc1": f1, "fc2": f2}
    return forward


def make_loss(forward, reduction="mean"):
    def loss_fn(params, x, y):
        losses = optax.softmax_cross_entropy_with_integer_labels(forward(params, x)["fc2"], y)
        return losses.mean() if reduction == "mean" else losses.sum()
    return loss_fn


def make_step(loss_fn, optimizer, finish=None):
    def train_step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        if finish is not None:
            return finish(params, updates, opt_state, loss)
        return optax.apply_updates(params, updates), opt_state, loss
    return train_step


def port(convert=convert_good, forward=None, reduction="mean", optimizer=None, finish=None,
         **kwargs):
    forward = forward or make_forward()
    optimizer = optimizer or optax.sgd(LR)
    loss = make_loss(forward, reduction)
    return ch03.check_port(convert, forward, loss, make_step(loss, optimizer, finish),
                           optimizer, live=False, **kwargs)


# -- another honest port: einsum layers, a hand-written loss, a jitted step, NCHW inside


def convert_einsum(sd):
    return jax.tree.map(jnp.asarray, {
        "conv": {"kernel": np.einsum("oihw->hwio", sd["conv.weight"]), "bias": sd["conv.bias"]},
        "fc1": {"kernel": np.swapaxes(sd["fc1.weight"], 0, 1), "bias": sd["fc1.bias"]},
        "fc2": {"kernel": np.swapaxes(sd["fc2.weight"], 0, 1), "bias": sd["fc2.bias"]},
    })


def forward_nchw_inside(params, x):
    xc = jnp.transpose(x, (0, 3, 1, 2))
    k = jnp.transpose(params["conv"]["kernel"], (3, 2, 0, 1))  # back to OIHW
    c = lax.conv_general_dilated(xc, k, (1, 1), ((1, 1), (1, 1)),
                                 dimension_numbers=("NCHW", "OIHW", "NCHW"))
    c = c + params["conv"]["bias"][None, :, None, None]
    f1 = jnp.einsum("nchw,chwo->no", jax.nn.relu(c),
                    params["fc1"]["kernel"].reshape(c.shape[1:] + (-1,)))
    f1 = f1 + params["fc1"]["bias"]
    f2 = jnp.einsum("nh,ho->no", jax.nn.relu(f1), params["fc2"]["kernel"]) + params["fc2"]["bias"]
    return {"conv": jnp.transpose(c, (0, 2, 3, 1)), "fc1": f1, "fc2": f2}


def loss_by_hand(params, x, y):
    logits = forward_nchw_inside(params, x)["fc2"]
    logz = jax.scipy.special.logsumexp(logits, axis=1)
    return jnp.mean(logz - jnp.take_along_axis(logits, y[:, None], axis=1)[:, 0])


chained = optax.chain(optax.scale(-LR))


@jax.jit
def step_jitted(params, opt_state, x, y):
    loss, grads = jax.value_and_grad(loss_by_hand)(params, x, y)
    updates, opt_state = chained.update(grads, opt_state)
    return optax.apply_updates(params, updates), opt_state, loss


HONEST_PORTS = {
    "course-like": (convert_good, make_forward(), make_loss(make_forward()),
                    make_step(make_loss(make_forward()), optax.sgd(LR)), optax.sgd(LR)),
    "einsum, NCHW inside, jitted step": (convert_einsum, forward_nchw_inside, loss_by_hand,
                                         step_jitted, chained),
}


@pytest.mark.parametrize("name", sorted(HONEST_PORTS))
def test_port_accepts_honest_ports_also_on_unseen_weights_and_batches(name):
    r = hidden(5, HONEST_PORTS[name])
    assert r, str(r)
    assert "notebook's input and on 1 unseen" in r.message
    assert "22 arrays match PyTorch" in str(_core._LAST[(3, ch03.EX5)])


def test_the_course_port_matches_pytorch_and_is_refused():
    """The private port (the hidden cases' reference) matches the stored PyTorch run."""
    ref = ch03.reference(live=False)
    x = jnp.asarray(parity.nchw_to_nhwc(ref["input/x"]))
    got = parity.jax_trace(answers.convert_params(ref.torch_state_dict), x,
                           jnp.asarray(ref["input/y"]), forward=answers.forward,
                           loss_fn=answers.loss_fn, step=answers.sgd_step)
    assert parity.compare(ref.expected, got).passed
    arrays = answers.port_arrays(7, 3, ch03.LAB_CONFIG)
    assert arrays["input/x"].shape == (3, 3, 6, 6) and arrays["step/fc2.bias"].shape == (10,)

    def step(params, opt_state, x, y):
        return answers.sgd_step(params, x, y), opt_state, answers.loss_fn(params, x, y)
    expect(ch03.check_port(answers.convert_params, answers.forward, answers.loss_fn, step,
                           optax.sgd(LR), live=False), "course's own function")


@pytest.mark.mistake
def test_port_refuses_the_course_weight_converters():
    def convert(sd):
        return {"conv": parity.conv2d_to_jax(sd["conv.weight"], sd["conv.bias"]),
                "fc1": parity.linear_to_jax(sd["fc1.weight"], sd["fc1.bias"]),
                "fc2": parity.linear_to_jax(sd["fc2.weight"], sd["fc2.bias"])}
    r = port(convert)
    expect(r, "parity.", "course's own function", "write this yourself")


@pytest.mark.mistake
def test_port_names_the_wrong_return_order():
    r = port(finish=lambda p, u, s, loss: (loss, optax.apply_updates(p, u), s))
    expect(r, "train_step returned (loss, params, opt_state)", "wrong order",
           "(params, opt_state, loss)", "in that order")
    assert "layout" not in f"{r.message} {r.hint}"
    r = port(finish=lambda p, u, s, loss: (optax.apply_updates(p, u), loss, s))
    expect(r, "(params, loss, opt_state)", "wrong order")
    r = port(finish=lambda p, u, s, loss: (optax.apply_updates(p, u), loss))
    expect(r, "a tuple of 2", "(params, opt_state, loss)")


@pytest.mark.parametrize("finish, words", [
    (lambda p, u, s, loss: (p, s, loss), ("unchanged", "optax.apply_updates")),
    (lambda p, u, s, loss: (u, s, loss), ("returns the updates", "optax.apply_updates")),
    (lambda p, u, s, loss: (jax.tree.map(lambda a, b: a - b, p, u), s, loss),
     ("along the gradient instead of against it",)),
])
@pytest.mark.mistake
def test_port_names_optimizer_step_mistakes(finish, words):
    r = port(finish=finish)
    expect(r, "(step/", *words)
    assert "values differ" not in r.message


@pytest.mark.mistake
def test_port_names_a_wrong_learning_rate():
    r = port(optimizer=optax.sgd(0.01))
    expect(r, "(step/", "0.1 times as far", "lr = 0.1")


@pytest.mark.mistake
def test_port_names_adam_where_pytorch_used_sgd():
    r = port(optimizer=optax.adam(LR))
    expect(r, "(step/", "Adam", "optax.sgd(0.1)", "torch.optim.SGD")


@pytest.mark.mistake
def test_port_names_a_transposed_weight():
    def convert(sd):
        p = convert_good(sd)
        p["fc2"]["kernel"] = jnp.asarray(sd["fc2.weight"])  # forgot .T
        return p
    expect(port(convert), "layer 'fc2'", "transposed")


@pytest.mark.mistake
def test_port_names_a_pytorch_layout_conv_kernel():
    def convert(sd):
        p = convert_good(sd)
        p["conv"]["kernel"] = jnp.asarray(sd["conv.weight"])
        return p
    expect(port(convert), "layer 'conv'", "OIHW")


@pytest.mark.mistake
def test_port_names_a_missing_bias():
    expect(port(forward=make_forward(fc1_bias=False)), "layer 'fc1'", "missing or extra bias")


@pytest.mark.mistake
def test_port_names_nchw_vs_nhwc_flatten_order():
    expect(port(forward=make_forward(flatten_nchw=False)), "layer 'fc1'", "flatten order",
           "NCHW")


@pytest.mark.mistake
def test_port_names_sum_instead_of_mean():
    expect(port(reduction="sum"), "(loss)", "sum where the reference takes a mean over 8")


@pytest.mark.mistake
def test_port_reports_a_crash_and_who_raised_it():
    def convert(sd):
        p = convert_good(sd)
        p["fc1"]["kernel"] = jnp.asarray(sd["fc1.weight"])
        return p
    r = port(convert, forward=lambda p, x: {"fc2": x @ p["fc1"]["kernel"]})
    expect(r, "transposed")  # caught at the params, before the crash

    def boom(params, x):
        raise ValueError("dot_general requires contracting dimensions to have the same shape")
    expect(port(forward=boom), "forward(params, x) raised ValueError", "PyTorch's layout")

    def typo(params, x):
        raise KeyError("fc3")
    r = port(forward=typo)
    expect(r, "forward(params, x) raised KeyError")
    assert "layout" not in r.hint


@pytest.mark.mistake
def test_port_catches_a_hardcoded_batch_on_unseen_inputs():
    def forward(params, x):
        out = make_forward()(params, x)
        return out | {"fc1": out["fc1"].reshape(8, -1)}
    assert port(forward=forward)
    r = hidden(5, (convert_good, forward, make_loss(forward),
                   make_step(make_loss(forward), optax.sgd(LR)), optax.sgd(LR)))
    expect(r, "does not show (other weights and images, a batch of")


def test_port_live_against_torch():
    pytest.importorskip("torch")
    forward = make_forward()
    optimizer = optax.sgd(LR)
    loss = make_loss(forward)
    r = ch03.check_port(convert_good, forward, loss, make_step(loss, optimizer), optimizer,
                        live=True)
    assert r, r.message
    assert ch03.reference().source.startswith("live: torch")


# ------------------------------------------------------------ the lab's reference


def test_live_torch_matches_stored_reference():
    pytest.importorskip("torch")
    live = ch03.reference(live=True)
    assert live.source.startswith("live: torch")
    report = parity.compare(parity.load_reference(ch03.LAB_CONFIG["name"]).expected, live.expected)
    assert report.passed, str(report)


def test_reference_without_torch_says_so(monkeypatch):
    monkeypatch.setattr(parity, "torch_available", lambda: False)
    r = ch03.reference()
    assert r.source.startswith("stored:")
    assert r.meta["lr"] == ch03.LAB_CONFIG["lr"] and r.meta["name"] == ch03.LAB_CONFIG["name"]


# ------------------------------------------------------------ the whole lab, graded


def test_an_honest_lab_passes_the_grader_on_every_learners_inputs():
    namespace = {"clipped_update": clip_where, "predicted_compiles": 5,
                 "update_fixed": jax.jit(decay_exp2), "per_example_grad_norms": norms_loop,
                 **dict(zip(ch03.LAB.exercises[4].names,
                            HONEST_PORTS["einsum, NCHW inside, jitted step"]))}
    results = ch03.LAB.grade(namespace, seed=SEEDS[1])  # the other tests use SEEDS[0]
    assert all(results), "\n".join(map(str, results))
