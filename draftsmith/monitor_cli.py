"""``draftsmith-monitor URL``: watch a served draft's acceptance on a live vLLM server.

    draftsmith-monitor http://host:8000 [--interval 10] [--window 300]
        [--registry NAME [--root registry] [--ref production]] [--margin 0.05] [--min-acceptance 0.5]
        [--fail-on-alert] [--jsonl monitor.jsonl] [--count N | --duration S]

Every ``--interval`` seconds it reads the server's ``/metrics`` (the poll loop: monitor/poll.py), and over
the last ``--window`` seconds (the window and its rules: monitor/window.py) prints the acceptance rate,
per-position acceptance, τ (new tokens per target step, 1 + accepted per draft round) and draft rounds/s
on one line, and appends the same as one JSON object per poll to ``--jsonl``. With ``--registry NAME``
the promoted version's measured acceptance is the reference (:func:`promoted_reference`, read by
monitor/reference.py): an alert when the window falls below it by ``--margin`` (drift), and always
below ``--min-acceptance`` (floor), printed with what to do. A version served with a batch-size K
schedule that drafts several K's (version.json "k_schedule") is watched on its first-position acceptance
instead (accepted at position 0 / drafts, against the serving A/B's per_position_acceptance[0]): the
acceptance rate depends on K, and under a schedule K follows the load (monitor/window.py says why); its
per-position figures stop at the schedule's smallest K (None beyond: the drafts that reached those
positions are not counted by vLLM). ``--fail-on-alert`` stops at the first
alert with exit status 3. Exit 2 on a user error (one line), 0 otherwise, Ctrl-C included. A server
that stops answering (a restart) is reported and polled again; counters that restart from zero are
handled.

One JSONL record per poll: ``time`` (Unix s), ``url``, ``window_s``, ``figure`` (the watched figure:
"acceptance_rate" or "first_position_acceptance"), ``status`` ("warming up", "idle", "low sample", "ok",
"alert", "no answer", "no spec metrics"), the window's figures (``acceptance_rate``,
``per_position_acceptance``, ``first_position_acceptance``, ``mean_accepted_tokens``, ``accepted_per_draft``,
``drafts_per_s``, ``drafts``, ``draft_tokens``, ``accepted_tokens``, ``span_s``, ``snapshots``, ``engines``,
``resets``; absent when the poll read nothing, ``error`` says why), ``alerts`` ([{"rule", "value",
"threshold", "message"}]), ``recommendation`` (lines, with alerts), ``reference``, ``drift_below`` and
``floor`` (the thresholds, on the watched figure).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Optional

from draftsmith.artifacts.errors import ConfigError, UserError
from draftsmith.decode.acceptance import ACCEPTANCE_FLOOR
from draftsmith.monitor.poll import Monitor, append_record, base_url
from draftsmith.monitor.reference import reference_rules, version_reference
from draftsmith.monitor.window import ACCEPTANCE_RATE, DEFAULT_MARGIN, DEFAULT_MIN_DRAFT_TOKENS, FIRST_POSITION, Rules
from draftsmith.serve.schedule import describe_schedule
from draftsmith.registry import LocalRegistry

ALERT_EXIT = 3


def promoted_reference(registry: LocalRegistry, name: str, ref: str = "production") -> dict:
    """What `ref` of `name` in `registry` was promoted on (monitor/reference.py ``version_reference``):
    {"name", "ref", "version", "root", "acceptance_rate", "source", "k", "draft", "retrain_command", "figure",
    "schedule", "k_max", "full_positions"} ("acceptance_rate" holds the measured value of "figure")."""
    record = registry.resolve(name, ref)
    return version_reference(registry.path(name, record["version"]), record, ref=ref, root=registry.root)


def live_line(record: dict) -> str:
    """One compact line per poll."""
    clock = time.strftime("%H:%M:%S", time.localtime(record["time"]))
    if "acceptance_rate" not in record:
        return f"{clock}  {record['status']}: {record.get('error', '')}"
    fmt = (lambda v, spec: "-" if v is None else format(v, spec))
    per_pos = " ".join(fmt(p, ".2f") for p in record["per_position_acceptance"]) or "-"
    alerts = ", ".join(a["rule"] for a in record["alerts"])
    state = f"ALERT {alerts}" if alerts else record["status"]
    reset = "; counters reset (restart)" if record["resets"] else ""
    first = (f"  first position {fmt(record.get(FIRST_POSITION), '.3f')}"
             if record.get("figure") == FIRST_POSITION else "")
    return (f"{clock}  acceptance {fmt(record['acceptance_rate'], '.3f')}{first}  per position [{per_pos}]  "
            f"tau {fmt(record['mean_accepted_tokens'], '.2f')}  drafts/s {fmt(record['drafts_per_s'], '.1f')}  "
            f"| {record['span_s']:.1f} s, {int(record['draft_tokens'])} drafted, {record['engines']} engine(s){reset} "
            f"| {state}")


def header(url: str, args, rules: Rules, reference: Optional[dict]) -> str:
    """The first line: what is watched and against which thresholds."""
    line = (f"draftsmith-monitor: watching {base_url(url)}/metrics every {args.interval:g} s over a {args.window:g} s "
            f"window; floor {rules.min_acceptance:g}")
    if reference:
        schedule = reference.get("schedule")
        served = (f" (served with the batch-size K schedule {describe_schedule(schedule)})"
                  if schedule and len(schedule) > 1 else "")  # one range: one K, as a static K
        line += (f"; {reference['ref']} {reference['name']} v{reference['version']}{served} was measured at "
                 f"{rules.figure_label} {reference['acceptance_rate']:.3f} ({reference['source']}): drift below "
                 f"{rules.drift_threshold:.3f} (margin {rules.margin:g})")
        if rules.figure != ACCEPTANCE_RATE:
            line += (f"; watching the {rules.figure_label} (accepted at position 0 / drafts): the acceptance rate "
                     "depends on K, which the schedule changes with the load")
    return line


def watch(args, out=print) -> int:
    """The polling loop of the command (monitor/poll.py ``Monitor.run``), printed; returns its exit status."""
    reference = None
    if args.registry:
        reference = promoted_reference(LocalRegistry(args.root), args.registry, args.ref)
    rules = reference_rules(reference, margin=args.margin, min_acceptance=args.min_acceptance,
                            min_draft_tokens=args.min_draft_tokens)
    monitor = Monitor(args.url, rules, args.window, timeout_s=args.timeout,
                      retrain_command=reference and reference["retrain_command"],
                      full_positions=reference and reference.get("full_positions"))
    jsonl = _open_jsonl(args.jsonl)
    out(header(args.url, args, rules, reference))
    shown, warned_k = set(), False
    try:
        for record in monitor.run(args.interval, count=args.count, duration=args.duration):
            if jsonl:
                append_record(jsonl, record)
            out(live_line(record))
            note = k_note(record, reference, args.ref)
            if note and not warned_k:
                warned_k = True
                out(f"  note: {note}")
            kinds = {a.rule for a in monitor.alerts}
            if kinds and kinds != shown:
                for alert in record["alerts"]:
                    out(f"  ALERT {alert['rule']}: {alert['message']}")
                for line in record["recommendation"]:
                    out(f"  recommendation: {line}")
            shown = kinds
            if kinds and args.fail_on_alert:
                return ALERT_EXIT
        return 0
    except KeyboardInterrupt:
        out(f"draftsmith-monitor: stopped after {monitor.polls} poll(s)")
        return 0
    finally:
        if jsonl:
            jsonl.close()


def k_note(record: dict, reference: Optional[dict], ref: str) -> Optional[str]:
    """Why the reference may not apply, when the server drafts another (largest) K than `ref` was promoted with
    (the number of per-position counters is the server's num_speculative_tokens); None when it matches."""
    served_k = len(record.get("per_position_acceptance") or [])
    expected = reference and (reference.get("k_max") or reference["k"])
    if not served_k or not expected or served_k == expected:
        return None
    if reference.get("schedule"):
        return (f"the server drafts up to K={served_k}, {ref} is served with the schedule "
                f"{describe_schedule(reference['schedule'])} (up to K={expected}): is the server started with its "
                "speculative_config.json?")
    return f"the server drafts K={served_k}, {ref} was measured at K={expected}: the reference acceptance may not apply"


def _open_jsonl(path: Optional[str]):
    if not path:
        return None
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        return open(path, "a", encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"--jsonl {path} cannot be opened for appending ({exc.strerror})") from exc


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="draftsmith-monitor", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("url", help="the vLLM server (http://host:port, or its /metrics URL)")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between polls (default 10)")
    parser.add_argument("--window", type=float, default=300.0, help="sliding window in seconds (default 300)")
    parser.add_argument("--registry", metavar="NAME", help="registry name whose promoted version is the reference")
    parser.add_argument("--root", default="registry", help="registry root directory (config key registry.root)")
    parser.add_argument("--ref", default="production", help="version or alias of NAME (default production)")
    parser.add_argument("--margin", type=float, default=DEFAULT_MARGIN,
                        help=f"drift alert below the reference minus this (default {DEFAULT_MARGIN})")
    parser.add_argument("--min-acceptance", type=float, default=ACCEPTANCE_FLOOR,
                        help=f"floor alert below this acceptance rate (the first-position acceptance for a version "
                             f"with a batch-size K schedule; default {ACCEPTANCE_FLOOR})")
    parser.add_argument("--min-draft-tokens", type=int, default=DEFAULT_MIN_DRAFT_TOKENS,
                        help=f"drafted tokens a window needs before it may alert (drafts, when the first-position "
                             f"acceptance is watched; default {DEFAULT_MIN_DRAFT_TOKENS})")
    parser.add_argument("--fail-on-alert", action="store_true", help=f"stop at the first alert, exit {ALERT_EXIT}")
    parser.add_argument("--jsonl", metavar="PATH", help="append one JSON object per poll to PATH")
    parser.add_argument("--count", type=int, help="stop after N polls")
    parser.add_argument("--duration", type=float, help="stop after S seconds")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for /metrics (default 10)")
    args = parser.parse_args(argv)
    if not args.interval > 0:
        raise ConfigError(f"--interval must be > 0 seconds, got {args.interval}")
    if not args.window >= args.interval:
        raise ConfigError(f"--window {args.window:g} must be at least --interval {args.interval:g} (a window "
                          "needs two polls)")
    if args.count is not None and args.count < 1:
        raise ConfigError(f"--count must be >= 1, got {args.count}")
    if args.duration is not None and not args.duration > 0:
        raise ConfigError(f"--duration must be > 0 seconds, got {args.duration}")
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        return watch(parse_args(argv))
    except UserError as exc:
        if os.environ.get("DRAFTSMITH_DEBUG"):
            raise
        print(f"draftsmith-monitor: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # during start-up (reading the registry, the first poll)
        return 0


if __name__ == "__main__":
    sys.exit(main())
