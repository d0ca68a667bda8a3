"""``python -m tpu_course.train``: train a chapter-5 model from the command line.

Thin on purpose (as flax's ``examples/mnist`` keeps ``main.py``): it turns flags into a
``TrainConfig``, calls ``train.fit`` and prints the history. ``--quick`` is the 2-core
CPU preset; ``--checkpoint-dir DIR`` saves every epoch and ``--resume`` continues there
(it says which epoch it resumes after, or that nothing was saved yet). A bad flag or
config is one line on stderr and exit code 2, before any training; SIGTERM saves the
epoch in flight and exits with 143 (``train.Preempted``).

The course's command lines (this one and ``python -m tpu_course.lm``) share how they
speak: :class:`ArgumentParser` (argparse's, with a bad flag in one line), :func:`refuse`
(one ``error:`` line, exit code 2) and :func:`say` (one line of news on stderr, so that
stdout holds only results).
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
import warnings
from typing import Any, Iterator, NoReturn

from tpu_course import errors, train

PROG = "python -m tpu_course.train"


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, except that a bad flag is one line on stderr (``PROG: error:
    ...``, with a pointer to ``--help``) and exit code 2, without the usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (--help lists the flags)\n")


def refuse(prog: str, message: str) -> int:
    """Print ``PROG: error: MESSAGE`` as one line on stderr; return exit code 2 (argparse's)."""
    print(f"{prog}: error: {_one_line(message)}", file=sys.stderr, flush=True)
    return 2


def say(prog: str, message: str) -> None:
    """Print ``PROG: MESSAGE`` as one line on stderr: news (what was resumed, what will be
    saved), kept off stdout, which holds only the run's results."""
    print(f"{prog}: {_one_line(message)}", file=sys.stderr, flush=True)


def _one_line(message: Any) -> str:
    """``message`` with its line breaks (and the indentation after them) as single spaces."""
    return re.sub(r"\s*\n\s*", " ", str(message).strip())


@contextlib.contextmanager
def warnings_as_lines(prog: str) -> Iterator[None]:
    """Inside the block, a warning prints as one ``PROG: warning: ...`` line (no source
    line, no file path), as the CLIs' other messages do."""
    with warnings.catch_warnings():
        def show(message: Any, category: Any, *args: Any, **kwargs: Any) -> None:
            say(prog, f"warning: {message}")

        warnings.showwarning = show
        yield


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="the 2-core CPU preset")
    parser.add_argument("--dataset", default=None, choices=("mnist", "fashion_mnist"))
    parser.add_argument("--pipeline", default=None, choices=tuple(train.PIPELINES))
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--bf16", action="store_true", help="bfloat16 compute, float32 parameters")
    parser.add_argument("--checkpoint-dir", default=None, help="save the state there after every epoch")
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint-dir")
    args = parser.parse_args(argv)
    if args.resume and args.checkpoint_dir is None:
        return refuse(PROG, "--resume needs --checkpoint-dir DIR: the folder the run to "
                            "continue saved its checkpoints in")
    config = train.TrainConfig.quick() if args.quick else train.TrainConfig()
    changes = {k: v for k, v in (("dataset", args.dataset), ("pipeline", args.pipeline),
                                 ("epochs", args.epochs)) if v is not None}
    if args.bf16:
        changes["compute_dtype"] = "bfloat16"
    try:
        config = config.replace(**changes)
        if args.resume:
            train.checkpoints.check_directory(args.checkpoint_dir, "checkpoint_dir")
            newest = train.latest_step(args.checkpoint_dir)
            if newest is None:
                say(PROG, f"--resume: nothing saved in {args.checkpoint_dir} yet: starting "
                          "from scratch (epoch 1)")
            else:
                say(PROG, f"--resume: continuing after epoch {newest} of {config.epochs}, "
                          f"saved in {args.checkpoint_dir}")
        with warnings_as_lines(PROG):
            history = train.fit(config, checkpoint_dir=args.checkpoint_dir,
                                resume=args.resume)
    except errors.CourseError as e:  # the course's message says what to do: no traceback
        return refuse(PROG, str(e).replace("TrainConfig.epochs", "--epochs"))
    print(history.summary())
    print(history.table())
    print(train.time_to_accuracy(history, 0.976))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
