"""The loader's ``--@layout`` blocks: each script is built once per log
layout, the hash layout's text without the stream layout's code; the
Scripts run the text of the layout of the keys a call is sent."""

from __future__ import annotations

import re

import pytest
from support.luatree import lua_tree

from rqueue.engine.loader import (
    LAYOUTS,
    SCRIPT_NAMES,
    drop_unused,
    expand_includes,
    layout_texts,
    select_layout,
    source,
)
from rqueue.engine.scripts import Script, Scripts, sent_stream_log

BLOCKS = "local a = 1\n--@layout stream\nlocal s = 2\n--@end\n  --@layout hash\n  local h = 3\n  --@end\nreturn a\n"


def test_a_block_is_kept_in_its_layouts_text_only():
    assert select_layout(BLOCKS, "hash", "x.lua") == "local a = 1\n  local h = 3\nreturn a\n"
    assert select_layout(BLOCKS, "stream", "x.lua") == "local a = 1\nlocal s = 2\nreturn a\n"
    assert select_layout("return 1", "hash", "x.lua") == "return 1"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (
            "--@layout stream\n--@layout hash\n--@end\n--@end\n",
            r"x\.lua:2: .*inside the --@layout stream block of line 1: blocks do not nest",
        ),
        ("--@layout stream\n--@layout stream\n--@end\n", r"x\.lua:2: .*do not nest"),
        (
            "--@layout cluster\nreturn 1\n--@end\n",
            r"x\.lua:1: --@layout 'cluster': unknown layout \(known: hash, stream\)",
        ),
        ("--@layout\nreturn 1\n--@end\n", r"x\.lua:1: --@layout '': unknown layout"),
        ("return 1\n--@layout stream\nreturn 2\n", r"x\.lua:2: --@layout stream is never closed"),
        ("return 1\n--@end\n", r"x\.lua:2: --@end with no --@layout block open"),
        ("--@layout hash\n--@end stream\n", r"x\.lua:2: --@end takes nothing"),
    ],
)
def test_bad_blocks_are_refused_with_the_file_and_line(text, error):
    for layout in LAYOUTS:
        with pytest.raises(ValueError, match=error):
            select_layout(text, layout, "x.lua")


def test_an_unknown_layout_asked_for_is_refused():
    with pytest.raises(ValueError, match="unknown layout 'list'"):
        select_layout("return 1\n", "list", "x.lua")


def test_a_block_is_closed_in_the_file_that_opens_it(tmp_path):
    # an include's block does not run on into the script that includes it
    root = lua_tree(tmp_path, "--@include half\n--@end\nreturn 1\n", half="--@layout stream\nlocal x = 1\n")
    with pytest.raises(ValueError, match=r"main\.lua:2: --@end with no --@layout block open"):
        expand_includes(root, "main", "hash")
    (root / "main.lua").write_text("--@include half\nreturn 1\n")
    with pytest.raises(ValueError, match=r"includes/half\.lua:1: --@layout stream is never closed"):
        expand_includes(root, "main", "stream")


def test_an_include_and_a_helper_needed_in_one_layout_only_stay_out_of_the_other(tmp_path):
    root = lua_tree(
        tmp_path,
        "--@include base\n--@layout stream\n--@include side\nreturn fromSide(1)\n--@end\nreturn common(1)\n",
        base="local function common(x)\n  return x\nend\n\nlocal function streamOnly(x)\n  return x\nend\n",
        side="--@include base\nlocal function fromSide(x)\n  return streamOnly(x)\nend\n",
    )
    hash_text = drop_unused(expand_includes(root, "main", "hash"))
    stream_text = drop_unused(expand_includes(root, "main", "stream"))
    assert "fromSide" not in hash_text and "streamOnly" not in hash_text and "common" in hash_text
    assert "fromSide" in stream_text and "streamOnly" in stream_text
    assert "--@" not in hash_text + stream_text


def test_every_script_is_built_per_layout_without_directives():
    for name in SCRIPT_NAMES:
        texts = layout_texts(name)
        assert set(texts) <= set(LAYOUTS) and "hash" in texts
        for text in texts.values():
            assert not re.search(r"^\s*--@(layout|end)\b", text, re.MULTILINE), name
        assert texts["hash"] == source(name, layout="hash")
        assert texts.get("stream", texts["hash"]) == source(name, layout="stream")


def test_the_hash_layouts_hot_scripts_hold_none_of_the_stream_code():
    # the stream log's writes, its side hash, the ack's layout check of a stream key
    publish = source("publish", layout="hash")
    for word in ("XTRIM", "local function logEntry", "local function logWriteEntries", "sideKey ~="):
        assert word not in publish, word
    assert "local function logWriteEntries" in source("publish", layout="stream")
    for name in ("ack", "fetch"):
        assert "LOG_STREAM_BYTE and last ==" not in source(name, layout="hash"), name  # sentSideKey's test
    # logReadMany's stream reads
    assert "XRANGE', key, from" not in source("fetch", layout="hash")
    assert "XRANGE', key, from" in source("fetch", layout="stream")
    assert "LOG_STREAM_BYTE and checkLayout" not in source("ack", layout="hash")
    # scripts that touch no log have one text for both
    assert set(layout_texts("pause")) == {"hash"}


def test_a_call_runs_the_text_of_its_keys_layout():
    assert sent_stream_log(["{q}:meta", "{q}:log", "{q}:floors"])
    assert sent_stream_log([b"{q}:meta", b"{q}:log"])
    assert not sent_stream_log(["{q}:meta", "{q}:msgs", "{q}:floors"])
    scripts = Scripts(None, shebang=False)  # type: ignore[arg-type]  # no call reaches Redis
    fetch = scripts.fetch
    assert isinstance(fetch.stream, Script)
    assert fetch.for_keys(["{q}:meta", "{q}:msgs"]) is fetch
    assert fetch.for_keys(["{q}:meta", "{q}:log"]) is fetch.stream
    assert fetch.stream.text == source("fetch", shebang=False, layout="stream")
    assert scripts.pause.stream is None
    by_name = scripts.by_name()
    assert by_name["fetch@stream"] is fetch.stream and "pause@stream" not in by_name
