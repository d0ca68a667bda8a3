"""Lab 8's keys: references, hidden cases and known mistakes (see :mod:`grading`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from grading import Key
from tpu_course import hardware, lm
from tpu_course.checks.ch08 import (
    DECODE_CHIP, DECODE_POSITION, _attention_case, _causal_case, _generate_case, _resume_case,
    decode_config, exercise1_config)
from tpu_course.checks.engine import Mistake

# Exercise 1: N parameters (M of them multiply), F the chapter's FLOPs per token, A attention's.
_C = exercise1_config()
N, F, V, D, T, L = (lm.param_count(_C), lm.flops_per_token(_C), _C.vocab, _C.d_model,
                    _C.context, _C.layers)
M, A, HEAD = N - (V + T) * D, 12 * L * D * T, V * D
EX1 = Key(mistakes=[Mistake(hint, answer) for answer, hint in [
    ((N - HEAD, F), "you left out one of the vocab x d_model tables: the token embedding and the "
                    "output head are separate parameters (not tied)"),
    ((N - 2 * HEAD, F), "you left out both vocab x d_model tables (token embedding, output head)"),
    ((N - T * D, F), "you left out the position table (context x d_model)"),
    ((N - 2 * D * L - D, F), "you left out the norms' scales (two per block, one final)"),
    ((M, F), "that is the parameters that multiply: count every parameter, the tables included"),
    ((N, 6 * N + A), "you counted both embedding tables as matmuls (6 x every parameter): a lookup "
                     "multiplies nothing (the output head does)"),
    ((N, F + 6 * HEAD), "you counted an embedding table as a matmul: the token and position "
                        "tables are lookups (the output head, a table of its own, multiplies)"),
    ((N, 6 * N), "that is 6N with every parameter and no attention term"),
    ((N, F - A), "you left out the attention term, 12 x layers x d_model x context per token: "
                 "the scores and the weighted sum grow with the context (PaLM, appendix B)"),
    ((N, F - A / 2), "that is half of attention's term: the masked implementation computes the "
                     "whole context x context square"),
    ((N, F / 2), "you counted a multiply-add as 1 FLOP: XLA (and the 6N rule) counts 2"),
    ((N, 2 * M + A / 3), "that is the forward pass alone (2N + attention): training adds the "
                         "backward pass, twice the forward"),
    ((N, 2 * M), "that is the forward pass alone (2N), without attention"),
    ((N, F - 6 * HEAD), "you left out the output head: it multiplies every token, 6 x d_model x "
                        "vocab")]])

# Exercise 3: the losses come from one device and the mistakes are rules on the shardings.
EX3 = Key(hidden=lambda rng: [_attention_case((128, 64, int(rng.choice([8, 16])), 8), (2, 4))])


def make_attention(mask="tril", scale=True, axis=-1, out_dtype=None, fill=-jnp.inf):
    """Exercise 2's causal attention: the right one by default, each other choice a mistake."""
    def causal_attention(q, k, v):
        t, f32 = q.shape[1], jnp.float32
        s = jnp.einsum("bqhd,bkhd->bhqk", q.astype(f32), k.astype(f32))
        s = s / jnp.sqrt(f32(q.shape[-1])) if scale else s
        i, j = jnp.arange(t)[:, None], jnp.arange(t)[None, :]
        keep = {"tril": j <= i, "strict": j < i, "triu": j >= i, "none": j >= 0}[mask]
        p = jax.nn.softmax(jnp.where(keep, s, fill), axis=axis)
        out = jnp.einsum("bhqk,bkhd->bqhd", p, v.astype(f32))
        return out.astype(q.dtype if out_dtype is None else out_dtype)
    return causal_attention


def _ex2_hidden(rng):  # odd lengths, other head counts and widths, either dtype
    return [_causal_case((2, int(rng.choice([3, 9, 11])), int(rng.choice([1, 4])),
                          int(rng.choice([4, 8])), ), str(rng.choice(["float32", "bfloat16"])),
                         int(rng.integers(1 << 30)), "an odd length")]


_STRICT = ("the mask hides each query's own key too (strict <): keep keys j <= i, the "
           "query's own position included")
EX2 = Key(reference=make_attention(), hidden=_ex2_hidden, mistakes=[
    Mistake(h, make_attention(**kw)) for kw, h in [
        ({"mask": "none"}, "no causal mask: query i sees the keys after it; set the scores of "
                           "keys j > i to -inf before the softmax"),
        ({"mask": "strict"}, _STRICT),
        ({"mask": "strict", "fill": -1e30}, _STRICT),
        ({"mask": "triu"}, "you kept the upper triangle: query i must see keys 0..i (jnp.tril, "
                           "j <= i), not keys i..end"),
        ({"scale": False}, "scale the scores by 1 / sqrt(head_dim) before the softmax"),
        ({"axis": -2}, "the softmax runs over the queries: it must run over the keys, so that "
                       "each query's weights sum to 1"),
        ({"out_dtype": jnp.float32}, "bfloat16 came in and float32 goes out: compute in float32 "
                                     "inside if you like, then cast back to q.dtype")]])


def make_train(data_from_zero=False, save_at_index=False, skip=False, ignore_checkpoint=False,
               fresh_opt=False):
    """Exercise 5's resume loop: the right one by default, each other choice a mistake."""
    def train(directory, steps, problem):
        import orbax.checkpoint as ocp

        from tpu_course import textdata

        manager = ocp.CheckpointManager(directory)
        latest = None if ignore_checkpoint else manager.latest_step()
        params, opt_state = problem.init()
        start = 0
        if latest is not None:
            saved = manager.restore(latest, args=ocp.args.StandardRestore(
                {"params": params, "opt_state": opt_state}))
            params = saved["params"]
            opt_state = opt_state if fresh_opt else saved["opt_state"]
            start = latest + skip
        for step in range(start, steps):
            batch = textdata.batch_at(problem.corpus, step - start * data_from_zero,
                                      problem.batch, problem.length, problem.seed)
            params, opt_state, _ = problem.step(params, opt_state, *batch)
        if start < steps:
            manager.save(steps - save_at_index, args=ocp.args.StandardSave(
                {"params": params, "opt_state": opt_state}))
        manager.wait_until_finished()
        manager.close()
        return params
    return train


EX5 = Key(reference=make_train(), hidden=lambda rng: [_resume_case(
    int(rng.choice([4, 6])), int(rng.choice([1, 3])), int(rng.integers(1, 100)), "another run")],
    mistakes=[Mistake(h, make_train(**kw)) for kw, h in [
        ({"data_from_zero": True}, "after a resume the data starts again at batch 0: step k "
                                   "trains on batch_at(corpus, k, ...), whichever call runs it"),
        ({"save_at_index": True}, "a batch is trained twice: save the step count after the "
                                  "last step (steps), so that the resume starts at the first "
                                  "step not yet trained"),
        ({"skip": True}, "a batch is skipped: the saved step number is the count of steps "
                         "trained, so the next step to train is latest_step(), not one more"),
        ({"ignore_checkpoint": True}, "the checkpoint is ignored: the restarted run trains "
                                      "from step 0 again; ask the CheckpointManager for "
                                      "latest_step() and restore it"),
        ({"fresh_opt": True}, "the optimizer state starts fresh after a resume: save and "
                              "restore opt_state (Adam's moments and step count) with the "
                              "params")]])


_decode = nnx.jit(lambda model, tokens, cache: model.decode(tokens, cache))


def make_generate(top_k_shift=0, temperature_use="divide", greedy=True, prefill=True,
                  feed_back=True):
    """Exercise 6's decode loop: the right one by default, each other choice a mistake."""
    def generate(model, prompt, steps, key, temperature=0.0, top_k=None):
        cache = lm.init_cache(model.config, prompt.shape[0])
        logits, cache = _decode(model, prompt if prefill else prompt[:, -1:], cache)
        logits, after_prompt = logits[:, -1], cache
        new = []
        for i in range(steps):
            if temperature == 0 and greedy:
                token = jnp.argmax(logits, axis=-1)
            else:
                x = logits
                if top_k:
                    kth = jax.lax.top_k(x, top_k + top_k_shift)[0][:, -1:]
                    x = jnp.where(x >= kth, x, -jnp.inf)
                t = temperature or 1.0
                x = {"divide": x / t, "multiply": x * t, "ignore": x}[temperature_use]
                token = jax.random.categorical(jax.random.fold_in(key, i), x, axis=-1)
            new.append(token)
            logits, cache = _decode(model, token[:, None].astype(jnp.int32),
                                         cache if feed_back else after_prompt)
            logits = logits[:, -1]
        return jnp.stack(new, axis=1)
    return generate


EX6 = Key(reference=make_generate(), hidden=lambda rng: [_generate_case(
    2, int(rng.integers(2, 7)), 7, float(rng.choice([0.7, 3.0])), int(rng.choice([3, 6])),
    int(rng.integers(2, 100)), "another prompt")],
    mistakes=[Mistake(h, make_generate(**kw)) for kw, h in [
        ({"top_k_shift": 1}, "top-k keeps one logit too many: keep exactly the top_k largest "
                             "(jax.lax.top_k(logits, top_k)), the rest -inf"),
        ({"top_k_shift": -1}, "top-k keeps one logit too few: keep exactly the top_k largest, "
                              "the k-th included (logits >= the k-th largest)"),
        ({"temperature_use": "multiply"}, "divide the logits by the temperature (a high "
                                          "temperature flattens the distribution), do not "
                                          "multiply"),
        ({"temperature_use": "ignore"}, "the temperature is not used: sample from logits / "
                                        "temperature, not from the logits"),
        ({"greedy": False}, "temperature 0 is greedy decoding: take the argmax of the logits, "
                            "no sampling"),
        ({"prefill": False}, "the prompt is not prefilled: run model.decode on the whole "
                             "prompt first, so that the cache holds all its keys and values"),
        ({"feed_back": False}, "each step must decode with the cache the previous step "
                               "returned: the new bytes' keys and values are in it")]])

# Exercise 7: _I the chip's ridge point (bf16 FLOPs per HBM byte).
_I = hardware.get(DECODE_CHIP).critical_intensity()
_ridge = lambda **kw: lm.decode_ridge_batch(decode_config(), DECODE_CHIP, DECODE_POSITION, **kw)
_NO_CACHE = ("you left out the KV cache: every sequence also reads its own cached keys and values "
             "(2 x layers x d_model numbers per position), bytes that grow with the batch; "
             "without them (and attention's FLOPs) the batch is about the ridge point")
EX7 = Key(mistakes=[Mistake(h, answer) for answer, h in [
    (_ridge(cache_bytes_per_value=0), _NO_CACHE),
    (_I, _NO_CACHE),
    (_ridge(weight_bytes_per_param=4), "you counted the weights as fp32 (4 bytes): serving reads "
                                       "bf16 weights, 2 bytes"),
    (_ridge(weight_bytes_per_param=4, cache_bytes_per_value=4), "twice bf16 serving's bytes per "
     "FLOP: the int8 peak (twice bf16's), or 4-byte weights and cache; the matmuls run at the "
     "bf16 peak and read 2 bytes per value"),
    (2 * _I, "that is twice the ridge point: the int8 peak (use the bf16 one) and no KV cache"),
    (_I / 2, "half the ridge point: a multiply-add is 2 FLOPs per weight, not 1"),
    (_ridge(cache_bytes_per_value=1), "every cached position holds a key and a value (2 x layers "
                                      "x d_model numbers, 2 bytes each): you counted one"),
    (_ridge(weight_bytes_per_param=1, cache_bytes_per_value=1), "1 byte per value is int8 "
     "serving: this model serves bf16 weights and cache, 2 bytes each")]])

KEYS = {"Exercise 1": EX1, "Exercise 2": EX2, "Exercise 3": EX3, "Exercise 5": EX5,
        "Exercise 6": EX6, "Exercise 7": EX7}
