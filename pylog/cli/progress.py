"""Progress displays of the ``pylog`` commands, drawn with `rich` on stderr.

The work itself reports through plain callbacks (``maintain(progress=...)`` takes a
:data:`pylog.storage.maintenance.runner.ProgressFn`, ``verify(progress=...)`` a function of the
file being checked), so the storage layers never depend on a terminal library.  A display is
drawn only when stderr is a terminal: when it is piped or redirected, or with ``--json``,
nothing is written.  It is removed when the command ends, leaving only the command's output.
"""

from __future__ import annotations

from types import TracebackType
from typing import TypeVar

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    TaskID,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)


def _stderr(enabled: bool, console: Console | None) -> Console | None:
    """The console to draw on, or None when nothing is to be drawn."""
    if not enabled:
        return None
    console = console or Console(stderr=True)
    return console if console.is_terminal else None


D = TypeVar("D", bound="_Display")


class _Display:
    """A transient :class:`rich.progress.Progress`; a no-op without a terminal."""

    def __init__(self, console: Console | None, *columns: ProgressColumn):
        self._progress = (
            Progress(*columns, console=console, transient=True, refresh_per_second=8)
            if console is not None
            else None
        )
        self._task: TaskID | None = None

    @property
    def active(self) -> bool:
        return self._progress is not None

    def __enter__(self: D) -> D:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()


class BytesProgress(_Display):
    """A bar of the bytes processed of the current log, for ``maintain(progress=...)``:
    ``progress(what, done, total)``."""

    def __init__(self, *, enabled: bool = True, console: Console | None = None):
        super().__init__(
            _stderr(enabled, console),
            TextColumn("{task.description}"),
            BarColumn(),
            TaskProgressColumn(),
            DownloadColumn(),
        )
        self._what: str | None = None

    def __call__(self, what: str, done: int, total: int) -> None:
        p = self._progress
        if p is None:
            return
        if self._task is None:
            self._task = p.add_task(what, total=total)
        elif what != self._what:
            p.reset(self._task, total=total, description=what)
        self._what = what
        p.update(self._task, completed=min(done, total) if total else done, total=total)


class ItemProgress(_Display):
    """A spinner with the count of items done and the current one, for ``verify(progress=...)``:
    ``progress(item)``."""

    def __init__(self, *, unit: str = "files", enabled: bool = True, console: Console | None = None):
        super().__init__(
            _stderr(enabled, console),
            SpinnerColumn(),
            TextColumn("{task.completed:>6.0f} " + unit),
            TimeElapsedColumn(),
            TextColumn("{task.description}"),
        )

    def __call__(self, item: str) -> None:
        p = self._progress
        if p is None:
            return
        if self._task is None:
            self._task = p.add_task(item, total=None)
        p.update(self._task, advance=1, description=item)

    @property
    def callback(self) -> ItemProgress | None:
        """This display, or None when it draws nothing (the work then skips reporting)."""
        return self if self.active else None


__all__ = ["BytesProgress", "ItemProgress"]
