"""Lab 6's keys: hidden cases for every exercise that runs code; exercise 6's reference and
known mistakes (the others name theirs by rules in ``tpu_course/checks/ch06.py``)."""
from __future__ import annotations

from grading import Key
from tpu_course import comms, hardware
from tpu_course.checks.engine import Case, Mistake


def _fsdp_hidden(rng):
    """2 devices and an odd width ((W, 10) splits its second dimension, (W, W) nothing), or 4
    devices and a width 8 does not divide."""
    devices, width = ((2, int(rng.choice([99, 147, 195]))) if rng.integers(2) else
                      (4, int(rng.choice([100, 196, 324]))))
    return [Case(f"a {devices}-device mesh and an MLP {width} wide",
                 {"devices": devices, "width": width})]


def _ring_hidden(rng):
    """A ring of 5-7 devices, an odd block of more than 2n elements (both halves carry data)."""
    n = int(rng.choice([5, 6, 7]))
    block = (int(rng.integers(1, 4)), 2 * int(rng.integers(n, 20)) + 1)
    return [Case(f"a ring of {n} devices, blocks of {block[0]}x{block[1]}",
                 {"n": n, "block": block})]


def _slices_hidden(rng):
    meshes = [[(4, 2), (2, 3), (2, 2)][int(i)] for i in rng.choice(3, size=2, replace=False)]
    blocks = [(c * int(rng.integers(1, 5)), int(rng.integers(3, 20))) for _, c in meshes]
    return [Case(f"{s} slices of {c} chips, blocks of {b[0]}x{b[1]}", {"mesh": (s, c), "block": b})
            for (s, c), b in zip(meshes, blocks)]


def _rows_hidden(rng):
    rows = int(rng.choice([8, 24]))
    return [Case(f"a (data, model) mesh where both devices of a process hold the same block, "
                 f"{rows} rows", {"mesh": "replicated", "rows": rows})]


def make_choose(bytes_per_param=10, scale=lambda s: 2 * (s - 1) / s, one_slice="none",
                swap=False):
    """The chapter's two rules; the arguments make the known slips (bytes per parameter
    against HBM, the DCN threshold ``scale(S) x C / W_dcn``, "dp" across one slice, swaps)."""
    def choose(chip, params, tokens_per_slice, slices):
        fits = bytes_per_param * params <= hardware.get(chip).hbm_bytes
        within = ("fsdp" if fits else "dp") if swap else ("dp" if fits else "fsdp")
        if slices == 1:
            return within, one_slice
        enough = tokens_per_slice >= scale(slices) * comms.dcn_intensity(chip)
        return within, "dp" if enough else "pipeline"
    return choose


def _plans_hidden(rng):
    """Other chips, model sizes, batches and slice counts, none within 3% of a threshold."""
    plans = []
    while len(plans) < 6:
        chip, slices = str(rng.choice(["v5e", "v5p", "v6e"])), int(rng.choice([1, 2, 3, 4, 6, 8, 16, 64]))
        hbm, intensity = hardware.get(chip).hbm_bytes, comms.dcn_intensity(chip)
        params = float(f"{hbm / 10 * rng.uniform(0.3, 3.0):.3g}")
        tokens = float(f"{intensity * rng.uniform(0.4, 2.4):.3g}")
        threshold = 2 * (slices - 1) / slices * intensity
        if abs(10 * params / hbm - 1) > 0.03 and (slices == 1 or abs(tokens / threshold - 1) > 0.03):
            plans.append((chip, params, tokens, slices))
    return [Case("other chips, model sizes, batches and slice counts", {"plans": tuple(plans)})]


KEYS = {"Exercise 2": Key(hidden=_fsdp_hidden), "Exercise 4": Key(hidden=_ring_hidden),
        "Exercise 5": Key(hidden=_slices_hidden), "Exercise 7": Key(hidden=_rows_hidden),
        "Exercise 6": Key(reference=make_choose(), hidden=_plans_hidden, mistakes=[
            Mistake("that is the scaling book's rule, C / W_dcn tokens per slice (bf16 "
                    "gradients, the many-slice limit): the exercise asks for the course's "
                    "variant (fp32 gradients, a ring over S slices, 2 (S-1)/S x 4 bytes per "
                    "parameter), which agrees at two slices and asks for more beyond",
                    make_choose(scale=lambda s: 1.0)),
            Mistake("you let all 6 FLOPs per parameter per token hide the all-reduce; only the "
                    "backward pass's 4 can (the gradients exist only once it has run)",
                    make_choose(scale=lambda s: 2 * (s - 1) / s * 4 / 6)),
            Mistake("you used the many-slice limit (64 bits per parameter) at every slice "
                    "count: a ring over S slices sends 2 (S-1)/S x 32 bits per parameter, 32 "
                    "bits at two slices", make_choose(scale=lambda s: 2.0)),
            Mistake("your threshold is half the course's: its variant all-reduces fp32 "
                    "gradients (4 bytes per parameter, not bf16's 2) by a ring that sends each "
                    "byte twice, 2 (S-1)/S times the array, not (S-1)/S",
                    make_choose(scale=lambda s: (s - 1) / s)),
            *[Mistake(f"you count {b} bytes per parameter ({what}); the chapter's count, the "
                      "scaling book's, is 10 bytes per parameter with Adam",
                      make_choose(bytes_per_param=b)) for b, what in [
                (2, "the bf16 parameters alone"), (4, "the fp32 parameters alone"),
                (8, "parameters and gradients only"),
                (12, "fp32 parameters and Adam's two moments, without gradients"),
                (16, "fp32 parameters, gradients and Adam's two moments")]],
            Mistake("dp and fsdp are swapped: FSDP is for a replica that does not fit in HBM",
                    make_choose(swap=True)),
            Mistake("with one slice nothing crosses slices: across_slices is 'none'",
                    make_choose(one_slice="dp"))])}
