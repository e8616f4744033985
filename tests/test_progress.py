"""artifacts/progress.py: bars and library logs in a non-interactive log (CI, SLURM, `> log`)."""

import io
import logging

from draftsmith.artifacts import progress as P


class FakeTTY(io.StringIO):
    def isatty(self):
        return True


def test_a_terminal_gets_live_bars_and_a_log_gets_rare_whole_lines():
    tty = FakeTTY()
    assert P.interactive(tty) and P.bar_kwargs(tty) == {"file": tty, "dynamic_ncols": True}
    log = io.StringIO()
    kwargs = P.bar_kwargs(log)
    assert not P.interactive(log)
    assert kwargs["mininterval"] == kwargs["maxinterval"] == P.LOG_INTERVAL_S >= 30
    assert isinstance(kwargs["file"], P.LineWriter) and kwargs["ascii"] is True
    assert not P.interactive(object())  # no isatty at all: not a terminal


def test_progress_in_a_log_writes_a_handful_of_lines_without_carriage_returns(monkeypatch):
    log = io.StringIO()
    monkeypatch.setattr("sys.stderr", log)
    bar = P.progress(range(5000), desc="train", unit="step")
    for step in bar:
        bar.set_postfix(loss=f"{step:.4f}")  # redraws on every call unless the bar holds it back
    text = log.getvalue()
    assert "\r" not in text
    lines = text.splitlines()
    assert 1 <= len(lines) <= 3, lines  # the first and the last (a run this short has nothing between)
    assert lines[-1].startswith("train: 100%") and "5000/5000" in lines[-1]


def test_progress_on_a_terminal_redraws_in_place(monkeypatch):
    tty = FakeTTY()
    monkeypatch.setattr("sys.stderr", tty)
    for _ in P.progress(range(3), desc="eval", mininterval=0):
        pass
    assert "\r" in tty.getvalue()


def test_quiet_logs_hides_accelerate_info_and_restores_the_level(caplog):
    child = logging.getLogger("accelerate.checkpointing")
    parent = logging.getLogger("accelerate")
    before = parent.level
    with caplog.at_level(logging.INFO):
        with P.quiet_logs("accelerate"):
            child.info("Model weights saved in x")
            child.warning("kept")
        child.info("after the block")
    messages = [r.getMessage() for r in caplog.records]
    assert "Model weights saved in x" not in messages
    assert "kept" in messages and "after the block" in messages
    assert parent.level == before


def test_quiet_library_bars_only_off_a_terminal(monkeypatch):
    import datasets
    import huggingface_hub.utils
    import transformers.utils.logging

    calls = []
    monkeypatch.setattr(huggingface_hub.utils, "disable_progress_bars", lambda *a: calls.append("hub"))
    monkeypatch.setattr(transformers.utils.logging, "disable_progress_bar", lambda: calls.append("transformers"))
    monkeypatch.setattr(datasets, "disable_progress_bars", lambda: calls.append("datasets"))
    assert P.quiet_library_bars(FakeTTY()) is False and calls == []
    assert P.quiet_library_bars(io.StringIO()) is True
    assert calls == ["hub", "transformers", "datasets"]
