"""The poll loop: read a vLLM server's ``/metrics`` on an interval, feed the window, yield one record per poll.

Used by ``draftsmith-monitor`` (draftsmith/monitor_cli.py, which prints the records) and by
scripts/drift_demo.py (which watches a load phase with it). :class:`Monitor` scrapes through
serve/metrics.py (``scrape_metrics``), adds the snapshot to a monitor/window.py :class:`Window` and
applies its :class:`Rules`: one record per poll, a JSON object (:func:`append_record` writes it as a
JSONL line) whose fields ``draftsmith-monitor --help`` lists.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Iterator, Optional, TextIO

from draftsmith.artifacts.errors import UserError
from draftsmith.monitor.window import Rules, Window, check_rules, recommendation, snapshot, status
from draftsmith.serve.errors import VllmError
from draftsmith.serve.metrics import SPEC_PREFIX, scrape_metrics


class MonitorError(UserError, RuntimeError):
    """The monitored server cannot be read as a speculating vLLM server; the message says why and what to do."""


def base_url(url: str) -> str:
    """``http://host:port`` from ``host:port``, ``http://host:port/`` or ``http://host:port/metrics``."""
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    return url[: -len("/metrics")] if url.endswith("/metrics") else url


def metric_names(text: str) -> set[str]:
    """The metric family names of a ``/metrics`` text (prometheus_client's parser; spec_series() has already
    said how to install it), to tell a vLLM server that does not speculate from something that is not vLLM."""
    from prometheus_client.parser import text_string_to_metric_families

    return {family.name for family in text_string_to_metric_families(text)}


def missing_metrics_message(url: str, names: set[str]) -> str:
    """The one-line explanation for a ``/metrics`` text without spec-decode counters; `names`: its metric families."""
    if any(name.startswith("vllm:") for name in names):
        return (f"{url}/metrics has vLLM metrics but no {SPEC_PREFIX}* counters: the server runs without "
                "--speculative-config (speculation is off), so there is no draft to watch; start it with "
                "--speculative-config \"$(cat registry/NAME/vN/speculative_config.json)\"")
    return (f"{url}/metrics has no vllm:* metrics ({len(names)} other metric families): give the /metrics URL of a "
            "vLLM server (http://host:port)")


class Monitor:
    """Polls one server's /metrics into a :class:`Window` and applies :class:`Rules`: :meth:`poll` -> one record,
    :meth:`run` -> the records of polls on an interval. `retrain_command`: the exact command the recommendation
    names (monitor/reference.py), when the production draft is known. `full_positions`: under a batch-size K
    schedule, the positions every draft reaches (monitor/window.py :class:`Window`; None: a static K)."""

    def __init__(self, url: str, rules: Rules, window_s: float, timeout_s: float = 10.0,
                 retrain_command: Optional[str] = None, full_positions: Optional[int] = None):
        self.url, self.rules, self.timeout_s = base_url(url), rules, timeout_s
        self.window = Window(window_s, full_positions)
        self.retrain_command = retrain_command
        self.polls = 0
        self.alerts: list = []  # the Alert objects of the last poll

    def poll(self, t: Optional[float] = None) -> dict:
        """Read /metrics once. The first poll raises when the server does not answer or does not speculate
        (a wrong URL should fail fast); later ones report it in the record ("no answer", "no spec metrics")."""
        t = time.monotonic() if t is None else t
        first, self.polls, self.alerts = self.polls == 0, self.polls + 1, []
        record = {"time": round(time.time(), 3), "url": self.url, "window_s": self.window.seconds, "alerts": [],
                  "figure": self.rules.figure, "reference": self.rules.reference,
                  "drift_below": self.rules.drift_threshold, "floor": self.rules.min_acceptance}
        try:
            text = scrape_metrics(self.url, timeout_s=self.timeout_s)
        except VllmError as exc:
            if first:
                raise MonitorError(f"{exc} (give the base URL of a running vLLM server, e.g. http://host:8000)") \
                    from exc
            return {**record, "status": "no answer", "error": str(exc)}
        snap = snapshot(text, t)
        if not snap.series:
            message = missing_metrics_message(self.url, metric_names(text))
            if first:
                raise MonitorError(message)
            return {**record, "status": "no spec metrics", "error": message}
        stats = self.window.add(snap)
        self.alerts = check_rules(stats, self.rules)
        record.update(status=status(stats, self.rules), **stats.as_dict(),
                      alerts=[a.as_dict() for a in self.alerts])
        if self.alerts:
            record["recommendation"] = recommendation({a.rule for a in self.alerts}, self.retrain_command)
        return record

    def run(self, interval: float, *, count: Optional[int] = None, duration: Optional[float] = None,
            until: Optional[threading.Event] = None) -> Iterator[dict]:
        """Poll now, then every `interval` s on a fixed schedule (a slow poll does not shift the next ones),
        yielding each record. Stops after `count` polls, when the next poll would fall more than `duration` s
        after the first, or after the first poll that began with `until` set (setting it cuts the wait short,
        so the last poll follows at once: a poll after the work it watches). Otherwise it runs until the
        caller stops iterating (or Ctrl-C)."""
        start, polls = time.monotonic(), 0
        while True:
            last = until is not None and until.is_set()
            yield self.poll()
            polls += 1
            if last or (count and polls >= count):
                return
            next_t = start + polls * interval
            if duration is not None and next_t - start > duration:
                return
            delay = max(0.0, next_t - time.monotonic())
            if until is None:
                time.sleep(delay)
            else:
                until.wait(delay)


def append_record(jsonl: TextIO, record: dict) -> None:
    """Append `record` to the open JSONL time series `jsonl` as one line, flushed (a reader sees every poll)."""
    jsonl.write(json.dumps(record) + "\n")
    jsonl.flush()
