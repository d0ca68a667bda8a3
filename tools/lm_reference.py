"""Write chapter 8's committed long run: ``bench/results/lm-cpu-600.json``, and its copy
``tpu_course/reference/lm-cpu-600.json`` that the chapter reads (package data).

Trains the chapter's model, ``LMConfig.cpu(layers=2)``, for 600 steps (batch 32 x 128
bytes, AdamW, warmup-cosine with the chapter's peak learning rate, float32 compute, as
the chapter trains on a CPU) on one CPU device with ``tpu_course.lm.run``, scoring
held-out bits per byte every 50 steps, then samples the rest of the context greedily
from a prompt. The chapter trains 400 steps itself and shows this file, labelled as a
committed measurement, for a longer curve. About 6 CPU-minutes (user + system):

    .venv/bin/python -m tools.lm_reference [--steps 600] [--out PATH]
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import platform
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "lm-cpu-600.json"
SHIPPED = ROOT / "tpu_course" / "reference" / OUT.name  # what the notebook reads
PROMPT = b"def "
LAYERS, PEAK_LR = 2, 5e-3  # the chapter's (notebooks/08_language_model.py, section 5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--out", type=pathlib.Path, default=OUT)
    args = parser.parse_args(argv)

    import jax
    import numpy as np

    from tpu_course import lm, runtime, textdata

    # what the chapter trains on a CPU
    config = lm.LMConfig.cpu(layers=LAYERS, compute_dtype="float32")
    start = time.perf_counter()
    history = lm.run(config, args.steps, batch=32, seed=0, peak_lr=PEAK_LR, eval_every=50,
                     log=lambda r: print(json.dumps(r), flush=True)
                     if "heldout_bpb" in r else None)
    seconds = time.perf_counter() - start
    model = jax.tree.map(lambda x: x, history["params"])  # the trained parameters
    from flax import nnx

    trained = nnx.merge(history["graphdef"], model)
    prompt = np.frombuffer(PROMPT, np.uint8).astype(np.int32)[None]
    out = lm.generate(trained, prompt, steps=config.context - prompt.shape[1])
    corpus = textdata.load()
    result = {
        "what": f"chapter 8's long run: LMConfig.cpu(layers={LAYERS}), batch 32 x 128, "
                f"AdamW warmup-cosine (peak {PEAK_LR:g}, warmup 10 % of the steps), "
                "float32 compute, one CPU device",
        "written_by": "python -m tools.lm_reference",
        "date": datetime.date.today().isoformat(),
        "runtime": runtime.describe().banner(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "corpus": str(corpus),
        "params": lm.param_count(config),
        "steps": history["steps"],
        "losses": [round(x, 5) for x in history["losses"]],
        "eval_steps": history["eval_steps"],
        "heldout_bpb": [round(x, 4) for x in history["heldout_bpb"]],
        "unigram_bpb": round(textdata.unigram_bits_per_byte(corpus.train, corpus.heldout), 4),
        "bigram_bpb": round(textdata.bigram_bits_per_byte(corpus.train, corpus.heldout), 4),
        "wall_s": round(seconds, 1),
        "sample_prompt": PROMPT.decode(),
        "sample": bytes(np.asarray(out[0], np.uint8).tolist()).decode("utf-8", "replace"),
    }
    text = json.dumps(result, indent=1) + "\n"
    args.out.write_text(text)
    if args.out == OUT:
        SHIPPED.write_text(text)
    print(f"wrote {args.out} ({seconds:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
