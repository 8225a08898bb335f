"""The manifest parser: every malformed input is a ManifestError with a reason, never a crash."""

from __future__ import annotations

import json

import pytest

from supervisor.checkpoint.errors import ManifestError, UnsafePathError
from supervisor.checkpoint.manifest import MAX_MANIFEST_BYTES, FileEntry, Manifest, check_relative_path, parse


def good() -> dict:
    return Manifest(
        global_step=7, writer_world_size=2, checksum_algorithm="xxh3_128",
        files={".metadata": FileEntry(10, "0" * 32), "rng/rank-00000.json": FileEntry(3, "a" * 32)},
        trainer_state={"rng": {"files": ["rng/rank-00000.json"]}},
    ).to_dict()


def test_roundtrip():
    m = parse(json.dumps(good()).encode())
    assert m.global_step == 7 and m.writer_world_size == 2 and m.total_bytes == 13
    assert parse(m.to_bytes()) == m


@pytest.mark.parametrize(
    "mutate, reason",
    [
        (lambda d: d.update(format_version=99), "unknown manifest format_version 99"),
        (lambda d: d.update(format_version="1"), "no integer format_version"),
        (lambda d: d.pop("format_version"), "no integer format_version"),
        (lambda d: d.update(status="in_progress"), "status is 'in_progress'"),
        (lambda d: d.update(global_step=-1), "global_step must be an integer >= 0"),
        (lambda d: d.update(global_step=True), "global_step must be an integer"),
        (lambda d: d.update(writer_world_size=0), "writer_world_size must be an integer >= 1"),
        (lambda d: d["checksums"].update(algorithm="md5"), "unknown checksum algorithm 'md5'"),
        (lambda d: d["checksums"].update(files={}), "lists no files"),
        (lambda d: d.update(checksums=[]), "no checksums mapping"),
        (lambda d: d["checksums"]["files"].update({"x": {"size": -1, "digest": "0" * 32}}), "no valid size"),
        (lambda d: d["checksums"]["files"].update({"x": {"size": 1, "digest": "zz"}}), "no valid hex digest"),
        (lambda d: d["checksums"]["files"].update({"x": "abc"}), "not a mapping"),
        (lambda d: d["trainer_state"]["rng"].update(files=["rng/missing.json"]), "not checksummed"),
        (lambda d: d.update(trainer_state=[]), "trainer_state must be a mapping"),
        (lambda d: d.update(created_unix=float("nan")), "created_unix"),
        (lambda d: d.update(release="../../etc"), "release must be a version id"),
        (lambda d: d.update(release=12), "release must be a version id"),
        (lambda d: d.update(release="a" * 65), "release must be a version id"),
        (lambda d: d.update(release="0123456789ab\n"), "release must be a version id"),
    ],
)
def test_bad_fields_are_refused_with_a_reason(mutate, reason):
    d = good()
    mutate(d)
    with pytest.raises(ManifestError, match=reason.replace("(", r"\(").replace(")", r"\)")):
        Manifest.from_dict(d)


def test_the_release_that_wrote_it_round_trips_and_an_older_manifest_names_none():
    d = good()
    assert "release" not in d and Manifest.from_dict(d).release == ""
    d["release"] = "0123456789ab"
    assert Manifest.from_dict(d).release == "0123456789ab" and Manifest.from_dict(d).to_dict()["release"] == d["release"]


def test_newer_format_says_upgrade():
    d = good()
    d["format_version"] = 2
    with pytest.raises(ManifestError, match="newer supervisor"):
        Manifest.from_dict(d)


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"", "empty"),
        (b"   \n", "empty"),
        (b'{"format_version": 1, "status": "comp', "not valid JSON"),
        (b"\xff\xfe\x00garbage", "not valid JSON"),
        (b"[1, 2, 3]", "must be a mapping"),
        (b"[" * 100_000 + b"]" * 100_000, "nests too deeply|not valid JSON"),
    ],
)
def test_truncated_or_garbled(data, reason):
    with pytest.raises(ManifestError, match=reason):
        parse(data)


def test_oversized_manifest_is_refused_before_parsing():
    with pytest.raises(ManifestError, match="limit"):
        parse(b" " * (MAX_MANIFEST_BYTES + 1))


@pytest.mark.parametrize(
    "path",
    ["../x", "a/../../x", "/etc/passwd", "a//b", "./a", "a/.", "", "a\\..\\b", "a\x00b", "x" * 2000, 5, None],
)
def test_paths_that_escape_are_refused(path):
    with pytest.raises(UnsafePathError):
        check_relative_path(path)
    d = good()
    if isinstance(path, str):
        d["checksums"]["files"][path] = {"size": 1, "digest": "0" * 32}
        with pytest.raises(UnsafePathError):
            Manifest.from_dict(d)


@pytest.mark.parametrize("path", ["a", "rng/rank-00000.json", "__0_0.distcp", ".metadata", "a/b/c..d"])
def test_plain_relative_paths_are_accepted(path):
    assert check_relative_path(path) == path
