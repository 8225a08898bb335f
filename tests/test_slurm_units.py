"""The slurm platform's pieces that need no cluster: hostlists, srun's environment and exit
codes, every Slurm command under a timeout, the sbatch wrapper's script and quoting, config."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from supervisor.config import ConfigError, from_dict
from supervisor.platforms.base import PlatformError
from supervisor.platforms.clients import commands
from supervisor.platforms.slurm import SlurmPlatform, expand_hostlist, render_batch_script, srun_env, srun_exit_code

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("expr,nodes", [
    ("n1", ["n1"]),
    ("n[1-3]", ["n1", "n2", "n3"]),
    ("n[1,3]", ["n1", "n3"]),
    ("n[1-2,5],gpu07", ["n1", "n2", "n5", "gpu07"]),
    ("node[08-10]", ["node08", "node09", "node10"]),
    ("a[1-2]-ib", ["a1-ib", "a2-ib"]),
    ("", []),
])
def test_expand_hostlist(expr, nodes):
    assert expand_hostlist(expr) == nodes


def test_expand_hostlist_rejects_garbage():
    with pytest.raises(ValueError):
        expand_hostlist("n[3-1]")


def test_srun_env_drops_the_stale_allocation_variables():
    base = {"SLURM_JOB_NODELIST": "n[1-3]", "SLURM_NNODES": "3", "SLURM_NTASKS": "3", "SRUN_DEBUG": "1",
            "SBATCH_EXPORT": "x", "SLURM_CONF": "/etc/slurm.conf", "PATH": "/bin", "SLURM_JOB_ID": "7"}
    env = srun_env(base, {"SUPERVISOR_NODE": "n1"})
    assert env == {"SLURM_CONF": "/etc/slurm.conf", "PATH": "/bin", "SUPERVISOR_NODE": "n1"}


@pytest.mark.parametrize("code,want", [(0, 0), (1, 1), (137, -9), (143, -15), (255, 255)])
def test_srun_exit_codes(code, want):
    assert srun_exit_code(code) == want


def _fake_bin(tmp_path: Path, name: str, body: str) -> Path:
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    p = d / name
    p.write_text("#!/bin/sh\n" + body + "\n")
    p.chmod(0o755)
    return d


def test_a_command_that_hangs_is_killed_and_is_a_platform_error(tmp_path):
    bin_dir = _fake_bin(tmp_path, "squeue", "sleep 30")
    started = time.monotonic()
    with pytest.raises(PlatformError, match=r"timed out after 0.5s"):
        asyncio.run(commands.run([str(bin_dir / "squeue")], timeout=0.5))
    assert time.monotonic() - started < 5
    with pytest.raises(PlatformError, match=r"timed out"):
        commands.run_sync([str(bin_dir / "squeue")], timeout=0.5)


def test_a_failing_or_missing_command_is_a_platform_error(tmp_path):
    bin_dir = _fake_bin(tmp_path, "scontrol", "echo 'slurm_load_jobs error: Unable to contact slurm controller' >&2; exit 1")
    with pytest.raises(PlatformError, match=r"exit 1.*Unable to contact slurm controller"):
        commands.run_sync([str(bin_dir / "scontrol"), "show", "job"], timeout=5)
    with pytest.raises(PlatformError, match=r"cannot run"):
        asyncio.run(commands.run([str(tmp_path / "no-such-squeue")], timeout=5))


def test_platform_start_and_observe_with_slurm_down(tmp_path):
    """slurmctld down: start-up is a clear error; a running platform keeps its state and reports
    the error instead of hanging or raising from observe."""
    bin_dir = _fake_bin(tmp_path, "scontrol", "sleep 30")
    _fake_bin(tmp_path, "squeue", "echo 'squeue: error: Unable to contact slurm controller (connect failure)' >&2; exit 1")
    _fake_bin(tmp_path, "sinfo", "exit 1")
    p = SlurmPlatform("42", tmp_path, command_timeout_s=0.5, bin_dir=str(bin_dir), base_env={})
    with pytest.raises(PlatformError, match="timed out"):
        p.start()
    p.view.alloc_nodes = ["n1", "n2"]
    status = asyncio.run(p.observe())
    assert status == {} and "Unable to contact slurm controller" in p.last_error
    assert p.slots() == ["n1", "n2"]  # the last known allocation is kept
    with pytest.raises(PlatformError, match="Unable to contact"):
        asyncio.run(p.poll(force=True))


def test_no_job_id_is_a_clear_error(tmp_path):
    with pytest.raises(PlatformError, match="SLURM_JOB_ID"):
        SlurmPlatform("", tmp_path)


def test_config_accepts_slurm_and_refuses_kubernetes():
    cfg = from_dict({"command": ["x"], "platform": {"kind": "slurm", "host": "auto",
                                                     "slurm": {"kill_confirm_s": 3, "srun_args": ["--mem=0"]}}})
    assert cfg.platform.slurm.kill_confirm_s == 3 and cfg.platform.slurm.srun_args == ("--mem=0",)
    with pytest.raises(ConfigError, match="not implemented"):
        from_dict({"command": ["x"], "platform": {"kind": "kubernetes"}})
    with pytest.raises(ConfigError, match="platform.slurm.command_timeout_s"):
        from_dict({"command": ["x"], "platform": {"kind": "slurm", "slurm": {"command_timeout_s": 0}}})
    with pytest.raises(ConfigError, match="platform.slurm.bogus"):
        from_dict({"command": ["x"], "platform": {"kind": "slurm", "slurm": {"bogus": 1}}})
    with pytest.raises(ConfigError, match="auto"):
        from_dict({"command": ["x"], "platform": {"kind": "local", "host": "auto"}})


NASTY = ["a b", 'c"d', "e'f", "$(touch /tmp/pwned-by-sbatch)", "`id`", "x;y", "*", "", "--flag=1 2", "ünï"]


def _sbatch(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "supervisor", "sbatch", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=60)


def test_sbatch_dry_run_prints_the_script_and_keeps_arguments_exact(tmp_path):
    proc = _sbatch(["--nodes", "4", "--min-nodes", "2", "--time", "2:00:00", "--partition", "gpu", "--exclusive",
                    "--log-dir", "logs", "--dry-run", "--", "python", "train.py", *NASTY], tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for line in ("#SBATCH --nodes=4", "#SBATCH --no-kill", "#SBATCH --time=2:00:00", "#SBATCH --signal=B:USR1@120",
                 "#SBATCH --ntasks-per-node=1"):
        assert line in out
    assert "-m supervisor run --config" in out
    assert "sbatch --parsable --partition gpu --exclusive" in out
    assert not (tmp_path / "logs").exists()  # a dry run writes nothing
    # the config's command is the argv as given
    cfg_text = out.split("# --- ", 2)[1].split("\n", 1)[1].split("# --- submit")[0]
    cfg = json.loads("\n".join(line[2:] for line in cfg_text.splitlines()))
    assert cfg["command"] == ["python", "train.py", *NASTY]
    assert cfg["nodes"] == {"min": 2, "max": 4} and cfg["platform"]["kind"] == "slurm"
    # no argument appears in the script's shell text
    script = out.split("# --- ")[0]
    assert "pwned" not in script and "train.py" not in script


def test_sbatch_script_is_valid_shell_with_quoted_paths(tmp_path):
    cfg = from_dict({"command": ["python", "x.py"], "job": "j", "log_dir": str(tmp_path / "log dir $(x)"),
                     "platform": {"kind": "slurm"}})
    r = render_batch_script(cfg, nodes=2, time_limit=None, warning_s=60, requeue=True, sbatch_opts=["-A", "my acct"],
                            python="/opt/py thon/bin/python", workdir=str(tmp_path / "w d"))
    subprocess.run(["bash", "-n"], input=r.script, text=True, check=True)
    assert "#SBATCH --requeue" in r.script and "#SBATCH --signal=B:USR1@60" in r.script
    assert f"exec {shlex.quote('/opt/py thon/bin/python')} -m supervisor run --config " in r.script
    # the output path has a space: it goes on sbatch's command line, exactly
    assert f"--output={tmp_path / 'log dir $(x)' / 'slurm-%j.out'}" in r.sbatch_argv
    assert r.sbatch_argv[-3:-1] == ("-A", "my acct")


def test_sbatch_usage_errors(tmp_path):
    assert _sbatch(["--nodes", "2", "--dry-run"], tmp_path).returncode == 2  # no command
    assert _sbatch(["--nodes", "1", "--min-nodes", "2", "--dry-run", "--", "x"], tmp_path).returncode == 2
    proc = _sbatch(["--help"], tmp_path)
    assert proc.returncode == 0 and "--min-nodes" in proc.stdout


def test_an_sbatch_option_with_a_line_break_is_refused_and_no_option_runs_as_shell(tmp_path):
    marker = tmp_path / "pwned"
    cfg = from_dict({"command": ["python", "x.py"], "job": "j", "log_dir": str(tmp_path / "log"),
                     "platform": {"kind": "slurm"}})

    def render(opts, time_limit=None):
        return render_batch_script(cfg, nodes=1, time_limit=time_limit, warning_s=60, requeue=False,
                                   sbatch_opts=opts, python="true", workdir=str(tmp_path))

    # a line break would end the "# sbatch options ..." comment line: the rest would be a command
    for opts in ([f"--comment=x\ntouch {marker} #"], ["-A", f"acct\rtouch {marker} #"], [f"--x=\n\ntouch {marker}"]):
        with pytest.raises(PlatformError, match="line break"):
            render(opts)
    with pytest.raises(PlatformError, match="line break"):
        render([], time_limit=f"1:00\ntouch {marker}")
    proc = _sbatch(["--nodes", "1", "--dry-run", f"--comment=x\ntouch {marker} #", "--", "python", "x.py"], tmp_path)
    assert proc.returncode == 2 and "line break" in proc.stderr and proc.stdout == ""
    # every other character stays inside the comment: the real bash runs the script, and nothing else
    r = render([f"--comment=$(touch {marker})", f"--comment=`touch {marker}`", f"--x=';touch {marker};'",
                f'--y="; touch {marker} #', f"--z=\\\ttouch {marker}"])
    script = tmp_path / "job.sbatch"
    script.write_text(r.script)
    subprocess.run(["bash", "-n", str(script)], check=True)
    ran = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=30)
    assert ran.returncode == 0, ran.stderr  # `exec true -m supervisor run ...`: the script's one command
    assert not marker.exists()


def test_sbatch_config_is_read_with_the_bounded_loader(tmp_path):
    from supervisor.config import MAX_CONFIG_BYTES

    def run(text: str) -> subprocess.CompletedProcess:
        (tmp_path / "base.yaml").write_text(text)
        return _sbatch(["--config", "base.yaml", "--nodes", "1", "--dry-run", "--", "python", "x.py"], tmp_path)

    ok = run("nproc_per_node: 2\nenv: {A: '1'}\n")
    assert ok.returncode == 0, ok.stderr
    big = run("nproc_per_node: 2\n" + "#" * MAX_CONFIG_BYTES + "\n")
    assert big.returncode == 2 and "byte limit" in big.stderr, big.stderr[-500:]
    lines = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"{c}: &{c} [{', '.join(['*' + p] * 9)}]" for p, c in zip("abcde", "bcdef")]
    bomb = run("env:\n  " + "\n  ".join(lines) + "\n  BOMB: *f\n")
    assert bomb.returncode == 2 and "aliases expand to over" in bomb.stderr, bomb.stderr[-500:]
    for text, field in (("platform: gpu\n", "platform"), ("env: [A, B]\n", "env"), ("http: 8080\n", "http")):
        proc = run(text)
        assert proc.returncode == 2 and f"base.yaml: {field}: must be a mapping" in proc.stderr, proc.stderr[-500:]


def test_the_hand_written_template_and_its_config():
    from supervisor.config import load

    cfg = load(REPO / "slurm" / "job.yaml")
    assert cfg.platform.kind == "slurm" and cfg.platform.host == "auto" and cfg.platform.slurm.requeue_on_warning
    text = (REPO / "slurm" / "supervisor.sbatch").read_text()
    subprocess.run(["bash", "-n", str(REPO / "slurm" / "supervisor.sbatch")], check=True)
    for line in ("#SBATCH --no-kill", "#SBATCH --signal=B:USR1@", "#SBATCH --ntasks-per-node=1"):
        assert line in text


def test_cluster_script_is_valid_shell_and_prints_usage():
    script = REPO / "scripts" / "slurm-cluster.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    proc = subprocess.run([str(script)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "kill-node" in proc.stdout


# ----------------------------------------------------------------- adoption never touches a stranger

@pytest.fixture
def stranger():
    """A process that exits 7 once its stdin closes (killed by a signal, it returns -N instead),
    leading its own process group like an srun client."""
    proc = subprocess.Popen(["sh", "-c", "read line; exit 7"], stdin=subprocess.PIPE, start_new_session=True)
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def _finish(proc: subprocess.Popen) -> int:
    """7 if no signal reached it: one sent earlier is pending before its input ends."""
    proc.stdin.close()
    return proc.wait(timeout=10)


def _fake_slurm(tmp_path: Path, listed_step: str) -> tuple[Path, Path]:
    """squeue listing job 42 running on n1 with one step; scancel records its arguments."""
    cancels = tmp_path / "scancel.log"
    bin_dir = _fake_bin(tmp_path, "squeue", f'case " $* " in *" -s "*) echo "{listed_step}|sv-job-a1-n1|n1";; '
                                            '*) echo "RUNNING|n1";; esac')
    _fake_bin(tmp_path, "sinfo", 'echo "n1|allocated"')
    _fake_bin(tmp_path, "scancel", f'echo "$*" >> {shlex.quote(str(cancels))}')
    return bin_dir, cancels


def _saved(srun_pid: int, srun_start, step_id: str = "42.3") -> dict:
    node = {"attempt": 1, "step_name": "sv-job-a1-n1", "step_id": step_id, "srun_pid": srun_pid, "log": "n1.log"}
    if srun_start is not None:
        node["srun_start"] = srun_start
    return {"job_id": "42", "restart_count": "0", "unresponsive": [], "nodes": {"n1": node}}


def _adopt_then_teardown(tmp_path, bin_dir, saved) -> bool:
    p = SlurmPlatform("42", tmp_path, command_timeout_s=5, kill_confirm_s=0.3, bin_dir=str(bin_dir), base_env={})

    async def scenario():
        adopted = await p.adopt(saved, 1)
        await p.teardown(0.1)
        return adopted

    return asyncio.run(scenario())


@pytest.mark.parametrize("wrong_start", [True, False], ids=["wrong-start-time", "no-start-time"])
def test_an_adopted_step_whose_srun_pid_is_reused_is_cancelled_but_the_pid_is_not_signalled(tmp_path, stranger,
                                                                                               wrong_start):
    from supervisor.procfs import start_time

    bin_dir, cancels = _fake_slurm(tmp_path, "42.3")
    saved = _saved(stranger.pid, start_time(stranger.pid) + 1 if wrong_start else None)
    assert _adopt_then_teardown(tmp_path, bin_dir, saved) is True  # the step is ours
    assert "42.3" in cancels.read_text()  # it is stopped through Slurm
    assert _finish(stranger) == 7  # the process holding the old srun pid got no signal


def test_a_step_of_the_same_name_but_another_id_is_not_adopted_nor_cancelled(tmp_path, stranger):
    from supervisor.procfs import start_time

    bin_dir, cancels = _fake_slurm(tmp_path, "42.9")
    assert _adopt_then_teardown(tmp_path, bin_dir, _saved(stranger.pid, start_time(stranger.pid) + 1)) is False
    assert "42.9" not in (cancels.read_text() if cancels.exists() else "")
    assert _finish(stranger) == 7


def test_an_adopted_srun_client_with_the_right_start_time_is_ended(tmp_path, stranger):
    from supervisor.procfs import start_time

    bin_dir, cancels = _fake_slurm(tmp_path, "42.3")
    assert _adopt_then_teardown(tmp_path, bin_dir, _saved(stranger.pid, start_time(stranger.pid))) is True
    assert stranger.wait(timeout=10) == -9
