"""Write the stored PyTorch reference for chapter 3's parity lab (needs torch).

    python scripts/make_parity_reference.py          # writes tpu_course/reference/parity_cnn.npz

The course runs without PyTorch: the notebook and the lab's checker then compare a JAX
port with the arrays stored here. Anyone with torch can rerun this script to regenerate
them (the model, the seed and the optimizer are in ``tpu_course.checks.ch03.LAB_CONFIG``), and
``tests/test_parity.py`` checks that a live run still matches the stored file.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from tpu_course import parity
from tpu_course.checks import ch03


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=ch03.LAB_CONFIG["seed"])
    parser.add_argument("--out", type=pathlib.Path,
                        default=parity.REFERENCE_DIR / f"{ch03.LAB_CONFIG['name']}.npz")
    args = parser.parse_args(argv)
    arrays = ch03.make_reference(args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **arrays)
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes, {len(arrays)} arrays)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
