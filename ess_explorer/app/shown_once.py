"""`explore()` shows the explorer wherever it is called, exactly once.

``ex = explore()`` displays nothing by itself in Jupyter (an assignment has no value to show),
and a bare ``explore()`` as a cell's last line would be shown twice if `explore` displayed it
and the cell's result were shown as well. So `show_in_cell` displays the widget at once when
running in a kernel and records the cell (the shell's execution count); `ShownOnce` then
passes over the one automatic display of that same cell, while a later cell's ``ex``, or a
``display(ex)``, shows it again.
"""

from __future__ import annotations

import sys

__all__ = ["ShownOnce", "show_in_cell", "kernel_shell"]


def kernel_shell():
    """The IPython shell of a Jupyter kernel (one that can draw widgets), else None: a plain
    script or a terminal IPython shows no widget. IPython is not imported here when the
    caller has not imported it (it is always imported in a kernel)."""
    if "IPython" not in sys.modules:
        return None
    shell = sys.modules["IPython"].get_ipython()
    return shell if shell is not None and getattr(shell, "kernel", None) is not None else None


class ShownOnce:
    """A mixin before the class that draws the widget (its ``_ipython_display_``)."""

    _shown_in_cell: int | None = None  # the execution count of the cell that displayed it

    def _ipython_display_(self) -> None:
        shell = kernel_shell()
        if shell is not None and self._shown_in_cell is not None and self._shown_in_cell == shell.execution_count:
            self._shown_in_cell = None  # this cell's result: already shown by explore()
            return
        super()._ipython_display_()


def show_in_cell(widget: ShownOnce) -> bool:
    """Display ``widget`` now when running in a kernel, so that an assigned ``ex = explore()``
    shows it too; whether it was displayed."""
    shell = kernel_shell()
    if shell is None:
        return False
    from IPython.display import display

    display(widget)
    widget._shown_in_cell = shell.execution_count
    return True
