"""The scripts' built texts kept on disk (rqueue/engine/text_cache.py): a
process reads what an earlier one built, a damaged or missing file costs
only the build, and the cache can be turned off."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from rqueue.engine import loader, text_cache

build = text_cache.script_texts.__wrapped__  # past the in-process memo: each call reads or builds


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    where = tmp_path / "cache"
    monkeypatch.setenv(text_cache.CACHE_ENV, str(where))
    return where


def only_file(where: Path) -> Path:
    (path,) = where.iterdir()
    return path


def test_the_first_build_is_written_and_the_next_process_reads_it(cache: Path) -> None:
    # given no cache yet, when the texts are built
    built = build(True)
    # then they are every script's texts per layout, as the loader builds them, and written
    assert built == {name: loader.layout_texts(name, True) for name in loader.SCRIPT_NAMES}
    path = only_file(cache)
    assert path.name == f"scripts-{text_cache.sources_digest()}-shebang.json"
    assert json.loads(path.read_text()) == built
    # when the file holds another text (to tell a read from a build), then the next process reads it
    kept = json.loads(path.read_text())
    kept["ack"]["hash"] = "-- read from the cache"
    path.write_text(json.dumps(kept))
    assert build(True)["ack"]["hash"] == "-- read from the cache"
    # and the texts without a shebang line are kept apart
    assert "#!lua" not in build(False)["publish"]["hash"]
    assert len(list(cache.iterdir())) == 2


@pytest.mark.parametrize("damage", ["{not json", '{"ack": {"hash": 1}}', "[]", ""])
def test_a_damaged_file_is_passed_over_and_written_again(cache: Path, damage: str) -> None:
    # given a cache file that does not parse or holds the wrong shape
    built = build(True)
    path = only_file(cache)
    path.write_text(damage)
    # when the texts are read, then they are built again, and the file holds them again
    assert build(True) == built
    assert json.loads(path.read_text()) == built


def test_a_file_no_process_read_for_a_month_is_deleted_when_another_is_written(cache: Path) -> None:
    # given two old cache files, one of them this build's (read now), and another version's
    build(True)
    current = only_file(cache)
    stale = cache / "scripts-0123456789abcdef0123456789abcdef-shebang.json"
    stale.write_text("{}")
    month = 31 * 86400
    for path in (current, stale):
        os.utime(path, (path.stat().st_mtime - month, path.stat().st_mtime - month))
    # when a process reads this build's file, then it is touched
    build(True)
    assert current.stat().st_mtime > stale.stat().st_mtime + month / 2
    # when another file is written (the texts without a shebang), then the stale one is deleted
    build(False)
    assert sorted(p.name.rsplit("-", 1)[1] for p in cache.iterdir()) == ["bare.json", "shebang.json"]
    assert not stale.exists()


def test_an_empty_setting_turns_the_cache_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(text_cache.CACHE_ENV, "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert text_cache.cache_dir() is None
    assert build(True)["publish"]["hash"] == loader.layout_texts("publish", True)["hash"]
    assert list(tmp_path.iterdir()) == []


def test_a_directory_that_cannot_be_written_only_costs_the_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a cache "directory" that is a file
    blocked = tmp_path / "blocked"
    blocked.write_text("a file")
    monkeypatch.setenv(text_cache.CACHE_ENV, str(blocked / "rqueue"))
    # when the texts are built, then they are, and nothing else changed
    assert build(True)["fetch"] == loader.layout_texts("fetch", True)
    assert blocked.read_text() == "a file"


def test_the_default_directory_is_under_the_users_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(text_cache.CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert text_cache.cache_dir() == tmp_path / "rqueue"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert text_cache.cache_dir() == tmp_path / "home" / ".cache" / "rqueue"


def test_a_changed_script_file_changes_the_digest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # given a copy of the scripts' folder
    copy = tmp_path / "lua"
    shutil.copytree(loader.lua_dir(), copy)
    monkeypatch.setattr(loader, "lua_dir", lambda: copy)
    before = text_cache.sources_digest()
    # when an include changes, then the digest does (a cache file of the old texts is not read)
    include = copy / "includes" / "settle.lua"
    include.write_text(include.read_text() + "\n-- changed\n")
    assert text_cache.sources_digest() != before
