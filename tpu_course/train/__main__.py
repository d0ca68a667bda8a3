"""``python -m tpu_course.train``: train a chapter-5 model from the command line.

Thin on purpose (as flax's ``examples/mnist`` keeps ``main.py``): it turns flags into a
``TrainConfig``, calls ``train.fit`` and prints the history. ``--quick`` is the 2-core
CPU preset; ``--checkpoint-dir DIR`` saves every epoch and ``--resume`` continues there.
A bad flag or config is one line on stderr and exit code 2 (argparse's), before any
training; SIGTERM saves the epoch in flight and exits with 143 (``train.Preempted``).
"""

from __future__ import annotations

import argparse
import sys

from tpu_course import errors, train


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tpu_course.train", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the 2-core CPU preset")
    parser.add_argument("--dataset", default=None, choices=("mnist", "fashion_mnist"))
    parser.add_argument("--pipeline", default=None, choices=tuple(train.PIPELINES))
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--bf16", action="store_true", help="bfloat16 compute, float32 parameters")
    parser.add_argument("--checkpoint-dir", default=None, help="save the state there after every epoch")
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint-dir")
    args = parser.parse_args(argv)
    if args.resume and args.checkpoint_dir is None:
        return _refuse("--resume needs --checkpoint-dir DIR: the folder the run to continue "
                       "saved its checkpoints in")
    config = train.TrainConfig.quick() if args.quick else train.TrainConfig()
    changes = {k: v for k, v in (("dataset", args.dataset), ("pipeline", args.pipeline),
                                 ("epochs", args.epochs)) if v is not None}
    if args.bf16:
        changes["compute_dtype"] = "bfloat16"
    try:
        config = config.replace(**changes)
        history = train.fit(config, checkpoint_dir=args.checkpoint_dir, resume=args.resume)
    except errors.CourseError as e:  # the course's message says what to do: no traceback
        return _refuse(str(e).replace("TrainConfig.epochs", "--epochs"))
    print(history.summary())
    print(history.table())
    print(train.time_to_accuracy(history, 0.976))
    return 0


def _refuse(message: str) -> int:
    print(f"python -m tpu_course.train: error: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
