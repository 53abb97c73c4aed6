"""Where the live view is drawn: the terminal's alternate screen, each frame redrawn in place from the top left.

On leaving, the last frame is printed once on the normal screen, so the scrollback keeps exactly one whole frame.
The frames are made by ``guardian.commands.view``.
"""

from __future__ import annotations

from rich.console import Console, RenderableType
from rich.live import Live

REFRESH_PER_SECOND = 4


class LiveScreen:
    """A context manager that shows ``first``, then whatever ``update`` hands it, on ``console``'s alternate screen."""

    def __init__(self, first: RenderableType, console: Console | None = None) -> None:
        self._last = first
        self._live = Live(
            first,
            console=console,
            screen=True,
            refresh_per_second=REFRESH_PER_SECOND,
            redirect_stdout=False,  # a line printed meanwhile would scroll the screen; the loggers are quiet then
            redirect_stderr=False,
        )

    def __enter__(self) -> LiveScreen:
        self._live.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._live.stop()
        self._live.console.print(self._last)

    def update(self, renderable: RenderableType) -> None:
        """Draw ``renderable`` now (and keep it as the frame left on the normal screen at the end)."""
        self._last = renderable
        self._live.update(renderable, refresh=True)
