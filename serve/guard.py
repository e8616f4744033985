"""The guard of a vLLM server: ``python guard.py --grace-s S -- <server argv>``.

Started by :class:`draftsmith.serve.server.VllmServer` as the leader of a new process group, with
the read end of a pipe as its stdin; only the process that started it holds the write end. The
guard runs the server as its child (same group) and watches the pipe: end of file means that
process is gone — it exited, or was killed (``kill -9``, the OOM killer, a CI timeout, a preempted
job) and could not stop the server itself. The guard then stops the whole group: SIGTERM, and
SIGKILL after the grace period (itself included). When the server exits on its own, the guard
exits with its status, after asking the rest of the group (vLLM's engine processes) to stop.

Standard library only, run by path: it must start fast and cannot depend on the caller's imports.
"""

import os
import signal
import subprocess
import sys
import threading
import time


def stop_group(child: subprocess.Popen, grace_s: float) -> None:
    """SIGTERM to the group (this guard's handler ignores it), wait up to `grace_s` for the server, then SIGKILL
    the group. Runs in the watcher thread: signal handlers can only be set in the main thread (main() does)."""
    group = os.getpgrp()
    try:
        os.killpg(group, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + grace_s
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(group, signal.SIGKILL)  # what is left, and this guard last


def main(argv: list[str]) -> int:
    if "--" not in argv or argv.index("--") + 1 >= len(argv):
        print("usage: guard.py [--grace-s S] -- COMMAND...", file=sys.stderr)
        return 2
    split = argv.index("--")
    opts, cmd = argv[:split], argv[split + 1:]
    grace_s = float(opts[opts.index("--grace-s") + 1]) if "--grace-s" in opts else 15.0
    # The group's SIGTERM (VllmServer.stop) is for the server: the guard waits for it to exit instead of dying
    # first. A handler, not SIG_IGN, which the server would inherit across exec.
    signal.signal(signal.SIGTERM, lambda *_: None)
    child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)

    def watch() -> None:
        try:
            while os.read(0, 1 << 12):  # blocks until every holder of the write end has closed it
                pass
        except OSError:
            pass
        stop_group(child, grace_s)

    threading.Thread(target=watch, daemon=True).start()
    code = child.wait()
    try:
        os.killpg(os.getpgrp(), signal.SIGTERM)  # engine processes the server leaves behind
    except ProcessLookupError:
        pass
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
