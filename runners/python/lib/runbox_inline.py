"""A matplotlib backend for kept interpreters (MPLBACKEND=module://runbox_inline):
plt.show() saves each open figure as a PNG in the working folder (/data),
where it becomes one of the run's artifacts, as a notebook would show it
inline. Figures are drawn with Agg; nothing is displayed. A cell of E2B's
code interpreter (internal/e2b/interp) shows them as its results instead:
while it runs, builtins.__runbox_show__ takes each figure."""

import builtins
import os

from matplotlib import _pylab_helpers
from matplotlib.backend_bases import FigureManagerBase
from matplotlib.backends.backend_agg import FigureCanvasAgg

FigureCanvas = FigureCanvasAgg
FigureManager = FigureManagerBase


def show(*args, **kwargs):
    hook = getattr(builtins, "__runbox_show__", None)
    for manager in _pylab_helpers.Gcf.get_all_fig_managers():
        if hook is not None:
            hook(manager.canvas.figure)
            continue
        path = _free_name()
        manager.canvas.figure.savefig(path, format="png", bbox_inches="tight")
        print(f"[figure saved to {path}]")
    _pylab_helpers.Gcf.destroy_all()


def _free_name():
    n = 1
    while True:
        name = f"figure_{n}.png"
        try:
            # Never over a file the program wrote, nor through a link.
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        except FileExistsError:
            n += 1
            continue
        os.close(fd)
        return os.path.abspath(name)
