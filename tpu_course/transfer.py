"""Host <-> device transfer bandwidth, measured over a sweep of sizes.

The chip computes on data in its HBM; everything starts in host memory. This module
times the two trips:

* host -> device: ``jax.device_put(numpy_array)`` until the copy has landed
  (``block_until_ready``);
* device -> host: ``numpy.asarray(device_array)`` of an array that has *not* been read
  before. JAX caches the host copy of an array after the first read, so every sample
  gets a freshly placed array; timing the same array twice would time the cache.

Each point is the median of ``repeats`` samples. Small transfers are dominated by a
fixed cost per transfer (latency), large ones by bandwidth, so the sweep shows both.
On a CPU runtime "device" memory *is* host memory: the numbers measure a memory copy
(or none at all, when JAX can alias the buffer), not a PCIe link.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any, Sequence

import numpy as np

DEFAULT_SIZES_BYTES = tuple(2**k for k in range(12, 27, 2))  # 4 KiB .. 64 MiB


@dataclasses.dataclass(frozen=True)
class TransferPoint:
    """Median times (seconds) for one transfer size, both directions."""

    n_bytes: int
    h2d_s: float
    d2h_s: float

    @property
    def h2d_bytes_per_s(self) -> float:
        return self.n_bytes / self.h2d_s

    @property
    def d2h_bytes_per_s(self) -> float:
        return self.n_bytes / self.d2h_s


@dataclasses.dataclass(frozen=True)
class TransferSweep:
    """A sweep of transfer sizes on one device."""

    points: tuple[TransferPoint, ...]
    platform: str
    device_kind: str
    repeats: int

    def __str__(self) -> str:
        note = " (CPU: a memory copy, not a host-to-accelerator link)" if self.platform == "cpu" else ""
        lines = [f"transfers on {self.platform.upper()} {self.device_kind}{note}, "
                 f"median of {self.repeats}",
                 f"{'size':>10}  {'host->device':>14}  {'device->host':>14}"]
        for p in self.points:
            lines.append(f"{_size(p.n_bytes):>10}  {p.h2d_bytes_per_s / 1e9:>9.2f} GB/s  "
                         f"{p.d2h_bytes_per_s / 1e9:>9.2f} GB/s")
        return "\n".join(lines)

    __repr__ = __str__

    def best(self, direction: str = "h2d") -> float:
        """The highest bandwidth seen in one direction, bytes/s."""
        key = "h2d_bytes_per_s" if direction == "h2d" else "d2h_bytes_per_s"
        return max(getattr(p, key) for p in self.points)

    def plot(self, ax: Any = None) -> Any:
        """Bandwidth vs transfer size, both directions, log-log."""
        import matplotlib.pyplot as plt

        ax = ax or plt.subplots(figsize=(6, 3.5))[1]
        sizes = [p.n_bytes for p in self.points]
        ax.loglog(sizes, [p.h2d_bytes_per_s / 1e9 for p in self.points], "o-", label="host -> device")
        ax.loglog(sizes, [p.d2h_bytes_per_s / 1e9 for p in self.points], "s-", label="device -> host")
        ax.set_xlabel("transfer size (bytes)")
        ax.set_ylabel("bandwidth (GB/s)")
        ax.set_title(f"Transfers on {self.platform.upper()} {self.device_kind}")
        ax.legend()
        ax.grid(True, which="both", alpha=0.3)
        return ax


def _size(n: int) -> str:
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"


def time_h2d(host: np.ndarray, device: Any = None) -> float:
    """Seconds to copy ``host`` to ``device`` and wait for it to land."""
    import jax

    start = time.perf_counter()
    jax.device_put(host, device).block_until_ready()
    return time.perf_counter() - start


def time_d2h(host: np.ndarray, device: Any = None) -> float:
    """Seconds to read a freshly placed copy of ``host`` back from ``device``."""
    import jax

    placed = jax.device_put(host, device).block_until_ready()  # not timed
    start = time.perf_counter()
    np.asarray(placed)
    return time.perf_counter() - start


def measure_transfers(sizes_bytes: Sequence[int] = DEFAULT_SIZES_BYTES, repeats: int = 5,
                      device: Any = None) -> TransferSweep:
    """Median host->device and device->host times for each size (float32 buffers).

    One untimed round trip per size comes first (it pays for allocator warm-up).
    """
    import jax

    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    device = device or jax.devices()[0]
    points = []
    rng = np.random.default_rng(0)
    for n in sizes_bytes:
        if n < 4 or n % 4:
            raise ValueError(f"sizes must be positive multiples of 4 bytes (float32), got {n}")
        host = rng.random(n // 4, dtype=np.float32)
        time_h2d(host, device), time_d2h(host, device)  # warm-up
        h2d = statistics.median(time_h2d(host, device) for _ in range(repeats))
        d2h = statistics.median(time_d2h(host, device) for _ in range(repeats))
        points.append(TransferPoint(int(n), h2d, d2h))
    return TransferSweep(tuple(points), device.platform, device.device_kind, repeats)
