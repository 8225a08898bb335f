"""The instrumentation the supervisor installs in a rank whose script lacks the worker SDK
(supervisor.worker.instrument): what it reads from torch's flight recorder, the torch variables
it sets, where it starts, and its heartbeats from a real torch loop over the real wire.

The end-to-end behaviour (a stopped, killed, raising or collective-skipping rank of a plain DDP or
FSDP2 script found and named under ``supervisor launch``) is in tests/test_plain_scripts.py.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from supervisor.protocol import Env, decode_groups, decode_heartbeat, derive_keys, new_launch_id
from supervisor.worker.instrument import torch_env, trace_entry, trace_groups, wanted_here

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ the flight recorder's trace
def test_a_recorded_gloo_trace_and_an_nccl_trace_read_the_same_way():
    """gloo's trace was recorded here (rank 0 of two waiting in all-reduce #222 while rank 1 was
    SIGSTOPped; gloo never sets ``last_started_collective``). The NCCL one is written from the
    format torch documents for the flight recorder (``pg_config``, ``pg_status`` with the three
    ``last_*_collective`` strings per group, ``entries`` with ``collective_seq_id``,
    ``profiling_name``, ``input_sizes``, ``state``, the ``time_*_ns`` stamps, ``nccl_comm_state``):
    two groups, rank waiting in the default group's #1042."""
    gloo = json.loads((FIXTURES / "fr_trace_gloo.json").read_text())
    nccl = json.loads((FIXTURES / "fr_trace_nccl.json").read_text())
    assert trace_groups(gloo) == {"0": (222, 221)}
    assert trace_entry(gloo, "0", 222) == ("gloo:all_reduce [[6337]]", 1796428909346935135)
    assert trace_groups(nccl) == {"0": (1042, 1041), "1": (88, 88)}
    assert trace_entry(nccl, "0", 1042) == ("nccl:all_reduce [[4096]]", 1796428909346935135)
    assert trace_entry(nccl, "1", 88)[0] == "nccl:_reduce_scatter_base [[1048576]]"
    assert trace_entry(nccl, "0", 7) is None  # out of the ring


@pytest.mark.parametrize("trace", [{}, {"pg_status": []}, {"pg_status": {"0": "x"}},
                                   {"pg_status": {"0": {"last_enqueued_collective": "many"}}},
                                   {"entries": [1, None, {"pg_id": 0, "collective_seq_id": 1, "time_created_ns": "x"}]}])
def test_a_damaged_trace_reads_as_nothing_not_an_error(trace):
    assert trace_groups(trace) == {}
    found = trace_entry(trace, "0", 1)
    assert found is None or found[1] == 0


# ------------------------------------------------------------------ the torch variables
def test_the_flight_recorder_and_nccl_dump_variables_are_set_unless_the_job_set_them():
    env = torch_env({}, "/logs/ranks")
    assert env["TORCH_FR_BUFFER_SIZE"] == "2000" and "TORCH_NCCL_TRACE_BUFFER_SIZE" not in env  # deprecated in 2.13
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == "/logs/ranks/nccl-trace-rank-"
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3" and env["TORCH_NCCL_ENABLE_MONITORING"] == "1"
    own = torch_env({"TORCH_FR_BUFFER_SIZE": "50", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", Env.FR_BUFFER: "10"}, None)
    assert "TORCH_FR_BUFFER_SIZE" not in own and "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in own  # the job's win
    assert own["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1" and "TORCH_FR_DUMP_TEMP_FILE" not in own
    off = torch_env({Env.FR_BUFFER: "0"}, "/l")
    assert not any(k in off for k in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_FR_DUMP_TEMP_FILE"))


RANK_ENV = {Env.HEARTBEAT_ADDR: "127.0.0.1:9", "RANK": "0", Env.AGENT_PID: "41"}


@pytest.mark.parametrize("env,ppid,wanted", [
    (RANK_ENV, 41, True),
    (RANK_ENV, 42, False),                                   # a process a rank started (a data loader worker)
    (RANK_ENV | {Env.INSTRUMENT: "off"}, 41, False),         # instrument.enabled: false
    (RANK_ENV | {Env.INSTRUMENT: "on"}, 41, True),
    ({k: v for k, v in RANK_ENV.items() if k != Env.HEARTBEAT_ADDR}, 41, False),  # no controller to tell
    ({k: v for k, v in RANK_ENV.items() if k != "RANK"}, 41, False),                # not a rank (the agent)
    ({k: v for k, v in RANK_ENV.items() if k != Env.AGENT_PID}, 41, False),         # not under our agent
])
def test_only_a_rank_the_agent_started_is_instrumented(env, ppid, wanted):
    assert wanted_here(env, ppid=ppid) is wanted


# ------------------------------------------------------------------ a real loop over the real wire
LOOP = textwrap.dedent("""
    import os, sys, time
    from supervisor.worker import instrument
    assert instrument.install() is not None
    import torch, torch.distributed as dist
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[1], rank=0, world_size=1)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        model(torch.ones(2, 4)).sum().backward()
        opt.step(); opt.zero_grad()
        dist.all_reduce(torch.ones(8))
        time.sleep(0.3)
    if sys.argv[2] == "sdk":
        from supervisor.worker import Worker
        w = Worker.from_env().start()
        time.sleep(0.5)
        w.close()
    elif sys.argv[2] == "raise":
        raise ValueError("the script's own bug")
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("ending", ["exit", "raise", "sdk"])
def test_heartbeats_from_torch_records_then_the_last_word_or_the_sdk_taking_over(tmp_path, ending):
    srv = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    srv.bind(("127.0.0.1", 0))
    srv.settimeout(20)
    token, launch = "ab" * 24, new_launch_id()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUPERVISOR_", "TORCH_FR", "TORCH_NCCL"))} | {
        "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", Env.AGENT_PID: str(os.getpid()),
        Env.HEARTBEAT_ADDR: f"127.0.0.1:{srv.getsockname()[1]}", Env.TOKEN: token, Env.LAUNCH: launch,
        Env.HEARTBEAT_INTERVAL: "0.1", Env.LOG_DIR: str(tmp_path / "ranks"), "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO)}
    # the test is the rank's parent, as the agent is: Popen's child
    proc = subprocess.Popen([sys.executable, "-c", LOOP, str(_free_port()), ending], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    key = derive_keys(token.encode()).heartbeat
    beats = []
    try:
        while True:
            hb = decode_heartbeat(srv.recv(8192), key)
            beats.append(hb)
            if hb.phase in ("done", "failed") and (ending != "sdk" or hb.source == "sdk"):
                break
    finally:
        out = proc.communicate(timeout=60)[0]
        srv.close()
    assert proc.returncode == (1 if ending == "raise" else 0), out
    torch_beats = [b for b in beats if b.source == "torch"]
    assert torch_beats and torch_beats[0].phase == "init"
    trained = [b for b in torch_beats if b.phase == "training"]
    assert trained and max(b.step for b in trained) == 3, [(b.phase, b.step) for b in torch_beats]
    # three gradient-free all-reduces of our own, completed: the group's numbers say so
    assert decode_groups(trained[-1].coll_groups)["0"][1] >= 3 and trained[-1].coll_group == "0"
    seqs = [b.seq for b in beats]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)  # one numbering, whoever sent
    last = beats[-1]
    if ending == "exit":
        assert (last.phase, last.outcome, last.source) == ("done", "finished", "torch")
    elif ending == "raise":
        assert (last.phase, last.source) == ("failed", "torch")
        assert last.error == "ValueError: the script's own bug" and not last.error_peer
    else:
        # the SDK took over: after its first heartbeat, none from the instrumentation (no double beats)
        first_sdk = next(i for i, b in enumerate(beats) if b.source == "sdk")
        assert all(b.source == "sdk" for b in beats[first_sdk:]) and last.phase == "done"


def test_the_instrumentation_and_the_boot_hook_import_no_torch_of_their_own(tmp_path):
    """The boot sitecustomize runs in every new-interpreter rank (and in whatever Python a rank
    starts): importing it, and the instrumentation's modules, must not import torch (1-2 s); the
    rank's own script does that. A process that is not a rank is left alone entirely."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import sitecustomize; "
            "import supervisor.worker.instrument, supervisor.worker.heartbeat; "
            "print('torch' in sys.modules, supervisor.worker.instrument._ACTIVE)")
    boot = REPO / "supervisor" / "worker" / "boot"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUPERVISOR_")} | {"PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code, str(boot)], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.split() == ["False", "None"], out.stderr


def test_the_boot_hook_runs_the_sitecustomize_it_shadows(tmp_path):
    own = tmp_path / "own"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import os\nopen(os.environ['MARK'], 'w').write('ran')\n")
    boot = REPO / "supervisor" / "worker" / "boot"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUPERVISOR_")} | {
        "PYTHONPATH": os.pathsep.join([str(boot), str(own), str(REPO)]), "MARK": str(tmp_path / "mark")}
    out = subprocess.run([sys.executable, "-c", "import sitecustomize, sys; print(sitecustomize.__file__)"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "mark").read_text() == "ran" and out.stdout.strip() == str(own / "sitecustomize.py")
