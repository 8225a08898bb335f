"""The contracts the worker SDK and the controller share beyond the frame (supervisor.protocol):
the checkpoints a restore refused, the restore-point answer, the watchdog value and the rank log
record. Each is written by one side and read by the other through the same definition."""

from __future__ import annotations

import json

import msgspec
import pytest

from supervisor.checkpoint import Skipped
from supervisor.checkpoint.discovery import parse_name
from supervisor.protocol import (
    REFUSED_MAX,
    WHY_CHARS,
    Heartbeat,
    ProtocolError,
    decode_frame,
    decode_heartbeat,
    decode_refused,
    derive_keys,
    encode,
    parse_restore_point,
    refused_field,
    restore_point_answer,
)

KEY = derive_keys(b"0123456789abcdef" * 3).heartbeat
C1, C2, C3 = "step-0000000001", "step-0000000002", "step-0000000003"


def hb(**kw) -> Heartbeat:
    return Heartbeat(job="j", attempt=1, rank=0, world_size=1, seq=1, step=0, phase="restore", phase_s=0.0,
                     launch="a" * 32, **kw)


# ------------------------------------------------------------------ the checkpoints a restore refused
def test_the_refusals_travel_as_pairs_and_come_back_the_same_from_both_decoders():
    sent = hb(restore_state="restored", restored=C1, restore_refused=((C3, "fails its sha256 checksum"), (C2, "x")))
    frame = encode(sent.to_payload(), KEY)
    assert json.loads(frame[19:])["restore_refused"] == [[C3, "fails its sha256 checksum"], [C2, "x"]]
    assert "restore_skipped" not in json.loads(frame[19:])  # an older controller ignores the new key
    assert decode_heartbeat(frame, KEY) == sent == Heartbeat.from_payload(decode_frame(frame, KEY))


def test_an_older_sdks_string_is_read_and_its_exclusions_are_not_refusals():
    payload = hb().to_payload()
    del payload["restore_refused"]
    payload["restore_skipped"] = f"{C3}: fails its sha256 checksum (corrupt); {C2}: excluded by the caller (marked suspect)"
    frame = encode(payload, KEY)
    for got in (decode_heartbeat(frame, KEY), Heartbeat.from_payload(decode_frame(frame, KEY))):
        assert got.restore_refused == ((C3, "fails its sha256 checksum (corrupt)"),)
        assert not hasattr(got, "restore_skipped")
    assert decode_refused("") == () and decode_refused([]) == ()


@pytest.mark.parametrize("value", [
    "x" * 385, [[C1]], [[C1, "why", "more"]], [[C1, 5]], [C1], {"a": 1}, 7,
    [[C1, "w"]] * (REFUSED_MAX + 1), [["n" * 65, "w"]], [[C1, "w" * (WHY_CHARS + 1)]],
])
def test_refusals_out_of_shape_or_bounds_are_a_schema_error_on_both_decoders(value):
    with pytest.raises(ProtocolError) as exc:
        decode_refused(value)
    assert exc.value.reason == "schema"
    if not isinstance(value, str):
        frame = encode(hb().to_payload() | {"restore_refused": value}, KEY)
        for decode in (lambda: decode_heartbeat(frame, KEY), lambda: Heartbeat.from_payload(decode_frame(frame, KEY))):
            with pytest.raises(ProtocolError, match="schema"):
                decode()


def test_a_rank_sends_a_bounded_list():
    many = [(f"step-{i:010d}", "y" * 500) for i in range(20)]
    field = refused_field(many)
    assert 1 <= len(field) <= REFUSED_MAX and all(len(why) <= WHY_CHARS for _, why in field)
    assert sum(len(n) + len(w) for n, w in field) <= 384
    assert refused_field([(C1, "short"), (C2, "also")]) == ((C1, "short"), (C2, "also"))
    decode_refused(list(field))  # what a rank sends, the controller takes


def test_a_rank_does_not_list_what_the_controller_excluded():
    from supervisor.worker.runtime import _refused

    skipped = [Skipped(C3, "fails its sha256 checksum"), Skipped(C2, "excluded by the caller (marked suspect)")]
    assert _refused(skipped, [C2]) == ((C3, "fails its sha256 checksum"),)
    assert _refused(skipped, []) == tuple((s.name, s.reason) for s in skipped)


# ------------------------------------------------------------------ the restore-point answer
def test_the_answer_the_controller_sends_is_the_one_a_rank_reads():
    body = json.dumps(restore_point_answer(attempt=3, checkpoint=C2, exclude=[C3], required=True)).encode()
    assert json.loads(body) == {"attempt": 3, "checkpoint": C2, "exclude": [C3], "required": True}
    point = parse_restore_point(body, is_name=parse_name)
    assert (point.checkpoint, point.exclude, point.required) == (C2, (C3,), True)
    fresh = parse_restore_point(b'{"checkpoint": null, "required": "yes"}', is_name=parse_name)
    assert (fresh.checkpoint, fresh.exclude, fresh.required) == (None, (), False)


@pytest.mark.parametrize("body, reason", [
    (b"{", "malformed"), (b"[" * 100_000, "malformed"), (b"[]", "schema"),
    (b'{"checkpoint": "../etc"}', "schema"), (b'{"checkpoint": 5}', "schema"),
    (b'{"exclude": "step-0000000001"}', "schema"), (b'{"exclude": ["nope"]}', "schema"),
    (json.dumps({"exclude": [C1] * 16385}).encode(), "schema"), (b" " * (1 << 20) + b"{}", "schema"),
])
def test_an_answer_out_of_shape_is_refused_naming_why(body, reason):
    with pytest.raises(ProtocolError) as exc:
        parse_restore_point(body, is_name=parse_name)
    assert exc.value.reason == reason


# ------------------------------------------------------------------ SUPERVISOR_WATCHDOG
def test_the_watchdog_value_the_controller_writes_is_the_one_a_rank_reads():
    from supervisor.health import Timeouts
    from supervisor.protocol import TIMED_PHASES, decode_watchdog, encode_watchdog

    t = Timeouts(heartbeat_s=5, startup_s=100, checkpoint_s=1000, data_s=20, compute_s=30, collective_s=40)
    assert t.watchdog_env() == encode_watchdog({p: 0.8 * t.for_phase(p) for p in TIMED_PHASES})
    assert t.watchdog_env().startswith("init=80.000,restore=80.000,data=16.000,")
    assert decode_watchdog(t.watchdog_env()) == pytest.approx({p: 0.8 * t.for_phase(p) for p in TIMED_PHASES})
    assert decode_watchdog(" compute=7, collective=3 ,") == {"compute": 7.0, "collective": 3.0}
    assert decode_watchdog("") == {}


@pytest.mark.parametrize("value, says", [
    ("compute", "PHASE=SECONDS"), ("lunch=5", "PHASE=SECONDS"), ("compute=x", "not a number"),
    ("compute=0", "> 0"), ("compute=nan", "finite"), ("data=inf", "finite"), ("compute=1" + "0" * 400, "finite"),
    ("compute=1," * 200, "over 1024"),
])
def test_a_watchdog_value_out_of_shape_is_refused_naming_why(value, says):
    from supervisor.protocol import decode_watchdog

    with pytest.raises(ProtocolError, match=says) as exc:
        decode_watchdog(value)
    assert exc.value.reason == "schema"


# ------------------------------------------------------------------ the rank log record
def test_the_record_a_rank_writes_is_the_one_its_readers_read(tmp_path):
    from supervisor.cli.drill import _rank0_losses
    from supervisor.controller.daemon import _last_logged_step
    from supervisor.reports.efficiency import read_timing_logs
    from supervisor.protocol import ranklog

    ranks = tmp_path / ranklog.RANKS_DIR
    ranks.mkdir()
    common = dict(world_size=2, rank=0, node="n0", pid=7, data_s=0.1, compute_s=0.2, collective_s=0.3, step_s=0.6,
                  time=1.0)
    lines = [ranklog.step_record(step=s, loss=0.5 / s, attempt=a, **common) for s, a in ((1, 0), (2, 0), (2, 1))]
    lines.append(ranklog.step_record(step=3, loss=None, attempt=1, extra={"tokens": 9}, **common))
    (ranks / ranklog.log_name(0)).write_text("".join(lines) + '{"step": 4, "atte')  # the line being written
    rec = json.loads(lines[-1])
    assert tuple(rec) == ranklog.FIELDS + ("tokens",) and rec["loss"] is None and rec["loss_hex"] is None
    assert json.loads(lines[0])["loss_hex"] == (0.5).hex()
    assert _last_logged_step(ranks / ranklog.log_name(0), 1) == 3 and _last_logged_step(ranks / "rank-9.jsonl", 1) is None
    assert _rank0_losses(str(tmp_path)) == ({1: 0.5, 2: 0.25}, {1: 2, 2: 2})
    with pytest.raises(ValueError, match="rank-0.jsonl:5: not JSON"):
        read_timing_logs(ranks)  # the report takes whole logs only
    (ranks / ranklog.log_name(0)).write_text("".join(lines))
    (ranks / "rank-x.jsonl").write_text("not a rank's")
    assert [r["step"] for r in read_timing_logs(ranks)[0]] == [1, 2, 2, 3]


def test_a_tail_read_drops_its_partial_first_line(tmp_path):
    from supervisor.protocol import ranklog

    path = tmp_path / "rank-0.jsonl"
    path.write_text('{"step": 1, "attempt": 0, "pad": "' + "x" * 100 + '"}\n{"step": 2, "attempt": 0}\n')
    assert [r["step"] for r in ranklog.read_log(path, tail_bytes=40)] == [2]
    assert [r["step"] for r in ranklog.read_log(path)] == [1, 2]
    assert ranklog.parse_records(["[1]", "", "{}"]) == [{}]
    with pytest.raises(ProtocolError, match="x:1: expected a JSON object"):
        ranklog.parse_records(["[1]"], source="x", strict=True)


# ------------------------------------------------------------------ the heartbeat's field order
NODE_FRAME_FIELDS_V2 = (
    "job", "attempt", "rank", "world_size", "seq", "step", "phase", "phase_s", "launch", "node", "pid", "coll_seq",
    "coll_op", "coll_inside", "coll_s", "last_data_s", "last_compute_s", "last_collective_s", "last_step_s",
    "ckpt_step", "ckpt_state", "ckpt_s", "ckpt_persist_s", "loss_ok", "watchdog", "stack_file", "error",
    "error_peer", "ckpt_root", "restore_state", "restored", "restore_refused", "restore_s", "steps_done",
    "first_step_s", "outcome", "dump_seq", "source", "coll_group", "coll_groups", "trace_file",
)


def test_the_heartbeat_s_fields_keep_their_order_new_ones_only_at_the_end_with_a_default():
    # a node frame carries each heartbeat as an array in this order: a field moved or inserted
    # mid-way would read into its neighbour's place at a controller or agent of another version
    fields = Heartbeat.__struct_fields__
    assert fields[:len(NODE_FRAME_FIELDS_V2)] == NODE_FRAME_FIELDS_V2
    defaults = {f.name: f.default for f in msgspec.structs.fields(Heartbeat)}
    assert all(defaults[name] is not msgspec.NODEFAULT for name in fields[len(NODE_FRAME_FIELDS_V2):])
