"""Progress bars and library logs that keep non-interactive logs (CI, SLURM, ``> log``) readable.

On a terminal a bar redraws in place. Written to a file, every redraw is another carriage-return
update, hundreds per stage; so when stderr is not a terminal, :func:`progress` draws at most one
line every :data:`LOG_INTERVAL_S` seconds (plus the first and the last), one per line, in ASCII.
:func:`quiet_library_bars` does the same for the bars of transformers, datasets and the hub
(weight loading, dataset saving), and :func:`quiet_logs` silences a library's INFO chatter (accelerate
logs every file of every checkpoint it saves or loads).
"""

from __future__ import annotations

import contextlib
import logging
import sys

LOG_INTERVAL_S = 30.0  # non-interactive: at most one progress line per this many seconds


def interactive(stream=None) -> bool:
    """Whether `stream` (default: stderr, where bars go) is a terminal."""
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class LineWriter:
    """A file-like wrapper that turns tqdm's carriage-return redraws into whole lines."""

    def __init__(self, stream):
        self.stream = stream
        self.last = None

    def write(self, text: str) -> int:
        line = text.replace("\r", "").rstrip()
        if line and line != self.last:  # skips blank clears, the lone newline of close() and repeats
            self.stream.write(line + "\n")
            self.last = line
        return len(text)

    def flush(self) -> None:
        self.stream.flush()


def bar_kwargs(stream=None) -> dict:
    """tqdm keyword arguments for a bar on `stream` (default stderr).

    A terminal: redraw in place, as wide as the window. Otherwise: a line at most every
    LOG_INTERVAL_S seconds (tqdm's monitor thread held to the same interval), ASCII, one per line.
    """
    stream = sys.stderr if stream is None else stream
    if interactive(stream):
        return {"file": stream, "dynamic_ncols": True}
    return {"file": LineWriter(stream), "mininterval": LOG_INTERVAL_S, "maxinterval": LOG_INTERVAL_S,
            "ascii": True, "ncols": 100}


def progress(iterable=None, **kwargs):
    """``tqdm(iterable, **kwargs)`` with :func:`bar_kwargs` for stderr; `kwargs` win over them."""
    from tqdm.auto import tqdm

    if "notebook" in tqdm.__module__:  # a Jupyter widget: not a log, and it ignores `file`
        return tqdm(iterable, **kwargs)
    cls = tqdm if interactive() else _log_bar(tqdm)
    return cls(iterable, **{**bar_kwargs(), **kwargs})


def _log_bar(tqdm_cls):
    """`tqdm_cls` whose postfix and description changes wait for the next timed line (tqdm redraws
    on every set_postfix by default, which in a log is a line per training step)."""

    class LogBar(tqdm_cls):
        def set_postfix(self, ordered_dict=None, refresh=True, **kwargs):
            super().set_postfix(ordered_dict, refresh=False, **kwargs)

        def set_postfix_str(self, s="", refresh=True):
            super().set_postfix_str(s, refresh=False)

        def set_description(self, desc=None, refresh=True):
            super().set_description(desc, refresh=False)

    return LogBar


def quiet_library_bars(stream=None) -> bool:
    """When `stream` (default stderr) is not a terminal, turn off the progress bars of transformers,
    datasets and huggingface_hub for this process (weight loading, dataset saving). Returns whether
    it did. Call once at start-up, before the first model is loaded."""
    if interactive(stream):
        return False
    with contextlib.suppress(ImportError):
        import huggingface_hub.utils

        huggingface_hub.utils.disable_progress_bars()
    with contextlib.suppress(ImportError):
        import transformers.utils.logging

        transformers.utils.logging.disable_progress_bar()  # transformers read the hub's setting at import
    with contextlib.suppress(ImportError):
        import datasets

        datasets.disable_progress_bars()
    return True


@contextlib.contextmanager
def quiet_logs(name: str = "accelerate", level: int = logging.WARNING):
    """Within the block, logger `name` (and its children that inherit its level) logs `level` and above only.

    ``with quiet_logs("accelerate"): accelerator.save_state(path)``: no INFO line per saved file.
    """
    logger = logging.getLogger(name)
    before = logger.level
    if logger.getEffectiveLevel() < level:
        logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(before)
