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
from supervisor.platforms.slurm import (SlurmPlatform, expand_hostlist, parse_time_limit, render_batch_script, srun_env,
                                        srun_exit_code)

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


def test_config_of_the_slurm_platform():
    cfg = from_dict({"command": ["x"], "platform": {"kind": "slurm", "host": "auto",
                                                     "slurm": {"kill_confirm_s": 3, "srun_args": ["--mem=0"]}}})
    assert cfg.platform.slurm.kill_confirm_s == 3 and cfg.platform.slurm.srun_args == ("--mem=0",)
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


def _heredoc_config(script: str) -> dict:
    """The job config inline in a batch script (the quoted heredoc)."""
    import yaml

    head, marker = script.split("<<'", 1)
    marker, body = marker.split("'", 1)
    return yaml.safe_load(body.split("\n", 1)[1].split(f"\n{marker}\n", 1)[0])


def test_sbatch_dry_run_prints_the_script_and_keeps_arguments_exact(tmp_path):
    proc = _sbatch(["--nodes", "4", "--min-nodes", "2", "--time", "2:00:00", "--partition", "gpu", "--exclusive",
                    "--log-dir", "logs", "--dry-run", "--", "python", "train.py", *NASTY], tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for line in ("#SBATCH --nodes=2-4", "#SBATCH --no-kill", "#SBATCH --time=2:00:00", "#SBATCH --signal=B:USR1@120",
                 "#SBATCH --partition gpu --exclusive"):
        assert line in out.splitlines()
    # with a node range, --ntasks-per-node=1 makes Slurm allocate MIN nodes only (measured)
    assert "--ntasks-per-node" not in out
    assert '-m supervisor run --config "$config"' in out
    assert not (tmp_path / "logs").exists()  # a dry run writes nothing
    # the config is inline, its command the argv as given
    cfg = _heredoc_config(out)
    assert cfg["command"] == ["python", "train.py", *NASTY]
    assert (cfg["nodes"]["min"], cfg["nodes"]["max"]) == (2, 4) and cfg["platform"]["kind"] == "slurm"
    # no argument appears in the script's shell text
    shell = out.split("<<'")[0] + out.rsplit("SUPERVISOR_CONFIG_JSON\n", 1)[1]
    assert "pwned" not in shell and "train.py" not in shell
    # nothing names a file that does not exist: the script is all there is
    assert "slurm-submit/job-" not in proc.stderr and "submit with: sbatch" not in out


def test_the_dry_run_script_is_self_contained_and_runs_as_printed(tmp_path):
    """Saved as printed and run by the real bash, the script writes the config it carries and
    hands exactly that to `supervisor run --config` (here a stand-in python that keeps it)."""
    fake = tmp_path / "py"
    fake.write_text('#!/bin/sh\n[ "$1 $2 $3 $4" = "-m supervisor run --config" ] || exit 9\ncp "$5" "$0.got"\n')
    fake.chmod(0o755)
    proc = _sbatch(["--nodes", "2", "--log-dir", str(tmp_path / "log dir"), "--python", str(fake), "--dry-run", "--",
                    "python", "train.py", *NASTY], tmp_path)
    assert proc.returncode == 0, proc.stderr
    script = tmp_path / "saved.sbatch"
    script.write_text(proc.stdout)
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": "77"}
    ran = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30)
    assert ran.returncode == 0, ran.stderr
    got = json.loads((tmp_path / "py.got").read_text())
    assert got["command"] == ["python", "train.py", *NASTY] and (got["nodes"]["min"], got["nodes"]["max"]) == (2, 2)
    written = tmp_path / "log dir" / "slurm-submit" / "job-77.json"
    assert json.loads(written.read_text()) == got and oct(written.stat().st_mode & 0o777) == "0o600"
    # the output path has a space: quoted as sbatch reads #SBATCH lines
    assert f'#SBATCH "--output={tmp_path}/log dir/slurm-%j.out"' in proc.stdout


def test_sbatch_script_is_valid_shell_with_quoted_paths(tmp_path):
    cfg = from_dict({"command": ["python", "x.py"], "job": "j", "log_dir": str(tmp_path / "log dir $(x)"),
                     "nodes": {"min": 1, "max": 2}, "platform": {"kind": "slurm"}})
    r = render_batch_script(cfg, time_limit=None, warning_s=60, requeue=True, sbatch_opts=["-A", "my acct"],
                            python="/opt/py thon/bin/python", workdir=str(tmp_path / "w d"))
    subprocess.run(["bash", "-n"], input=r.script, text=True, check=True)
    assert "#SBATCH --requeue" in r.script and "#SBATCH --signal=B:USR1@60" in r.script
    assert "#SBATCH --nodes=1-2" in r.script
    assert f'exec {shlex.quote("/opt/py thon/bin/python")} -m supervisor run --config "$config"' in r.script
    # every option is in the script, quoted as sbatch parses #SBATCH lines; sbatch reads it on stdin
    assert f'#SBATCH "--output={tmp_path}/log dir $(x)/slurm-%j.out"' in r.script
    assert '#SBATCH -A "my acct"' in r.script
    assert r.sbatch_argv == ("sbatch", "--parsable")


@pytest.mark.parametrize("text,seconds", [
    ("10", 600), ("10:30", 630), ("1:02:03", 3723), ("2-0", 172800), ("1-2:03", 93780), ("1-02:03:04", 93784),
    ("48:00:00", 172800), ("0", None), ("UNLIMITED", None), ("infinite", None),
])
def test_time_limits_are_read_as_slurm_reads_them(text, seconds):
    assert parse_time_limit(text) == seconds


@pytest.mark.parametrize("text", ["0:10:99", "10:60", "1:60:00", "1-24", "1-2:60", "1-2:3:60", "1:2:3:4", "2h",
                                  "-5", "", "1-", "a-1"])
def test_time_limits_slurm_would_carry_over_or_reject_are_refused(text):
    with pytest.raises(ValueError, match="not a Slurm time"):
        parse_time_limit(text)


@pytest.mark.parametrize("args,message", [
    (["--warning-seconds", "-5"], "--warning-seconds -5: must be > 0"),
    (["--warning-seconds", "0"], "--warning-seconds 0: must be > 0"),
    # 30 s kill grace + 10 s kill confirmation: 20 s of warning cannot cover the emergency checkpoint
    (["--warning-seconds", "20"], "--warning-seconds 20 is shorter than stopping the job takes: restart.kill_grace_s 30"),
    # with --requeue, scontrol requeue's own timeout too (30 + 10 + 20 = 60)
    (["--warning-seconds", "50", "--requeue"], "command_timeout_s 20 (scontrol requeue) = 60 s"),
    (["--checkpoint-seconds", "45"], "--checkpoint-seconds 45 is longer than restart.kill_grace_s 30"),
    (["--time", "0:10:99"], "--time '0:10:99': not a Slurm time"),
    (["--time", "2", "--warning-seconds", "120"], "is not below the time limit (120 s)"),
])
def test_sbatch_refuses_what_would_fail_later_and_submits_nothing(tmp_path, args, message):
    proc = _sbatch(["--nodes", "2", "--log-dir", "logs", *args, "--dry-run", "--", "python", "x.py"], tmp_path)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert proc.stdout == "" and "nothing submitted" in proc.stderr and not (tmp_path / "logs").exists()


def test_sbatch_warning_that_covers_the_stop_is_accepted(tmp_path):
    ok = _sbatch(["--nodes", "2", "--warning-seconds", "60", "--requeue", "--time", "1:00:00", "--checkpoint-seconds",
                  "25", "--dry-run", "--", "python", "x.py"], tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "#SBATCH --signal=B:USR1@60" in ok.stdout


def test_sbatch_takes_the_node_range_from_its_base_config(tmp_path):
    (tmp_path / "base.yaml").write_text("nodes: {min: 2, max: 3}\nnproc_per_node: 2\n")
    proc = _sbatch(["--config", "base.yaml", "--dry-run", "--", "python", "x.py"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --nodes=2-3" in proc.stdout and _heredoc_config(proc.stdout)["nproc_per_node"] == 2
    none = _sbatch(["--dry-run", "--", "python", "x.py"], tmp_path)
    assert none.returncode == 2 and "give --nodes" in none.stderr


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
        return render_batch_script(cfg, time_limit=time_limit, warning_s=60, requeue=False,
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
    # a path that is not a string: one clear line, no traceback
    for text, field in (("checkpoint_dir: 5\n", "checkpoint_dir"), ("log_dir: [a]\n", "log_dir"),
                        ("checkpoint_dir: ''\n", "checkpoint_dir")):
        proc = run(text)
        assert proc.returncode == 2 and f"base.yaml: {field}: must be a path" in proc.stderr, proc.stderr[-500:]
        assert "Traceback" not in proc.stderr


def test_the_hand_written_template_matches_the_wrapper_and_runs_the_venv_python(tmp_path):
    import yaml

    from supervisor.config import from_dict, load

    path = REPO / "slurm" / "supervisor.sbatch"
    text = path.read_text()
    subprocess.run(["bash", "-n", str(path)], check=True)
    raw = _heredoc_config(text)
    cfg = from_dict(raw)
    assert cfg.platform.kind == "slurm" and cfg.platform.host == "auto" and cfg.platform.slurm.requeue_on_warning
    # slurm/job.yaml (the wrapper's base config) is the same job
    assert load(REPO / "slurm" / "job.yaml") == cfg
    # its #SBATCH options are what the wrapper writes for that config (the output: see its comment)
    def options(script: str) -> set[str]:
        return {ln.split(None, 1)[1] for ln in script.splitlines() if ln.startswith("#SBATCH ")
                and not ln.startswith(("#SBATCH --output=", '#SBATCH "--output='))}

    limit = next(ln.split("=", 1)[1] for ln in text.splitlines() if ln.startswith("#SBATCH --time="))
    warning = int(next(ln.split("@", 1)[1] for ln in text.splitlines() if ln.startswith("#SBATCH --signal=")))
    wrapper = render_batch_script(cfg, time_limit=limit, warning_s=warning, requeue=True, sbatch_opts=[],
                                  python="python", workdir=".")
    assert options(text) == options(wrapper.script)
    assert f"#SBATCH --nodes={cfg.nodes.min}-{cfg.nodes.max}" in text
    # the comments say what the config says
    assert f"nproc_per_node below, {cfg.nproc_per_node})" in text
    assert f"restart.kill_grace_s ({cfg.restart.kill_grace_s:g})" in text
    assert f"--nodes={cfg.nodes.min}-{cfg.nodes.max}  " in text
    # run by the real bash as a batch job would: it writes the config and runs the venv's python,
    # not the `python` first on PATH
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    venv_py = tmp_path / ".venv" / "bin" / "python"
    venv_py.write_text('#!/bin/sh\necho "$@" > "$0.args"\n')
    venv_py.chmod(0o755)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").write_text("#!/bin/sh\nexit 97\n")
    (tmp_path / "bin" / "python").chmod(0o755)
    env = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "SLURM_SUBMIT_DIR": str(tmp_path), "SLURM_JOB_ID": "42"}
    ran = subprocess.run(["bash", str(path)], env=env, cwd="/", capture_output=True, text=True, timeout=30)
    assert ran.returncode == 0, ran.stderr
    written = tmp_path / "supervisor-logs" / "slurm-submit" / "train-42.yaml"
    assert (tmp_path / ".venv" / "bin" / "python.args").read_text().split() == [
        "-m", "supervisor", "run", "--config", "supervisor-logs/slurm-submit/train-42.yaml"]
    assert yaml.safe_load(written.read_text()) == raw
    # without the venv: a clear error, not whatever python is on PATH
    venv_py.unlink()
    ran = subprocess.run(["bash", str(path)], env=env, cwd="/", capture_output=True, text=True, timeout=30)
    assert ran.returncode == 2 and "create the venv" in ran.stderr


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


# ----------------------------------------------------------------- the controller-lost marker, the batch host's address

def _fake_allocation(tmp_path: Path) -> Path:
    """scontrol answering for job 42, RUNNING on n[1-2] with n1 (NodeAddr 10.9.8.7) its batch host."""
    return _fake_bin(tmp_path, "scontrol", """case "$*" in
  "show job -o 42") echo "JobId=42 JobState=RUNNING NodeList=n[1-2] BatchHost=n1 Restarts=0";;
  "show node -o "*) echo "NodeName=n1 NodeAddr=10.9.8.7 State=ALLOCATED"; echo "NodeName=n2 NodeAddr=10.9.8.8 State=ALLOCATED";;
  *) exit 1;;
esac""")


def test_a_submission_refused_by_the_job_lock_leaves_the_controller_lost_marker_to_the_job_holding_it(tmp_path):
    """The marker a node guard left is the job's that holds the lock: a second controller on the same
    log directory, refused by the lock, must not set it aside (the platform starts before the lock
    is taken; the marker is read at the first notices(), which only a lock holder asks for)."""
    from supervisor.controller.daemon import Controller
    from supervisor.controller.state import JobLock, StateError
    from supervisor.platforms.slurm.guard import MARKER

    bin_dir = _fake_allocation(tmp_path)
    log_dir = tmp_path / "logs"
    marker = log_dir / "slurm" / MARKER
    marker.parent.mkdir(parents=True)
    marker.write_text(json.dumps({"node": "n2", "action": "requeued"}))
    cfg = from_dict({"command": ["x"], "log_dir": str(log_dir), "checkpoint_dir": str(tmp_path / "ckpt"),
                     "platform": {"kind": "slurm", "slurm": {"job_id": "42"}}})
    holder = JobLock(log_dir.resolve())
    holder.acquire()  # the running job's controller
    try:
        second = SlurmPlatform("42", log_dir / "slurm", bin_dir=str(bin_dir), base_env={}).start()
        with pytest.raises(StateError, match="another supervisor"):
            asyncio.run(Controller(cfg, second).run())
        assert json.loads(marker.read_text()) == {"node": "n2", "action": "requeued"}  # still there, untouched
    finally:
        holder.release()
    # the controller that holds the lock picks it up, once
    first = SlurmPlatform("42", log_dir / "slurm", bin_dir=str(bin_dir), base_env={}).start()
    assert marker.exists()
    [(name, fields)] = first.notices()
    assert name == "controller_loss_recovered" and fields["lost"] == {"node": "n2", "action": "requeued"}
    assert not marker.exists() and Path(fields["marker"]).exists()
    assert first.notices() == []


def _status_url(saved: dict) -> str | None:
    import argparse

    from supervisor.cli.status import _status_url as url

    return url(argparse.Namespace(url=None), saved)


def test_status_from_a_login_node_reaches_the_controller_on_the_batch_host(tmp_path):
    """`supervisor status --log-dir` reads the address from the state file: the HTTP host when it is
    an address; for a wildcard listener (0.0.0.0, ::), the batch host's address that the Slurm
    platform records, never 127.0.0.1 (the login node itself)."""
    p = SlurmPlatform("42", tmp_path, bin_dir=str(_fake_allocation(tmp_path)), base_env={}).start()
    described = json.loads(json.dumps(p.describe()))  # as the state file holds it
    assert described["batch_host"] == "n1" and described["batch_addr"] == "10.9.8.7"
    assert _status_url({"http_host": "10.9.8.7", "http_port": 8080, "platform": described}) == "http://10.9.8.7:8080"
    assert _status_url({"http_host": "10.1.2.3", "http_port": 8080, "platform": described}) == "http://10.1.2.3:8080"
    for wildcard in ("0.0.0.0", "::", ""):
        assert _status_url({"http_host": wildcard, "http_port": 8080, "platform": described}) == "http://10.9.8.7:8080"
    # no platform address recorded (the local platform): the supervisor runs here
    assert _status_url({"http_host": "0.0.0.0", "http_port": 8080, "platform": {}}) == "http://127.0.0.1:8080"
    assert _status_url({"http_host": "fd00::5", "http_port": 8080}) == "http://[fd00::5]:8080"
    assert _status_url({"http_host": "0.0.0.0"}) is None


@pytest.mark.parametrize("path", ["slurm/job.yaml", "slurm/supervisor.sbatch"])
def test_the_shipped_config_runs_on_every_allocation_slurm_may_give_it(path):
    """Slurm starts a --nodes=MIN-MAX job on any count in the range: on each, the gang the controller
    picks must have a world size the example's global batch (16, its default) divides (3 ranks
    failed three times and stopped before world_sizes was in the config)."""
    from supervisor.config import load
    from supervisor.controller.decide import gang_size

    cfg = from_dict(_heredoc_config((REPO / path).read_text())) if path.endswith(".sbatch") else load(REPO / path)
    assert "--global-batch" not in cfg.command  # the example's default, 16
    n = cfg.nodes
    for allocated in range(n.min, n.max + 1):
        size = gang_size(allocated, n.min, n.max, cfg.nproc_per_node, n.world_sizes, n.world_size_multiple_of)
        assert size is not None and 16 % (size * cfg.nproc_per_node) == 0, (allocated, size)


class _WarnedJob:
    """A controller whose run is cut by Slurm's time-limit warning: it ends as the real one does,
    in `requeued` with exit code 9, after the platform's warning handler ran."""

    def __init__(self) -> None:
        self.requeue_planned = False
        self.events: list[tuple[str, dict]] = []
        self.stops: list = []

    def event(self, name: str, **fields) -> None:
        self.events.append((name, fields))

    def request_stop(self, sig) -> None:
        self.stops.append(sig)

    async def run(self) -> int:
        import signal

        os.kill(os.getpid(), signal.SIGUSR1)
        while not self.stops:
            await asyncio.sleep(0.01)
        return 9 if self.requeue_planned else 10


@pytest.mark.parametrize("requeue_works", [True, False])
def test_a_requeue_at_the_time_limit_warning_exits_with_the_requeued_code(tmp_path, requeue_works):
    """README's table: 9 (`requeued`) for a planned requeue, the code job_finished gave; a requeue
    that Slurm refused is a failure (1: the job is not coming back by itself)."""
    calls = tmp_path / "scontrol.log"
    bin_dir = _fake_bin(tmp_path, "scontrol", f'echo "$*" >> {shlex.quote(str(calls))}; '
                                              + ("exit 0" if requeue_works else "echo 'Requested operation is disabled' >&2; exit 1"))
    p = SlurmPlatform("42", tmp_path, command_timeout_s=5, bin_dir=str(bin_dir), base_env={}, requeue_on_loss=True)
    job = _WarnedJob()
    code = asyncio.run(p.supervise(job))
    assert calls.read_text().split() == ["requeue", "42"]
    names = [name for name, _ in job.events]
    if requeue_works:
        assert code == 9 and names == ["slurm_warning_signal", "slurm_requeued"]
    else:
        assert code == 1 and names == ["slurm_warning_signal", "slurm_requeue_failed"]
