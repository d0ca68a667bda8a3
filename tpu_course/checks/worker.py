"""The grading worker: runs one submission and writes what its code outputs, as data.

``python -m tpu_course.checks.worker JOB_DIR`` (the grader starts it, in its sandbox)
reads ``JOB_DIR/job.json``, runs ``JOB_DIR/submission.ipynb`` cell by cell on a fresh
kernel, and writes ``JOB_DIR/results.json``:

* ``captured``: each prediction's value as it stood at the end of the cell that states it
  (the first cell that assigns the name), read before any later cell runs;
* ``outputs``: for each exercise, what the probe returned on each case the grader sent
  (:func:`tpu_course.checks.engine.encode`), with the captured values in place of the
  learner's names;
* ``errors``: the cells that raised (name and first line).

It holds no checker, no expected output and no reference: those stay with the grader,
which reads ``results.json`` as data only. The kernel is the learner's process; nothing
it does can reach the grader's process.
"""

from __future__ import annotations

import json
import pathlib
import sys
import time
from typing import Any

#: The code the worker runs in the kernel to read a value or run a probe; its output
#: goes to a file the worker reads at once.
_CAPTURE = """
import json as _tpu_json
from tpu_course.checks import engine as _tpu_engine
_tpu_out = {{}}
for _tpu_name in {names!r}:
    try:
        _tpu_out[_tpu_name] = _tpu_engine.encode(_tpu_engine.plain(globals()[_tpu_name]))
    except BaseException as _tpu_err:
        _tpu_out[_tpu_name] = _tpu_engine.encode(_tpu_engine.Raised(type(_tpu_err).__name__, str(_tpu_err)[:200]))
open({path!r}, "w").write(_tpu_json.dumps(_tpu_out))
del _tpu_out, _tpu_name
"""
_PROBE = """
from tpu_course.checks import worker as _tpu_worker
_tpu_worker.probe_in_kernel(globals(), {job!r}, {path!r})
"""


def probe_in_kernel(namespace: dict, job_path: str, out_path: str) -> None:
    """In the kernel: run each exercise's probe on the grader's cases, write the outputs."""
    from tpu_course import checks
    from tpu_course.checks import engine

    job = json.loads(pathlib.Path(job_path).read_text())
    lab = checks.lab(int(job["lab"]))
    outputs: dict[str, Any] = {}
    for title, spec in job["probes"].items():
        if spec.get("values_only"):  # the grader reads captured values itself
            continue
        exercise = lab.find(title)
        captured = {k: engine.decode(v) for k, v in spec.get("captured", {}).items()}
        if any(isinstance(v, engine.Raised) and v.kind == "NotWrittenError"
               for v in captured.values()):
            outputs[title] = {"not_written": True}
            continue
        answer = {n: captured[n] if n in captured else namespace.get(n, _MISSING)
                  for n in exercise.provides}
        missing = [n for n, v in answer.items() if v is _MISSING]
        if missing:
            outputs[title] = {"missing": missing}
            continue
        cases = [engine.Case(c["label"], engine.decode(c["args"])) for c in spec["cases"]]
        try:
            got = exercise.run(answer, cases)
        except NotImplementedError:
            outputs[title] = {"not_written": True}
            continue
        outputs[title] = {"outputs": [engine.encode(g) for g in got]}
    pathlib.Path(out_path).write_text(json.dumps(outputs))


_MISSING = object()


def _read(path: pathlib.Path) -> Any:
    try:
        data = json.loads(path.read_text())
        path.unlink()
        return data
    except (OSError, ValueError):
        return None


def skip_uri_grammar() -> None:
    """Make nbformat cheap to import in this process: jsonschema's optional URI checker
    (``rfc3987_syntax``) builds a parser on import, about 3 CPU-seconds, and no notebook
    needs URI validation. Call it before nbformat is first imported (the grader, its
    worker, the course's tools and tests do; a learner's kernel never imports it)."""
    sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]


def main(job_dir: str) -> int:
    skip_uri_grammar()
    import nbformat
    from nbclient import NotebookClient

    folder = pathlib.Path(job_dir)
    job = json.loads((folder / "job.json").read_text())
    nb = nbformat.read(folder / "submission.ipynb", as_version=4)
    deadline = time.monotonic() + float(job["timeout_s"])
    client = NotebookClient(nb, timeout=max(1, int(job["timeout_s"])), allow_errors=True,
                            kernel_name="python3", resources={"metadata": {"path": str(folder)}})
    captures: dict[str, list[str]] = {}
    for name, index in job.get("captures", {}).items():
        captures.setdefault(str(index), []).append(name)
    captured: dict[str, Any] = {}
    errors: list[str] = []
    scratch = folder / "kernel-out.json"
    status = "finished"
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            if time.monotonic() > deadline:
                status = "timeout"
                break
            try:
                client.execute_cell(cell, index)
            except Exception as err:  # noqa: BLE001 - a dead kernel, a cell timeout
                timed_out = "Timeout" in type(err).__name__ or time.monotonic() > deadline
                status = "timeout" if timed_out else (
                    f"stopped at cell {index}: {type(err).__name__} (the kernel died?)")
                break
            for out in cell.get("outputs", []):
                if out.get("output_type") == "error":
                    errors.append(f"cell {index}: {out.get('ename')}: {str(out.get('evalue'))[:200]}")
            names = captures.get(str(index))
            if names:
                _run(client, _CAPTURE.format(names=names, path=str(scratch)))
                captured.update(_read(scratch) or {})
        if status == "finished":
            probes = job.get("probes", {})
            for spec in probes.values():
                spec["captured"] = {n: captured[n] for n in spec.get("capture", [])
                                    if n in captured}
            (folder / "probe-job.json").write_text(json.dumps({"lab": job["lab"],
                                                               "probes": probes}))
            _run(client, _PROBE.format(job=str(folder / "probe-job.json"), path=str(scratch)))
            outputs = _read(scratch)
        else:
            outputs = None
    result = {"status": status, "captured": captured, "outputs": outputs, "errors": errors}
    (folder / "results.json").write_text(json.dumps(result))
    return 0


def _run(client: Any, code: str) -> None:
    import nbformat

    cell = nbformat.v4.new_code_cell(code)
    try:
        client.execute_cell(cell, 0, store_history=False)
    except Exception:  # noqa: BLE001 - the learner's kernel may be in any state
        pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
