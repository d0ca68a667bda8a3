"""Pictures for the course: the systolic array cycle by cycle, and the chapter-1 plots.

* :func:`draw_frame` draws one cycle of a traced :func:`tpu_course.systolic.simulate` run:
  the grid of cells with what each holds and passes on, and the output filling in.
* :func:`frame_strip` draws a static strip of key cycles (what GitHub and nbval see).
* :func:`animate` returns a steppable widget (play/pause and a cycle slider, ipywidgets:
  JupyterLab, Colab) and falls back to the strip when widgets are not available.
* :func:`export_animation` writes the animation as a GIF or a self-contained HTML/JS page.
* :func:`plot_utilization_vs_size`, :func:`plot_cycles_vs_size`,
  :func:`plot_accesses_per_mac`: the chapter's plots.

matplotlib is imported inside the functions, so importing this module is cheap and never
touches JAX.
"""

from __future__ import annotations

import html
import io
import math
import pathlib
from typing import Any, Sequence

import numpy as np

from tpu_course import errors, systolic



def _names(run: systolic.SystolicRun) -> tuple[str, str, str]:
    """What a Frame's three arrays hold for this run's dataflow (``systolic.DATAFLOW``)."""
    df = systolic.DATAFLOW[run.dataflow]
    return df.held, df.horizontal, df.vertical


def _fmt(v: float) -> str:
    if np.isnan(v):
        return ""
    if float(v).is_integer() and abs(v) < 1e5:
        return str(int(v))
    return f"{v:.3g}"


def key_cycles(run: systolic.SystolicRun, count: int = 8) -> list[int]:
    """Frame indices worth showing in a static strip: phase changes plus even spacing.

    >>> import numpy as np
    >>> r = systolic.simulate(np.ones((3, 4)), np.ones((4, 2)), 4, 2, trace=True)
    >>> key_cycles(r, 6)
    [0, 3, 4, 7, 9, 10]
    """
    frames = _frames(run)
    n = len(frames)
    picks = {0, n - 1}
    for i in range(1, n):
        if frames[i].phase != frames[i - 1].phase:
            picks.update((i - 1, i))
    picks = sorted(picks)
    if len(picks) > count:  # keep the first, the last and phase starts, evenly thinned
        idx = np.linspace(0, len(picks) - 1, count).round().astype(int)
        picks = sorted({picks[i] for i in idx})
    extra = [int(x) for x in np.linspace(0, n - 1, count + 2)[1:-1]]
    for x in extra:
        if len(picks) >= count:
            break
        if x not in picks:
            picks.append(x)
    return sorted(picks)[:count]


def _frames(run: systolic.SystolicRun) -> tuple[systolic.Frame, ...]:
    if not run.trace:
        raise errors.CourseValueError("this run has no trace: call simulate(..., trace=True) on a small "
                                      "array (e.g. rows=4, cols=4) to get one frame per cycle")
    return run.trace


def draw_frame(run: systolic.SystolicRun, index: int, ax: Any = None, show_output: bool = True) -> Any:
    """Draw frame ``index`` of a traced run; returns the matplotlib figure.

    Each square is a cell. Big number: what the cell holds (the weight for ``"ws"``);
    a grey dot on a hatched cell: nothing loaded yet (a real zero weight prints ``0``);
    blue, bottom left: the operand moving right; orange, bottom right: what moves down
    (the partial sum for ``"ws"``). Shaded cells did a multiply-accumulate this cycle.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    frames = _frames(run)
    fr = frames[index]
    held_name, h_name, v_name = _names(run)
    R, C = fr.held.shape
    if ax is None:
        ncols = 2 if show_output else 1
        fig, axes = plt.subplots(1, ncols, figsize=(4.2 * ncols, 3.8),
                                 gridspec_kw={"width_ratios": [1, 1][:ncols]})
        axes = np.atleast_1d(axes)
        ax, ax_out = axes[0], (axes[1] if show_output else None)
    else:
        fig, ax_out = ax.figure, None
    busy = ~np.isnan(fr.horizontal) & (~np.isnan(fr.vertical) if run.dataflow == "os" else True)
    for k in range(R):
        for j in range(C):
            empty = bool(np.isnan(fr.held[k, j]))
            ax.add_patch(Rectangle((j, R - 1 - k), 0.95, 0.95, facecolor="#dbeafe" if busy[k, j]
                                   else "#f3f4f6", edgecolor="#374151",
                                   hatch="////" if empty else None))
            if empty:  # not loaded yet: unlike a real zero weight, which prints "0"
                ax.text(j + 0.47, R - 1 - k + 0.55, "\u00b7", ha="center", va="center",
                        fontsize=14, color="#9ca3af")
            else:
                ax.text(j + 0.47, R - 1 - k + 0.55, _fmt(fr.held[k, j]), ha="center",
                        va="center", fontsize=11, weight="bold")
            ax.text(j + 0.08, R - 1 - k + 0.12, _fmt(fr.horizontal[k, j]), fontsize=8,
                    color="#1d4ed8")
            ax.text(j + 0.88, R - 1 - k + 0.12, _fmt(fr.vertical[k, j]), fontsize=8,
                    color="#c2410c", ha="right")
    ax.set_xlim(-0.1, C + 0.05)
    ax.set_ylim(-0.1, R + 0.05)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(f"cycle {fr.cycle} ({fr.phase})\nbold: {held_name}, blue: {h_name} ->, "
                 f"orange: {v_name} v", fontsize=9)
    if ax_out is not None:
        out = fr.output
        ax_out.imshow(np.where(np.isnan(out), 0, 1), cmap="Greens", vmin=0, vmax=3,
                      aspect="equal")
        for i in range(out.shape[0]):
            for j in range(out.shape[1]):
                ax_out.text(j, i, _fmt(out[i, j]), ha="center", va="center", fontsize=8)
        ax_out.set_xticks([])
        ax_out.set_yticks([])
        ax_out.set_title(f"output C ({out.shape[0]}x{out.shape[1]}) so far", fontsize=9)
    return fig


def frame_strip(run: systolic.SystolicRun, cycles: Sequence[int] | None = None, ncols: int = 4) -> Any:
    """A static strip of the key cycles of a traced run (a matplotlib figure)."""
    import matplotlib.pyplot as plt

    picks = list(cycles) if cycles is not None else key_cycles(run, 8)
    nrows = math.ceil(len(picks) / ncols)
    R, C = _frames(run)[0].held.shape
    fig, axes = plt.subplots(nrows, ncols, figsize=(2.6 * ncols, 2.6 * nrows * R / max(C, 1) + 0.4))
    axes = np.atleast_1d(axes).ravel()
    for ax, i in zip(axes, picks):
        draw_frame(run, i, ax=ax, show_output=False)
        ax.set_title(f"cycle {i} ({run.trace[i].phase})", fontsize=9)
    for ax in axes[len(picks):]:
        ax.axis("off")
    held_name, h_name, v_name = _names(run)
    fig.suptitle(f"{run.rows}x{run.cols} {run.dataflow.upper()} array: bold {held_name} "
                 f"(hatched: none loaded yet; 0 is a real zero), blue {h_name} (moving "
                 f"right), orange {v_name} (moving down)", fontsize=10)
    fig.tight_layout()
    return fig


def animate(run: systolic.SystolicRun, static_fallback: bool = True) -> Any:
    """A steppable view: play/pause and a cycle slider (ipywidgets).

    Returns an ``ipywidgets.VBox``; its ``slider`` attribute is the cycle slider. Its
    output also holds a ``text/html`` version, the self-contained :func:`html_player`,
    which pages rendered without a kernel (the course website) show instead. When
    ipywidgets is missing, returns :func:`frame_strip` instead (or raises ImportError if
    ``static_fallback`` is False).
    """
    frames = _frames(run)
    try:
        import ipywidgets as widgets
    except ImportError:
        if not static_fallback:
            raise
        return frame_strip(run)
    import matplotlib.pyplot as plt

    play = widgets.Play(value=0, min=0, max=len(frames) - 1, step=1, interval=700,
                        description="play")
    slider = widgets.IntSlider(value=0, min=0, max=len(frames) - 1, description="cycle")
    widgets.jslink((play, "value"), (slider, "value"))
    out = widgets.Output()

    def show(change: Any = None) -> None:
        with out:
            out.clear_output(wait=True)
            fig = draw_frame(run, slider.value)
            plt.show()
            plt.close(fig)

    slider.observe(show, names="value")
    show()
    box = _static_html_box(widgets)([widgets.HBox([play, slider]), out])
    # Without a kernel (the course website, nbviewer) the widget cannot run: the output
    # also carries the self-contained player (the one ``export_animation`` writes).
    box.static_html = html_player(frame_pngs(run), fps=1000 / play.interval, fragment=True,
                                  title=f"systolic array animation: {run.dataflow}, "
                                        f"{run.rows}x{run.cols}")
    box.slider = slider  # type: ignore[attr-defined]
    box.play = play  # type: ignore[attr-defined]
    return box


# The one HTML frame player (exports, and later the website): frames are inline PNGs,
# the buttons plain text, the script a few lines, so the file works offline and with no
# CDN (matplotlib's own ``to_jshtml`` loads its button icons from one).
_PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{title}</title></head>
<body>{player}</body></html>
"""
_PLAYER = """<style>
.tpc-player {{ font-family: sans-serif; display: inline-block; }}
.tpc-player img {{ display: block; max-width: 100%; }}
.tpc-player button {{ font: inherit; margin: 2px; padding: 2px 8px; cursor: pointer; }}
.tpc-player input[type=range] {{ width: 100%; }}
</style>
<div class="tpc-player" id="{uid}">
<img alt="{title}" src="{first}">
<input type="range" min="0" max="{last}" value="0" aria-label="frame">
<div>
<button data-act="first" title="first frame">|&lt;</button>
<button data-act="prev" title="previous frame">&lt;</button>
<button data-act="play" title="play">play</button>
<button data-act="pause" title="pause">pause</button>
<button data-act="next" title="next frame">&gt;</button>
<button data-act="last" title="last frame">&gt;|</button>
<span class="tpc-label"></span>
</div></div>
<script>
(function () {{
  var frames = {frames};
  var root = document.getElementById("{uid}");
  var img = root.querySelector("img"), slider = root.querySelector("input");
  var label = root.querySelector(".tpc-label"), i = 0, timer = null;
  function show(k) {{
    i = Math.max(0, Math.min(frames.length - 1, k));
    img.src = frames[i]; slider.value = i;
    label.textContent = "frame " + (i + 1) + " / " + frames.length;
  }}
  function pause() {{ if (timer) {{ clearInterval(timer); timer = null; }} }}
  function play() {{
    pause();
    timer = setInterval(function () {{ show(i + 1 < frames.length ? i + 1 : 0); }}, {interval_ms});
  }}
  var acts = {{first: function () {{ pause(); show(0); }},
              prev: function () {{ pause(); show(i - 1); }},
              next: function () {{ pause(); show(i + 1); }},
              last: function () {{ pause(); show(frames.length - 1); }},
              play: play, pause: pause}};
  root.querySelectorAll("button").forEach(function (b) {{
    b.addEventListener("click", acts[b.dataset.act]);
  }});
  slider.addEventListener("input", function () {{ pause(); show(+slider.value); }});
  show(0);
}})();
</script>
"""


def html_player(frames_png: Sequence[bytes], fps: float = 2.0, title: str = "animation",
                fragment: bool = False) -> str:
    """A self-contained HTML page that plays PNG frames: slider, first/previous/play/
    pause/next/last buttons as plain text, every frame inline (``data:`` URIs); nothing
    is fetched from the network. With ``fragment`` only the player (style, markup,
    script) for embedding in another page, such as a notebook output.
    """
    import base64
    import hashlib
    import json

    if not frames_png:
        raise errors.CourseValueError("html_player needs at least one frame")
    fps = errors.check_number("fps", fps, low=0, low_open=True)
    uris = ["data:image/png;base64," + base64.b64encode(f).decode("ascii") for f in frames_png]
    # A page may hold several players: the id is derived from the frames (deterministic).
    uid = "tpc-player-" + hashlib.sha1("".join(uris).encode("ascii")).hexdigest()[:10]
    player = _PLAYER.format(title=html.escape(title), uid=uid, first=uris[0],
                            last=len(uris) - 1, frames=json.dumps(uris),
                            interval_ms=max(1, round(1000 / fps)))
    return player if fragment else _PAGE.format(title=html.escape(title), player=player)


def _static_html_box(widgets: Any) -> type:
    """An ``ipywidgets.VBox`` whose output also carries ``text/html`` (its ``static_html``):
    a live kernel shows the widget, a page without one (website, nbviewer) the HTML."""

    class StaticHTMLBox(widgets.VBox):
        static_html = ""

        def _repr_mimebundle_(self, **kwargs: Any) -> dict:
            data = {"text/plain": repr(self), "text/html": self.static_html}
            if self._view_name is not None:
                data["application/vnd.jupyter.widget-view+json"] = {
                    "version_major": 2, "version_minor": 0, "model_id": self._model_id}
            return data

        def _ipython_display_(self, **kwargs: Any) -> None:  # ipywidgets 7 displays here
            from IPython.display import display

            display(self._repr_mimebundle_(), raw=True)

    return StaticHTMLBox


def frame_pngs(run: systolic.SystolicRun, dpi: int = 80) -> list[bytes]:
    """Every cycle of ``run`` drawn by :func:`draw_frame` as PNG bytes (for players)."""
    import matplotlib.pyplot as plt

    fig = draw_frame(run, 0)
    pngs = []
    for i in range(len(_frames(run))):
        draw_frame_on(fig, run, i)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=dpi)
        pngs.append(buf.getvalue())
    plt.close(fig)
    return pngs


def export_animation(run: systolic.SystolicRun, path: str | pathlib.Path, fps: float = 2.0) -> pathlib.Path:
    """Write the animation to ``path``: ``.gif`` (Pillow) or ``.html`` (a self-contained
    player, :func:`html_player`, for slides and offline use). Returns the path."""
    import matplotlib.pyplot as plt
    from matplotlib import animation

    path = pathlib.Path(path)
    if path.suffix not in (".gif", ".html", ".htm"):
        raise errors.CourseValueError(f"export_animation writes .gif or .html, got {path.name!r}")
    fps = errors.check_number("fps", fps, low=0, low_open=True)
    frames = _frames(run)
    fig = draw_frame(run, 0)

    def update(i: int) -> list:
        draw_frame_on(fig, run, i)
        return []

    if path.suffix == ".gif":
        anim = animation.FuncAnimation(fig, update, frames=len(frames), interval=1000 / fps,
                                       blit=False)
        anim.save(path, writer=animation.PillowWriter(fps=fps))
    else:
        path.write_text(html_player(frame_pngs(run), fps=fps, title=f"systolic array animation: {run.dataflow}, "
                                    f"{run.rows}x{run.cols}"), encoding="utf-8")
    plt.close(fig)
    return path


def draw_frame_on(fig: Any, run: systolic.SystolicRun, index: int) -> None:
    """Redraw frame ``index`` on the two axes of a figure made by :func:`draw_frame`."""
    ax, ax_out = fig.axes[0], fig.axes[1]
    ax.clear()
    ax_out.clear()
    draw_frame(run, index, ax=ax, show_output=False)
    fr = run.trace[index]
    out = fr.output
    ax_out.imshow(np.where(np.isnan(out), 0, 1), cmap="Greens", vmin=0, vmax=3)
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            ax_out.text(j, i, _fmt(out[i, j]), ha="center", va="center", fontsize=8)
    ax_out.set_xticks([])
    ax_out.set_yticks([])
    ax_out.set_title("output C so far", fontsize=9)


def plot_utilization_vs_size(sizes: Sequence[int], arrays: Sequence[int] = (128, 256),
                             dataflow: str = "ws", timing: str = "tpu", ax: Any = None) -> Any:
    """Utilisation of an n x n x n matmul on square arrays: the padding staircase."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.6))
    for side in arrays:
        u = [systolic.utilization(n, n, n, side, side, dataflow, timing) for n in sizes]
        ax.plot(sizes, u, drawstyle="steps-post" if len(sizes) > 50 else "default",
                label=f"{side}x{side} array")
    ax.set_xlabel("matrix size n (n x n @ n x n)")
    ax.set_ylabel("utilisation (useful MACs / cell-cycles)")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(f"{dataflow.upper()} array, timing={timing!r}: padding makes a staircase")
    return ax.figure


def plot_cycles_vs_size(sizes: Sequence[int], simulated: Sequence[int], rows: int = 8,
                        cols: int = 8, dataflow: str = "ws", timing: str = "tpu",
                        ax: Any = None) -> Any:
    """Cycles of an n x n x n matmul: the closed form as a line, simulations as dots."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.6))
    ax.plot(sizes, [systolic.cycle_count(n, n, n, rows, cols, dataflow, timing) for n in sizes],
            label="cycle_count (closed form)")
    rng = np.random.default_rng(0)
    sim = []
    for n in simulated:
        a = rng.integers(-3, 4, (n, n))
        b = rng.integers(-3, 4, (n, n))
        sim.append(systolic.simulate(a, b, rows, cols, dataflow, timing).cycles)
    ax.plot(simulated, sim, "o", label="simulate(...).cycles")
    ax.set_xlabel("matrix size n")
    ax.set_ylabel("cycles")
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(f"{rows}x{cols} {dataflow.upper()} array, timing={timing!r}")
    return ax.figure


def plot_accesses_per_mac(sizes: Sequence[int], ax: Any = None, gpu_tiles: Sequence[int] = (1, 64),
                          rows: int = 128, cols: int = 128) -> Any:
    """Memory accesses per MAC on a CPU, a GPU (one curve per register tile in
    ``gpu_tiles``) and a ``rows x cols`` systolic array (log scale); the model is
    :func:`tpu_course.systolic.memory_accesses_per_mac`."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.6))
    curves = [("cpu", {}, "s-", "CPU (one ALU)")]
    curves += [("gpu", {"tile": t}, "^-" if t == 1 else "v-",
                f"GPU, {t}x{t} register tile" if t > 1 else "GPU, no register tiling")
               for t in gpu_tiles]
    curves.append(("systolic", {"rows": rows, "cols": cols}, "o-", f"systolic {rows}x{cols}"))
    for machine, kw, style, label in curves:
        ax.plot(sizes, [systolic.memory_accesses_per_mac(n, machine, **kw).per_mac
                        for n in sizes], style, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("matrix size n (n x n @ n x n)")
    ax.set_ylabel("memory accesses per MAC")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    ax.set_title("Where the operands of each multiply-accumulate come from")
    return ax.figure
