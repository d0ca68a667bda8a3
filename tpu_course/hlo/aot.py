"""Compile-only TPU topologies: the TPU compiler (``libtpu``) on a machine without a TPU.

``tpu_topology("v5e:2x4")`` returns a :class:`Topology` that carries its own name, the
hardware row of its generation and JAX's ``TopologyDescription``; its ``devices`` are
compile-only TPU devices. Build a mesh over them the way the chapters do::

    topo = aot.tpu_topology("v5e:2x4")
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,), devices=topo.devices)

and compile for it with ``hlo.inspect(fn, *args, target=topo)`` (or ``target="v5e:2x4"``).

Which shapes are verified lives in the hardware table (``Chip.compile_only_topologies``):
adding a generation there is what makes it a valid target here.

>>> "v5e:2x4" in valid_topologies(), "v6e:2x2" in valid_topologies()
(True, True)
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Any, Mapping

from tpu_course import errors, hardware, runtime

#: Topologies checked to compile on a CPU-only machine with libtpu, per generation (the
#: hardware table's ``compile_only_topologies``). Devices per name: v4 reports two per chip.
VERIFIED_TOPOLOGIES: Mapping[str, tuple[str, ...]] = {
    chip.name: chip.compile_only_topologies
    for chip in hardware.CHIPS.values() if chip.compile_only_topologies
}

_INSTALL_HINT = (
    'Install the TPU extra: pip install "tpu-course[aot]" (or pip install "jax[tpu]"; '
    "about 700 MB, it brings libtpu, the TPU compiler). On Colab or a Cloud TPU VM it is "
    "already there."
)


class TpuCompilerMissing(errors.CourseError, ImportError):
    """The TPU compiler (``libtpu``, from the ``aot`` extra) is not installed."""


def tpu_compiler_problem() -> str | None:
    """None when compile-only TPU targets can work here, else why not and the fix.

    Two things must hold: ``libtpu`` is installed, and it is the build that the installed
    jax pins in its ``tpu`` extra. A mismatched libtpu crashes the whole process (a
    segmentation fault, not an exception) the first time it compiles for a topology:
    Colab's TPU runtime in August 2026 ships jax 0.7.2 with libtpu 0.0.21.1, while jax
    0.7.2 pins libtpu 0.0.23, and compiling for ``v5e:2x2`` there kills the kernel. So the
    course compiles for compile-only targets only with the pinned build; a real TPU
    runtime still runs everything on its own chips.
    """
    import importlib.metadata as md
    import importlib.util

    if importlib.util.find_spec("libtpu") is None:
        return "the TPU compiler (libtpu) is not installed. " + _INSTALL_HINT
    try:
        have = md.version("libtpu")
        pins = [r for r in (md.requires("jax") or ()) if r.replace(" ", "").startswith("libtpu")]
    except md.PackageNotFoundError:  # a libtpu not installed by pip: nothing to compare
        return None
    from packaging.requirements import Requirement

    for line in pins:
        spec = Requirement(line).specifier
        if not spec.contains(have, prereleases=True):
            return (
                f"libtpu {have} is installed, but jax {md.version('jax')} is built for "
                f"libtpu{spec}; compiling for a TPU target with a mismatched libtpu crashes "
                f"the process, so compile-only targets are off here. To turn them on, "
                f"install the matching build in a fresh runtime: pip install "
                f"'libtpu{spec}' (or pip install 'jax[tpu]=={md.version('jax')}')."
            )
    return None


def tpu_compiler_available() -> bool:
    """True when compile-only TPU targets can work here (see :func:`tpu_compiler_problem`)."""
    return tpu_compiler_problem() is None


def compile_only_available(name: str = "v5e:1x1") -> bool:
    """True when this runtime can compile for the compile-only topology ``name``: libtpu
    is installed and accepts it. Notebooks use it to decide whether to show TPU-compiled
    programs or a note; it never raises.
    """
    if not tpu_compiler_available():
        return False
    try:
        tpu_topology(name)
    except Exception:  # noqa: BLE001 - any failure means "not here"
        return False
    return True


def valid_topologies() -> list[str]:
    """Every verified compile-only target name, e.g. ``'v5e:2x2'``."""
    return [f"{gen}:{shape}" for gen, shapes in VERIFIED_TOPOLOGIES.items() for shape in shapes]


@dataclasses.dataclass(frozen=True, eq=False)
class Topology:
    """A compile-only TPU slice: its name (``'v5e:2x4'``), its chip's hardware row and
    JAX's ``TopologyDescription`` (whose ``devices`` a mesh is built from)."""

    name: str
    chip: hardware.Chip
    description: Any = dataclasses.field(repr=False)

    @property
    def devices(self) -> list[Any]:
        """The compile-only TPU devices of this slice, in JAX's order."""
        return list(self.description.devices)

    def __str__(self) -> str:
        return self.name


_TOPOLOGY_RE = re.compile(r"^(?P<gen>[a-z0-9]+):(?P<shape>\d+(x\d+){1,2})$")
_CACHE: dict[str, Topology] = {}


def tpu_topology(name: str) -> Topology:
    """The compile-only topology ``name`` (``'v5e:2x2'``, ``'v6e:2x4'``, ``'v5p:2x2x1'`` ...).

    Cached per name (building one starts libtpu, which takes a while).

    Raises:
        CourseTypeError: ``name`` is not a string.
        CourseValueError: the name is not a known generation or shape (the message lists
            the verified ones), or the TPU compiler rejects it.
        TpuCompilerMissing: libtpu is not installed or not the build jax pins.
    """
    if not isinstance(name, str):
        raise errors.CourseTypeError(f"topology {name!r}: expected a name such as 'v5e:2x2'; "
                                     f"valid: {', '.join(valid_topologies())}.")
    key = name.strip().lower()
    if key in _CACHE:
        return _CACHE[key]
    match = _TOPOLOGY_RE.match(key)
    listing = ", ".join(valid_topologies())
    if not match or match.group("gen") not in VERIFIED_TOPOLOGIES:
        raise errors.CourseValueError(
            f"unknown TPU topology {name!r}: expected 'generation:shape' with a generation "
            f"in {sorted(VERIFIED_TOPOLOGIES)}; verified targets are {listing}."
        )
    _check_dimensions(name, match.group("gen"), match.group("shape"))
    problem = tpu_compiler_problem()
    if problem:
        raise TpuCompilerMissing(f"compiling for {name!r} needs the TPU compiler: {problem}")
    import jax
    from jax.experimental import topologies

    with runtime.quiet_libtpu():  # the first backend start loads libtpu too
        backend = jax.default_backend()
    if backend != "tpu":
        # On a machine without a TPU, libtpu would otherwise take a per-machine lock
        # (/tmp/libtpu_lockfile) and refuse a second process; compile-only use needs no
        # lock. Not set on a real TPU, where the lock protects the chips.
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    try:
        with runtime.quiet_libtpu():
            try:
                desc = topologies.get_topology_desc(key, "tpu")
            except Exception as err:
                # Older libtpu (jax 0.7) assumes 2x2x1 chips per host and rejects a
                # smaller slice unless told its per-host bounds.
                dims = [int(d) for d in match.group("shape").split("x")]
                if "chips_per_host_bounds" not in str(err) or math.prod(dims) >= 4:
                    raise
                desc = topologies.get_topology_desc(
                    key, "tpu", chips_per_host_bounds=tuple(dims + [1] * (3 - len(dims))))
    except Exception as err:  # JaxRuntimeError: INVALID_ARGUMENT from libtpu
        raise errors.CourseValueError(
            f"the TPU compiler rejected topology {name!r}: {str(err).splitlines()[0]}. "
            f"Verified targets: {listing}."
        ) from err
    _CACHE[key] = Topology(key, hardware.get(match.group("gen")), desc)
    return _CACHE[key]


def _check_dimensions(name: str, gen: str, shape: str) -> None:
    """Refuse a shape with the wrong number of dimensions for its generation: v5e and v6e
    slices are 2-D grids of chips, v4 and v5p 3-D (the hardware table's verified shapes
    say which). libtpu itself compiles ``v5e:2x2x2`` as an 8-chip 3-D v5e that no one can
    rent, with no word that it is not a real slice."""
    verified = VERIFIED_TOPOLOGIES[gen]
    want = {len(s.split("x")) for s in verified}
    got = len(shape.split("x"))
    if got in want:
        return
    chips = math.prod(int(d) for d in shape.split("x"))
    same = [f"{gen}:{s}" for s in verified
            if math.prod(int(d) for d in s.split("x")) == chips]
    dims = " or ".join(f"{d}-D" for d in sorted(want))
    raise errors.CourseValueError(
        f"TPU topology {name!r}: {gen} slices are {dims} ({'x'.join(['N'] * min(want))}), "
        f"not {got}-D, so no real {gen} slice has this shape. "
        + (f"For {chips} chip{'s' * (chips > 1)} use {' or '.join(same)}. " if same else "")
        + f"Verified {gen} targets: {', '.join(f'{gen}:{s}' for s in verified)}.")


def as_topology(target: "Topology | str", name: str = "target") -> Topology:
    """``target`` itself when it is a :class:`Topology`, the topology it names when it is
    a string; anything else is refused with a message naming the argument."""
    if isinstance(target, Topology):
        return target
    if isinstance(target, str):
        return tpu_topology(target)
    raise errors.CourseTypeError(
        f"{name}={target!r}: expected a compile-only TPU topology name such as 'v5e:2x2' "
        f"(valid: {', '.join(valid_topologies())}) or a Topology from aot.tpu_topology().")
