"""Each Lua script called directly, with raw KEYS and ARGV, as a foreign
client would: the reply shapes and error codes in the script headers."""

from __future__ import annotations

import re
import time

import pytest
import redis
from support import callview, logview
from support.luatree import lua_tree
from support.refusals import nothing_changes

from rqueue.engine import commands
from rqueue.engine.keys import ACK_KEYS, ack_keys, call_keys_of, settle_keys, side_of
from rqueue.engine.loader import (
    LAYOUTS,
    SCRIPT_NAMES,
    drop_unused,
    expand_includes,
    lua_dir,
    make_lazy,
    select_layout,
    source,
)
from rqueue.engine.scripts import sent_stream_log
from rqueue.errors import InvalidInput, QueuePaused, from_script_error
from rqueue.settings import Settings
from rqueue.stored_results import Failure, Result
from rqueue.stored_results import decode as decode_result

NOW = 1_700_000_000_000
INC = "itest"  # the incarnation id the raw publishes offer


def group_argv(group="g", consumer="c1", now=NOW, settings=None, *extra):
    s = settings or Settings(ack_wait=10)
    before, after = commands.failure_policy(s, "orders")
    return [group, consumer, now, round(s.ack_wait * 1000), s.max_inflight, s.prefetch, f"{before}0.5{after}", *extra]


def ack_argv(consumer, strict, *tags):
    """ack.lua's ARGV: the group and consumer names alone of group_argv."""
    return ["g", consumer, strict, *tags]


class CommonFetch:
    """A client's scripts, whose fetch replies are read in the shape both
    layouts share: the stream text's call field (lua/fetch.lua, the seventh
    field; tests/test_range_acks.py checks it) is checked to be "" or
    "<first>:<last>" and left out."""

    def __init__(self, scripts):
        self._scripts = scripts

    def __getattr__(self, name):
        return getattr(self._scripts, name)

    def fetch(self, keys, args, client=None, stream=None):
        reply = self._scripts.fetch(keys, args, client, stream=stream)
        if client is not None or not sent_stream_log(keys) or not isinstance(reply, list):
            return reply
        field = reply[commands.FETCH_HEAD]
        assert field == b"" or re.fullmatch(rb"[1-9]\d*:[1-9]\d*", field), reply[:8]
        return reply[: commands.FETCH_HEAD] + reply[commands.FETCH_HEAD + 1 :]


@pytest.fixture
def raw(client, queue):
    """(redis, queue keys, group keys, scripts)"""
    return client.redis, queue.keys, queue.keys.group("g").as_list(), CommonFetch(client.scripts)


def compact(published_ms, payload):
    """A record in the compact form (lua/includes/record.lua)."""
    return b"~" + published_ms.to_bytes(6, "big") + payload


def publish(raw, *bodies, now=NOW, ids=None, delay=0, headers_len=0):
    """publish.lua with its raw layout: fixed KEYS, then one key per id."""
    r, qk, _, s = raw
    keys = qk.publish_keys()
    args = [now, 60_000, "0", "", INC]
    for i, b in enumerate(bodies):
        msg_id = (ids or [""] * len(bodies))[i]
        if msg_id:
            keys.append(qk.message_id(msg_id))
        args += [len(keys) if msg_id else 0, f"{delay}:{headers_len}" if headers_len else delay, b]
    return s.publish(keys=keys, args=args)


def test_every_script_has_the_header_contract():
    for name in SCRIPT_NAMES:
        text = (lua_dir() / f"{name}.lua").read_text()
        assert text.startswith("--[["), name
        header = text.split("]]", 1)[0]
        for section in ("Input:", "Output:"):
            assert section in header, f"{name}.lua header lacks {section}"
        assert "KEYS[" in header and "ARGV[" in header, name


# A command sent to a log key (the queue's or its dead-letter queue's): the
# key among the arguments of redis.call, redis.pcall, rcall, bulk or bulkGet.
_LOG_COMMAND = re.compile(r"\b(?:redis\.p?call|rcall|bulk|bulkGet)\([^)\n]*(?:\b(?:msgsKey|dlqMsgsKey)\b|KEYS\[2\])")
# A call on a Redis client or pipeline whose arguments name a .msgs key.
_LOG_CALL = re.compile(r"\b(?:r|pipe|redis|self\.r)\.\w+\([^)]*\.msgs\b")
# The in-flight count outside its helpers (store.deliveries_out, deliveriesOut()).
_LEASE_COUNT = re.compile(r"zcount\([^)]*lease")


def test_only_the_log_include_sends_commands_to_the_log():
    # Given every script and include but lua/includes/log.lua, log_one.lua and log_side.lua
    files = [p for p in lua_dir().rglob("*.lua") if p.name not in ("log.lua", "log_one.lua", "log_side.lua")]
    # When their commands are read, then none names a log key: a change of
    # the log's storage (docs/layout-d-plan.md) stays in one file.
    found = [f"{p.name}: {m.group(0)}" for p in files for m in _LOG_COMMAND.finditer(p.read_text())]
    assert not found
    for sent in ("rcall('HGET', msgsKey, seq)", "bulkGet(dlqMsgsKey, s)", 'redis.pcall("DEL", metaKey, msgsKey)'):
        assert _LOG_COMMAND.search(sent), sent
    # and fetch makes at every call only the log helpers of its common path
    # (logReadFlow: the picks of flow control): those of one record
    # (log_one.lua) only on its failure paths
    made = re.findall(r"^local function (log\w+)", source("fetch"), re.MULTILINE)
    assert made == ["logTrim", "logReadMany", "logReadFlow", "logAny", "logDelete"]


def test_only_the_client_log_module_sends_commands_to_the_log():
    # Given the package's Python files but rqueue/engine/log.py (and keys.py, which names the key)
    package = lua_dir().parent.parent
    mine = ("engine/log.py", "engine/keys.py")
    files = [p for p in package.rglob("*.py") if p.relative_to(package).as_posix() not in mine]
    # When their redis calls are read, then none is sent to a .msgs key, and
    # the in-flight count is read through one helper
    found = [f"{p.name}: {m.group(0)}" for p in files for m in _LOG_CALL.finditer(p.read_text())]
    assert not found
    counts = [p.name for p in files for _ in _LEASE_COUNT.finditer(p.read_text())]
    assert counts == ["store.py"]
    for sent in ("r.exists(below.meta, below.msgs)", "pipe.hdel(keys.msgs, *seqs)", "self.r.delete(keys.msgs)"):
        assert _LOG_CALL.search(sent), sent


def test_includes_expand_once_and_leave_no_directive():
    for name in SCRIPT_NAMES:
        text = source(name)
        assert "--@include" not in text
        assert len(re.findall(r"^local function settle\(", text, re.MULTILINE)) <= 1


def test_includes_keep_only_the_helpers_a_script_calls():
    # given helpers where "b" is called only by the unused "a", and "c" by the script
    text = (
        "local function a(x)\n  return b(x)\nend\n"
        "local function b(x)\n  return x\nend\n"
        "local function c(x)\n  local function inner()\n    return x\n  end\n  return inner()\nend\n"
        "return c(1)\n"
    )
    # then "a" goes, then "b" with it; "c" and its nested function stay whole
    assert (
        drop_unused(text)
        == "local function c(x)\n  local function inner()\n    return x\n  end\n  return inner()\nend\nreturn c(1)\n"
    )
    # a helper laid out otherwise is refused rather than cut at the wrong "end"
    for odd in (
        "local function unused(x) return x end\nlocal function used(x)\n  return x\nend\nreturn used(1)\n",
        "local function unused(x)\n  return [[\nend\n]]\nend\nreturn 1\n",
    ):
        with pytest.raises(ValueError, match="'unused' ends"):
            drop_unused(odd)
    # and in the real scripts every helper left is called somewhere
    for name in SCRIPT_NAMES:
        text = source(name)
        for helper in re.findall(r"^local function (\w+)", text, re.MULTILINE):
            assert len(re.findall(rf"\b{helper}\b", text)) > 1, (name, helper)


LAZY = (
    "--@lazy-begin slow\n"
    "local LIMIT = 3 -- a constant stays where it was\n"
    "-- doubles x\n"
    "local function double(x)\n  return x * LIMIT\nend\n"
    "local function twice(x)\n  return double(double(x))\nend\n"
    "--@lazy-end\n"
)


def test_lazy_helpers_are_defined_only_where_they_are_made():
    # given a lazy region of two helpers, made in a block of the script
    text = make_lazy(LAZY + "if ARGV[1] == 'slow' then\n  --@make slow\n  return twice(1)\nend\nreturn 0\n")
    # then the region leaves its constant and nil locals for the helpers
    top, block = text.split("if ARGV[1] == 'slow' then\n")
    assert (
        top
        == "local LIMIT = 3 -- a constant stays where it was\nlocal double, twice -- made where --@make slow stands\n"
    )
    # and the block defines them, comments kept, once per call, before it uses them
    assert block.startswith("  if double == nil then\n-- doubles x\nfunction double(x)\n")
    assert "function twice(x)\n  return double(double(x))\nend\n  end\n  return twice(1)\n" in block
    assert "local function" not in text


def test_lazy_helpers_run_on_the_server_only_on_the_path_that_makes_them(client):
    # given a script whose helpers are made on one path only
    lua = make_lazy(LAZY + "if ARGV[1] == 'slow' then\n  --@make slow\n  return twice(2)\nend\nreturn type(double)\n")
    # when it runs on each path, then the slow one has them and the other never built them
    assert client.redis.eval(lua, 0, "slow") == 18
    assert client.redis.eval(lua, 0, "fast") == b"nil"


def test_lazy_regions_refuse_what_would_read_the_wrong_variable():
    # a helper named above its region would be a global there
    with pytest.raises(ValueError, match="double named above the region"):
        make_lazy("local x = double\n" + LAZY + "--@make slow\n")
    # a block local with the name of a top-level local the helpers read would be read instead
    with pytest.raises(ValueError, match="LIMIT would be read from the enclosing block"):
        make_lazy(LAZY + "for _, LIMIT in ipairs({1}) do\n  --@make slow\nend\n")
    with pytest.raises(ValueError, match="LIMIT would be read"):
        make_lazy(LAZY + "if true then\n  local LIMIT = 1\n  --@make slow\nend\n")
    # a block that has ended does not count
    assert "if double == nil" in make_lazy(
        LAZY + "if true then\n  local LIMIT = 1\nend\nif true then\n  --@make slow\nend\n"
    )
    # a region never made, or a make without its region
    with pytest.raises(ValueError, match="no --@make"):
        make_lazy(LAZY)
    with pytest.raises(ValueError, match="no --@lazy other"):
        make_lazy(LAZY + "--@make slow\n--@make other\n")
    with pytest.raises(ValueError, match="no --@lazy slow region above"):
        make_lazy("--@make slow\n" + LAZY + "--@make slow\n")


def test_names_in_comments_do_not_keep_a_helper():
    # a helper named only in a comment goes; "--" inside a string starts no comment
    assert drop_unused("-- unused(1) is named here only\nlocal function unused(x)\n  return x\nend\nreturn 1\n") == (
        "-- unused(1) is named here only\nreturn 1\n"
    )
    kept = "local function used(x)\n  return x\nend\nreturn '--' .. used(1)\n"
    assert drop_unused(kept) == kept


BASE = "local BASE = 2\nlocal function double(x)\n  return x * BASE\nend\n"
QUAD = "--@include base\nlocal function quad(x)\n  return double(double(x))\nend\n"
TWICE = "--@include base\nlocal function twice(x)\n  return double(x) * 2\nend\n"


def test_a_prerequisite_is_expanded_once_before_the_includes_that_need_it(tmp_path):
    # given two includes that both include base, and a script that names base itself too
    root = lua_tree(
        tmp_path,
        "--@include quad\n--@include twice\n--@include base\nreturn quad(1) + twice(1)\n",
        base=BASE,
        quad=QUAD,
        twice=TWICE,
    )
    text = expand_includes(root, "main")
    # then base's text stands once, before its first user, and every directive is gone
    assert text.count("local function double(") == 1
    assert (
        text.index("local function double(") < text.index("local function quad(") < text.index("local function twice(")
    )
    assert "--@include" not in text


def test_a_cycle_of_includes_or_a_missing_one_is_refused(tmp_path):
    root = lua_tree(
        tmp_path,
        "--@include a\n--@include missing\nreturn 1\n",
        a="--@include b\nlocal A = 1\n",
        b="--@include c\nlocal B = 1\n",
        c="--@include a\nlocal C = 1\n",
    )
    with pytest.raises(ValueError, match=r"includes/c.lua: --@include a: the includes form a cycle, a -> b -> c -> a"):
        expand_includes(root, "main")
    (root / "includes" / "c.lua").write_text("local C = 1\n")
    with pytest.raises(ValueError, match="there is no includes/missing.lua"):
        expand_includes(root, "main")


def test_an_include_names_what_it_needs_before_its_code(tmp_path):
    late = "local function late(x)\n  return double(x)\nend\n--@include base\n"
    root = lua_tree(tmp_path, "--@include late\nreturn late(1)\n", base=BASE, late=late)
    with pytest.raises(ValueError, match="includes/late.lua: '--@include base' stands after code"):
        expand_includes(root, "main")


def test_a_prerequisite_first_needed_in_a_lazy_region_is_made_with_it(client, tmp_path):
    # given a lazy region whose include needs base, which nothing named before the region
    script = (
        "--@lazy slow quad\nif ARGV[1] == 'slow' then\n  --@make slow\n  return quad(1)\nend\nreturn type(double)\n"
    )
    root = lua_tree(tmp_path, script, base=BASE, quad=QUAD)
    lua = make_lazy(drop_unused(expand_includes(root, "main")))
    # then base lands in the region: its constant stays at the top, its helper is made with quad, before it
    assert lua.startswith("local BASE = 2\n")
    assert "local double, quad -- made where --@make slow stands\n" in lua
    assert "local function" not in lua
    assert client.redis.eval(lua, 0, "slow") == 4
    assert client.redis.eval(lua, 0, "fast") == b"nil"
    # named before the region, base stays eager and the region makes quad alone
    root = tmp_path / "eager"
    root.mkdir()
    lua = make_lazy(
        drop_unused(expand_includes(lua_tree(root, "--@include base\n" + script, base=BASE, quad=QUAD), "main"))
    )
    assert "local function double(" in lua
    assert "local quad -- made where --@make slow stands\n" in lua
    assert client.redis.eval(lua, 0, "fast") == b"function"


def test_helpers_that_landed_in_a_lazy_region_or_a_block_are_not_reached_from_elsewhere(tmp_path):
    includes = {"base": BASE, "quad": QUAD, "twice": TWICE}

    def expand(script):
        root = tmp_path / f"t{len(list(tmp_path.iterdir()))}"
        root.mkdir()
        return expand_includes(lua_tree(root, script, **includes), "main")

    region = "--@lazy slow quad\n"
    # eager code after the region that needs base, which the region made lazy
    with pytest.raises(ValueError, match=r"main.lua needs base, which includes/quad.lua brought into --@lazy slow"):
        expand(region + "--@include base\nreturn double(1)\n")
    with pytest.raises(ValueError, match=r"includes/twice.lua needs base, .* exist only after --@make slow"):
        expand(region + "--@include twice\nreturn twice(1)\n")
    # the same after a --@make of the region, in the same block: the helpers exist there
    assert "function twice(" in expand(
        region + "if ARGV[1] == 'slow' then\n  --@make slow\n--@include twice\n  return twice(1)\nend\nreturn 0\n"
    )
    # but not after a make in a block that has ended, or in another branch
    with pytest.raises(ValueError, match="exist only after --@make slow"):
        expand(region + "if ARGV[1] == 'slow' then\n  --@make slow\nend\n--@include twice\nreturn twice(1)\n")
    with pytest.raises(ValueError, match="exist only after --@make slow"):
        expand(region + "if ARGV[1] then\n  --@make slow\nelse\n--@include twice\n  return twice(1)\nend\n")
    # nor from another region
    with pytest.raises(ValueError, match="includes/twice.lua needs base"):
        expand(region + "--@lazy other twice\n--@make slow\n--@make other\n")
    # an include expanded inside a block of the script has block locals, so the top level cannot reach them
    with pytest.raises(ValueError, match="needs base, which main.lua expanded inside a block"):
        expand("if ARGV[1] then\n--@include base\n  return double(1)\nend\n--@include quad\nreturn quad(1)\n")
    # a region stands at the top level, and once per name unless the second adds nothing
    with pytest.raises(ValueError, match="--@lazy slow stands in a block"):
        expand("if ARGV[1] then\n" + region + "end\n")
    assert expand(region + "--@lazy slow base\n--@make slow\n").count("--@lazy-begin slow") == 1
    with pytest.raises(ValueError, match="--@lazy slow stands twice, the second time with twice"):
        expand(region + "--@lazy slow twice\n--@make slow\n")


def test_a_lazy_region_refuses_top_level_code_that_calls_its_helpers():
    # the region's own code runs where it stands, before any --@make
    with pytest.raises(ValueError, match="--@lazy slow: its top-level code names double, still nil there"):
        make_lazy(LAZY.replace("--@lazy-end\n", "local SIX = double(2)\n--@lazy-end\n") + "--@make slow\n")


def test_ack_reads_no_key_past_the_ones_it_is_sent():
    # ack.lua is sent the first ACK_KEYS of the group layout; the names of the
    # rest are nil there, so no path of it may use them
    text = re.sub(r"--\[\[.*?\]\]|--[^\n]*", "", source("ack"), flags=re.DOTALL)  # the code, not its comments
    for late in ("beatsKey", "dlqMetaKey", "dlqMsgsKey", "eventsKey"):
        assert re.findall(rf"\b{late}\b", text) == [late], late  # its declaration alone
    assert re.search(rf"^local eventsKey = KEYS\[{ACK_KEYS + 4}\]$", text, re.MULTILINE)


def test_fetch_makes_its_failure_paths_only_where_they_are_taken():
    text = source("fetch")
    assert not re.search(r"^\s*--@(make|lazy)", text, re.MULTILINE)
    # none of the helpers of a failure is built by the plain fetch's top level
    for helper in ("deadLetter", "retryOrDeadLetter", "parseDelivery", "splitRecord"):
        assert not re.search(rf"^local function {helper}\(", text, re.MULTILINE), helper
    assert text.count("if parseDelivery == nil then") == 7


def test_publish_reply_is_seq_and_duplicate_flag(raw):
    assert publish(raw, b"a", b"b", ids=["x", "x"]) == [INC.encode(), 1, 0, 1, 1]
    r, qk, _, _ = raw
    assert logview.record(r, qk, 1) == compact(NOW, b"a")  # no headers, no delay
    # an explicit (test) time: the TTL is only cleanup, a day past the window
    assert (
        r.get(qk.message_id("x")) == b"1:%d:itest" % (NOW + 60_000)
        and 60_000 < r.pttl(qk.message_id("x")) <= 60_000 + 86_400_000
    )


def test_publish_batch_judges_a_repeated_id_as_separate_publishes_would(raw):
    # Seqs are assigned in one pass and written at the end; an id repeated
    # in the batch, or already stored, must come out as with one call each.
    r, qk, _, s = raw
    keys = qk.publish_keys() + [qk.message_id("x"), qk.message_id("x"), qk.message_id("y")]
    args = [NOW, 60_000, "0", "", INC, 6, 0, b"a", 0, 250, b"b", 7, 0, b"c", 8, 0, b"d"]
    assert s.publish(keys=keys, args=args) == [b"itest", 1, 0, 2, 0, 1, 1, 3, 0]
    assert r.hget(qk.meta, "seq") == b"3" and logview.count(r, qk) == 3
    assert logview.record(r, qk, 2) == b"%d:%d:0:b" % (NOW + 250, NOW) and r.zscore(qk.sched, 2) == NOW + 250
    assert r.get(qk.message_id("y")) == b"3:%d:itest" % (NOW + 60_000)
    # the next call sees the stored ids
    assert s.publish(keys=keys, args=args) == [b"itest", 1, 1, 4, 0, 1, 1, 3, 1]
    # a window of 0 remembers nothing: the repeat is a new message, and the
    # id key ends with the later seq
    assert s.publish(keys=keys, args=[NOW + 10**9, 0] + args[2:]) == [b"itest", 5, 0, 6, 0, 7, 0, 8, 0]
    assert r.get(qk.message_id("x")) == b"7:%d:itest" % (NOW + 10**9)


def test_publish_keeps_the_text_form_for_headers_and_for_a_time_past_6_bytes(raw):
    r, qk, _, _ = raw
    publish(raw, b'{"k":"v"}a', headers_len=9)
    assert logview.record(r, qk, 1) == b':%d:9:{"k":"v"}a' % NOW
    publish(raw, b'{"k":"v"}c', delay=500, headers_len=9)
    assert logview.record(r, qk, 2) == b'%d:%d:9:{"k":"v"}c' % (NOW + 500, NOW)
    publish(raw, b"b", now=2**48)
    assert logview.record(r, qk, 3) == b":%d:0:b" % 2**48


def test_publish_delayed_records_not_before(raw):
    publish(raw, b"a", delay=500)
    r, qk, _, _ = raw
    assert logview.record(r, qk, 1) == b"%d:%d:0:a" % (NOW + 500, NOW)
    assert r.zscore(qk.sched, 1) == NOW + 500


def test_publish_mandatory_without_group_is_refused(raw):
    r, qk, _, s = raw
    with pytest.raises(redis.ResponseError, match="^RQ_UNROUTABLE"):
        s.publish(keys=qk.publish_keys(), args=[NOW, 1000, "1", "", INC, 0, 0, b"a"])
    assert r.hget(qk.meta, "seq") is None


def test_join_then_fetch_reply_shape(raw):
    r, qk, gk, s = raw
    publish(raw, b"a")
    assert s.join(keys=gk, args=group_argv()) == [1, 1, b"itest"]
    assert s.join(keys=gk, args=group_argv()) == [0, 0, b"itest"]
    reply = s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 10, "t1"))
    assert reply == [NOW, b"", b"itest", 1, b"0", b"1", 1, 1, compact(NOW, b"a")]  # floor 0, generation 1, as stored
    assert r.zscore(gk[5], 1) == NOW + 10_000
    assert r.hget(gk[8], 1) == b"1:c1:%d:%d:t1" % (NOW, NOW)


def test_fetch_moves_the_cursor_past_the_last_seq_it_read(raw):
    # The cursor is written from the last field string the scan read: past
    # a deleted record, and over the many-digit fields of a long scan.
    r, qk, gk, s = raw
    publish(raw, *[b"m"] * 130)
    s.join(keys=gk, args=group_argv())
    assert logview.delete(r, qk, 3) == 1
    # when fetches read 3 seqs (one deleted) and then 120
    assert [x for x in s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 2, "t1"))[6::3]] == [1, 2]
    assert r.hget(gk[4], "cursor") == b"2"
    reply = s.fetch(keys=gk, args=group_argv("g", "c1", NOW, Settings(ack_wait=10, prefetch=200), 120, "t1"))
    # then the cursor is the last seq each read, in its plain form
    assert reply[6::3] == list(range(4, 124)) and r.hget(gk[4], "cursor") == b"123"


def test_a_small_fetch_reads_records_first_and_the_last_seq_only_at_a_gap(raw):
    # A fetch of up to SPECULATE_MAX (8) reads the records before the last
    # seq: a missing record is then either gone (passed over) or not yet
    # published (the cursor stays before it).
    r, qk, gk, s = raw
    publish(raw, b"a", b"b", b"c")
    s.join(keys=gk, args=group_argv())
    assert logview.delete(r, qk, 2) == 1

    def fetch(n):
        return s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, n, "t1"))[6::3]

    # when fetches of 1 reach the deleted record and then the end of the queue
    assert fetch(1) == [1] and fetch(1) == [3] and r.hget(gk[4], "cursor") == b"3"
    # then past the end nothing is claimed and the cursor stays put
    assert fetch(1) == [] and fetch(5) == [] and r.hget(gk[4], "cursor") == b"3"
    # and a message published since is the next one claimed
    publish(raw, b"d", b"e")
    assert fetch(8) == [4, 5] and r.hget(gk[4], "cursor") == b"5"


@pytest.mark.parametrize(
    "micros, ms", [("0", "000"), ("5", "000"), ("999", "000"), ("1000", "001"), ("123456", "123"), ("999999", "999")]
)
def test_the_server_clock_reads_as_the_same_ms_in_number_and_text(raw, micros, ms):
    # given TIME's two strings (stood in for: a script cannot stub TIME)
    r = raw[0]
    text = (lua_dir() / "includes" / "read_now.lua").read_text()
    assert text.count("redis.call('TIME')") == 1
    text = text.replace("redis.call('TIME')", "{'1700000000', ARGV[1]}")
    # when readNow reads them, then the text is the number's plain form
    assert r.eval(text + "\nlocal now, s = readNow('')\nreturn {now, s}", 0, micros) == [
        int("1700000000" + ms),
        b"1700000000" + ms.encode(),
    ]


def test_fetch_on_the_server_clock_writes_one_time_everywhere(raw):
    r, qk, gk, s = raw
    publish(raw, b"a")
    s.join(keys=gk, args=group_argv())
    # when a fetch reads the server's TIME (ARGV[3] empty)
    reply = s.fetch(keys=gk, args=group_argv("g", "c1", "", None, 1, "t1"))
    now = reply[0]
    # then the reply, the delivery state and the lease agree on it
    assert abs(now - time.time() * 1000) < 60_000
    assert r.hget(gk[8], 1) == b"1:c1:%d:%d:t1" % (now, now) and r.zscore(gk[5], 1) == now + 10_000


def test_fetch_finds_a_redelivery_or_a_due_message_in_whichever_set_alone_holds_it(raw):
    # fetch reads the ready and delay sets only when one of them exists
    r, qk, gk, s = raw
    publish(raw, b"a", b"b")
    s.join(keys=gk, args=group_argv())
    assert s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 2, "t1"))[6::3] == [1, 2]
    # when 1 is offered again at once: the ready set alone exists
    s.nack(keys=gk, args=group_argv("g", "c1", NOW, None, 1, 1, "t1", "0", ""))
    assert r.exists(gk[6]) and not r.exists(gk[7])
    # then a fetch finds it there
    assert s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 10, "t2"))[6:] == [1, 2, compact(NOW, b"a")]
    # when 2 is offered again after 500 ms: the delay set alone exists
    s.nack(keys=gk, args=group_argv("g", "c1", NOW, None, 2, 1, "t1", "500", ""))
    assert not r.exists(gk[6]) and r.exists(gk[7])
    # then a fetch waits for it, and finds it once due
    reply = s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 10, "t3"))
    assert reply == [NOW, NOW + 500, b"itest", 2, b"0", b"1"]
    assert s.fetch(keys=gk, args=group_argv("g", "c1", NOW + 500, None, 10, "t4"))[6:] == [2, 2, compact(NOW, b"b")]
    assert not r.exists(gk[6]) and not r.exists(gk[7])


def test_fetch_idle_reply_gives_next_due_time(raw):
    _, _, gk, s = raw
    publish(raw, b"a", delay=700)
    s.join(keys=gk, args=group_argv())
    reply = s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 10, "t1"))
    assert reply == [NOW, NOW + 700, b"itest", 1, b"0", b"1"]


def test_fetch_that_passed_over_its_bound_of_delayed_messages_is_due_now(raw):
    # given more delayed messages than one call passes over (SCAN_LIMIT, 1000), then a ready one
    _, _, gk, s = raw
    for _ in range(2):
        publish(raw, *[b"later"] * 600, delay=700)
    publish(raw, b"now")
    s.join(keys=gk, args=group_argv())
    # when a fetch passes over the first 1000 and stops, then its next due time is now
    assert s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 10, "t1")) == [NOW, NOW, b"itest", 1201, b"0", b"1"]
    # and the next call passes over the rest and hands out the ready message
    reply = s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 10, "t2"))
    assert reply[6:] == [1201, 1, reply[8]] and reply[8].endswith(b"now")
    # and once nothing is left to pass over, the next due time is the first delayed message's
    reply = s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 10, "t3"))
    assert reply == [NOW, NOW + 700, b"itest", 1201, b"0", b"1"]


def test_fetch_that_passed_over_its_bound_takes_no_waiter_role(raw):
    # given more delayed messages than one call passes over, and a consumer that waits in Redis
    r, qk, gk, s = raw
    publish(raw, *[b"later"] * 1001, delay=700)
    s.join(keys=gk, args=group_argv())
    # when its fetch (sent as -n: it would wait if it brought nothing) stops at the bound
    reply = s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, -10, "t1"))
    # then it is due now, not "w...": the client asks again at once rather than waiting in Redis
    assert reply[:2] == [NOW, NOW]
    assert r.hget(qk.meta, "wake") is None


def test_fetch_by_non_member_is_refused(raw):
    _, _, gk, s = raw
    with pytest.raises(redis.ResponseError, match="^RQ_NOT_MEMBER"):
        s.fetch(keys=gk, args=group_argv("g", "nobody", NOW, None, 10, "t1"))


def test_ack_strict_and_lenient_statuses(raw):
    _, _, gk, s = raw
    publish(raw, b"a", b"b")
    s.join(keys=gk, args=group_argv())
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 10, "t1"))
    with pytest.raises(redis.ResponseError, match=r"^RQ_UNKNOWN_TAG 9\.1\.t1$"):
        s.ack(keys=ack_keys(gk), args=ack_argv("c1", "1", 1, 1, "t1", 9, 1, "t1"))
    assert s.ack(keys=ack_keys(gk), args=ack_argv("c1", "0", 1, 1, "t1", 9, 1, "t1", 1, 1, "t1")) == [
        b"ok",
        b"RQ_UNKNOWN_TAG",
        b"RQ_ACKED",
    ]
    with pytest.raises(redis.ResponseError, match=r"^RQ_ACKED 1\.1\.t1$"):
        s.ack(keys=ack_keys(gk), args=ack_argv("c1", "1", 1, 1, "t1"))
    with pytest.raises(redis.ResponseError, match=r"^RQ_NOT_HELD 2\.1\.t1$"):
        s.ack(keys=ack_keys(gk), args=ack_argv("c2", "1", 2, 1, "t1"))


def test_ack_accepts_a_seq_or_count_written_another_way(raw):
    # The script looks states up under the strings it is sent; "01" must
    # still find (and settle) the state kept under "1".
    r, qk, gk, s = raw
    publish(raw, b"a", b"b")
    s.join(keys=gk, args=group_argv())
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 10, "t1"))
    assert s.ack(keys=ack_keys(gk), args=ack_argv("c1", "0", "01", "1", "t1", "2", "01", "t1")) == [b"ok", b"ok"]
    # (no state at all when the fetches were call records: a stream log's)
    assert set(r.hkeys(gk[8])) <= {b"pin"} and r.zrangebyscore(gk[5], "-inf", "(+inf") == []
    assert logview.count(r, qk) == 0 and callview.calls_of(r, gk) == {}
    assert r.hget(gk[2], "g") == b"2"


def test_ack_writes_the_floor_and_counts_as_plain_numbers_however_many_it_settles(raw):
    # An ack of the next seq writes the floor (and, with one group, trimmed)
    # from the string it was sent, and a single ack its counts as strings; a
    # floor carried on by the acked runs, acks sent out of order and a batch,
    # from numbers. Either way: plain numbers.
    r, qk, gk, s = raw
    publish(raw, b"a", b"b", b"c", b"d", b"e", b"f")
    s.join(keys=gk, args=group_argv())
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 10, "t1"))

    def ack(*pairs):
        tags = [x for i in range(0, len(pairs), 2) for x in (pairs[i], pairs[i + 1], "t1")]
        return s.ack(keys=ack_keys(gk), args=ack_argv("c1", "1", *tags))

    def floor_and_trimmed():
        return r.hget(qk.floors, "g"), r.hget(qk.meta, "trimmed")

    # when the next seq is acked, written another way
    assert ack("01", 1) == [b"ok"]
    # then the floor is its plain form, and the holder's and group's counts moved by one
    assert floor_and_trimmed() == (b"1", b"1")
    assert r.hget(gk[10], "c1") == b"5" and r.hget(gk[4], "acked") == b"1"
    # when a later seq is acked first, it waits in the acked runs
    assert ack(3, 1) == [b"ok"]
    assert floor_and_trimmed() == (b"1", b"1") and r.zrange(gk[9], 0, -1, withscores=True) == [(b"3", 3.0)]
    # when the gap is acked, the floor passes the waiting seq too
    assert ack(2, 1) == [b"ok"]
    assert floor_and_trimmed() == (b"3", b"3") and r.zcard(gk[9]) == 0
    # when several are acked out of order in one call
    assert ack(6, 1, "05", 1, 4, 1) == [b"ok", b"ok", b"ok"]
    assert floor_and_trimmed() == (b"6", b"6") and logview.count(r, qk) == 0
    assert r.hget(gk[10], "c1") == b"0" and r.hget(gk[4], "acked") == b"6"


def held_by_c1(raw, n):
    """Publishes n messages that consumer c1 of group g then holds; returns
    ack(*seqs), which acks those seqs (first deliveries) in one strict call."""
    _, _, gk, s = raw
    publish(raw, *[b"m%d" % i for i in range(1, n + 1)])
    s.join(keys=gk, args=group_argv())
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, n, "t1"))

    def ack(*seqs):
        tags = [x for seq in seqs for x in (seq, 1, "t1")]
        return s.ack(keys=ack_keys(gk), args=ack_argv("c1", "1", *tags))

    return ack


def test_acks_above_a_held_message_are_kept_as_runs_that_the_floor_passes_in_one_step(raw):
    # The acked key holds runs of contiguous seqs (first seq -> last seq as
    # its score), merged as they meet; the group hash counts their seqs.
    r, qk, gk, s = raw
    ack = held_by_c1(raw, 12)

    def runs():
        return [(int(m), int(e)) for m, e in r.zrange(gk[9], 0, -1, withscores=True)]

    def above():
        return int(r.hget(gk[4], "acked_above") or 0)

    # given seq 1 held, when 3..5 are acked in one call and 8 alone
    assert ack(4, 3, 5) == [b"ok"] * 3
    assert ack(8) == [b"ok"]
    # then they are two runs, counted as four seqs, and the floor stays
    assert runs() == [(3, 5), (8, 8)] and above() == 4 and r.hget(qk.floors, "g") == b"0"
    # when 6 is acked, the run below takes it; when 7, the two runs become one
    ack(6)
    assert runs() == [(3, 6), (8, 8)]
    ack(7)
    assert runs() == [(3, 8)] and above() == 6
    # when 10 then 9 are acked, 9 joins both the run below and the one above
    ack(10)
    ack(9)
    assert runs() == [(3, 10)] and above() == 8
    # when an acked seq inside a run is acked again, it is named as acked and nothing changes
    assert s.ack(keys=ack_keys(gk), args=ack_argv("c1", "0", 9, 1, "t1")) == [b"RQ_ACKED"]
    assert runs() == [(3, 10)] and above() == 8
    assert ack(12) == [b"ok"] and runs() == [(3, 10), (12, 12)]
    # when 2 is acked, the floor stays below the held seq 1 and 2 joins the run
    ack(2)
    assert runs() == [(2, 10), (12, 12)] and above() == 10 and r.hget(qk.floors, "g") == b"0"
    # when 1 is acked, the floor passes the whole run in one step, not the next
    ack(1)
    assert r.hget(qk.floors, "g") == b"10" and r.hget(qk.meta, "trimmed") == b"10"
    assert runs() == [(12, 12)] and above() == 1
    # when 11 is acked, the floor passes the last run too and nothing is kept
    ack(11)
    assert r.hget(qk.floors, "g") == b"12" and runs() == [] and above() == 0 and logview.count(r, qk) == 0


def test_a_tag_whose_seq_is_no_whole_number_is_unknown_next_to_acked_runs(raw):
    r, qk, gk, s = raw
    ack = held_by_c1(raw, 4)
    # given a run 2..3 above the floor
    ack(2, 3)
    # when tags are sent whose seq is NaN, infinite, fractional or past 2^63
    for seq in ("nan", "inf", "2.5", "1e19"):
        # then each is an unknown tag, and the run is as it was
        assert s.ack(keys=ack_keys(gk), args=ack_argv("c1", "0", seq, 1, "t1")) == [b"RQ_UNKNOWN_TAG"], seq
    assert r.zrange(gk[9], 0, -1, withscores=True) == [(b"2", 3.0)] and r.hget(gk[4], "acked_above") == b"2"


def test_acks_out_of_order_in_one_call_make_runs_and_move_the_floor_over_them(raw):
    r, qk, gk, s = raw
    ack = held_by_c1(raw, 10)

    # given a run 5..6 acked before
    ack(6, 5)
    # when 1, 2 and 4 (joining the run from below), 8 and 10 come in one call, out of order
    assert ack(10, 2, 8, 4, 1) == [b"ok"] * 5
    # then the floor passes 1..2 and the rest are runs apart from each other
    assert r.hget(qk.floors, "g") == b"2"
    assert r.zrange(gk[9], 0, -1, withscores=True) == [(b"4", 6.0), (b"8", 8.0), (b"10", 10.0)]
    assert r.hget(gk[4], "acked_above") == b"5"
    # when 3, 7 and 9 come in one call, the floor passes everything
    assert ack(9, 3, 7) == [b"ok"] * 3
    assert r.hget(qk.floors, "g") == b"10" and r.zcard(gk[9]) == 0 and r.hget(gk[4], "acked_above") == b"0"


def test_a_single_tag_is_judged_as_it_would_be_among_others(raw):
    # one tag held by its consumer with no history takes a shorter path; any
    # other single tag must come out exactly as in a batch
    r, qk, gk, s = raw
    publish(raw, b"a", b"b", b"c", b"d")
    s.join(keys=gk, args=group_argv())
    s.join(keys=gk, args=group_argv("g", "c2"))
    assert s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 3, "t1"))[6::3] == [1, 2, 3]
    # 2 ran out and went to c2; 3 ran out and came back to c1 (a history)
    later = NOW + 10_001
    r.zadd(gk[5], {"1": later + 10_000, "3": later + 10_000})
    assert s.fetch(keys=gk, args=group_argv("g", "c2", later, None, 1, "t2"))[6::3] == [2]
    r.zadd(gk[5], {"3": NOW})
    assert s.fetch(keys=gk, args=group_argv("g", "c1", later, None, 1, "t3"))[6::3] == [3]
    assert r.hget(gk[8], 3) == b"2:c1:%d:%d:t3\n1=c1=t1" % (NOW, later)

    def ack(consumer, seq, count, token):
        return s.ack(keys=ack_keys(gk), args=ack_argv(consumer, "0", seq, count, token))

    # then a tag of another consumer, a count never delivered, an unknown
    # seq and another token are refused, and c1 still holds what it held
    assert ack("c2", 1, 1, "t1") == [b"RQ_NOT_HELD"] and ack("c1", 1, 2, "t1") == [b"RQ_UNKNOWN_TAG"]
    assert ack("c1", 9, 1, "t1") == [b"RQ_UNKNOWN_TAG"] and ack("c1", "pin", 1, "t1") == [b"RQ_UNKNOWN_TAG"]
    assert ack("c1", 1, 1, "t2") == [b"RQ_UNKNOWN_TAG"] and ack("c1", 3, 2, "t1") == [b"RQ_UNKNOWN_TAG"]
    assert ack("c1", 2, 1, "t2") == [b"RQ_NOT_HELD"]
    assert r.hget(gk[10], "c1") == b"2" and r.hget(gk[10], "c2") == b"1"
    # a late ack of c1's earlier delivery of 2 is stale: c2 holds it now; c2's ack settles it
    assert ack("c1", 2, 1, "t1") == [b"RQ_STALE"] and r.hget(gk[10], "c2") == b"1"
    assert ack("c2", 2, 2, "t2") == [b"ok"] and r.hget(gk[10], "c2") == b"0"
    # c1's current deliveries settle whether they have a history or not
    assert ack("c1", 3, 2, "t3") == [b"ok"] and ack("c1", 1, 1, "t1") == [b"ok"]
    assert r.hget(gk[10], "c1") == b"0" and ack("c1", 1, 1, "t1") == [b"RQ_ACKED"]
    assert r.hget(qk.floors, "g") == b"3" and r.hget(gk[4], "acked") == b"3" and r.hkeys(gk[8]) == [b"pin"]


def test_ack_of_no_tags_and_of_more_tags_than_one_chunk(raw):
    # HMGET and the rest go in chunks of 1000 fields; one chunk is read as is
    r, qk, gk, s = raw
    big = Settings(ack_wait=10, prefetch=2000, max_inflight=2000)
    publish(raw, *[b"m"] * 1500)
    s.join(keys=gk, args=group_argv())
    # when nothing is acked, nothing is changed
    assert s.ack(keys=ack_keys(gk), args=ack_argv("c1", "1")) == []
    # when 1500 deliveries of one fetch are acked in one call
    assert s.fetch(keys=gk, args=group_argv("g", "c1", NOW, big, 1500, "t1"))[6::3] == list(range(1, 1501))
    tags = [x for seq in range(1, 1501) for x in (seq, 1, "t1")]
    assert s.ack(keys=ack_keys(gk), args=ack_argv("c1", "1", *tags)) == [b"ok"] * 1500
    # then every one is settled
    assert r.hget(qk.floors, "g") == b"1500" and logview.count(r, qk) == 0 and set(r.hkeys(gk[8])) <= {b"pin"}
    assert callview.calls_of(r, gk) == {} and r.hget(gk[4], "callout") in (None, b"0")


def test_fetch_acks_the_tags_it_is_given_first(raw):
    r, qk, gk, s = raw
    publish(raw, b"a", b"b", b"c")
    one = Settings(ack_wait=10, prefetch=1)
    s.join(keys=gk, args=group_argv())
    assert s.fetch(keys=gk, args=group_argv("g", "c1", NOW, one, 5, "t1")) == [
        NOW,
        b"",
        b"itest",
        3,
        b"0",  # the group's ack floor
        b"1",  # its generation
        1,
        1,
        compact(NOW, b"a"),
    ]
    # the ack frees the one prefetch slot for this same fetch; a bad tag gets its code
    reply = s.fetch(keys=gk, args=group_argv("g", "c1", NOW, one, 5, "t2", 1, 1, "t1", 9, 1, "t1"))
    assert reply == [NOW, b"", b"itest", 3, 1, b"1", b"ok", b"RQ_UNKNOWN_TAG", 2, 1, compact(NOW, b"b")]
    assert r.hget(gk[2], "g") == b"1" and not r.hexists(gk[8], 1) and logview.count(r, qk) == 2
    # a non-member's call changes nothing, its tags included
    with pytest.raises(redis.ResponseError, match="^RQ_NOT_MEMBER"):
        s.fetch(keys=gk, args=group_argv("g", "nobody", NOW, None, 5, "t3", 2, 1, "t2"))
    assert r.hexists(gk[8], 2) and r.zscore(gk[5], 2) == NOW + 10_000


def test_fetch_acks_a_single_tag_sent_with_it_as_ack_would(raw):
    r, qk, gk, s = raw
    publish(raw, b"a", b"b", b"c")
    one = Settings(ack_wait=10, prefetch=1)
    s.join(keys=gk, args=group_argv())
    assert s.fetch(keys=gk, args=group_argv("g", "c1", NOW, one, 1, "t1"))[6::3] == [1]
    # when the held delivery is acked with the next fetch, it frees the slot
    assert s.fetch(keys=gk, args=group_argv("g", "c1", NOW, one, 1, "t2", 1, 1, "t1"))[6:8] == [b"ok", 2]
    assert r.hget(qk.floors, "g") == b"1" and r.hget(gk[10], "c1") == b"1"
    # when the single tag is a count never delivered, or has another token,
    # it gets its code and the slot stays taken
    for tag in ((2, 2, "t2"), (2, 1, "t1")):
        reply = s.fetch(keys=gk, args=group_argv("g", "c1", NOW, one, 1, "t3", *tag))
        assert reply == [NOW, NOW + 10_000, b"itest", 3, b"1", b"1", b"RQ_UNKNOWN_TAG"], tag
    # when it is written another way, it is settled all the same
    assert s.fetch(keys=gk, args=group_argv("g", "c1", NOW, one, 1, "t4", "02", "1", "t2"))[6:8] == [b"ok", 3]
    assert r.hget(qk.floors, "g") == b"2" and r.hget(gk[10], "c1") == b"1"


def test_nack_reply_and_stale_error(raw):
    _, _, gk, s = raw
    publish(raw, b"a")
    s.join(keys=gk, args=group_argv())
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 10, "t1"))
    assert s.nack(keys=gk, args=group_argv("g", "c1", NOW, None, 1, 1, "t1", "250", "")) == [b"requeued", NOW + 250]
    with pytest.raises(redis.ResponseError, match=r"^RQ_STALE 1\.1\.t1$"):
        s.nack(keys=gk, args=group_argv("g", "c1", NOW, None, 1, 1, "t1", "", ""))


def test_nack_of_many_tags_nacks_each_on_its_own(raw, queue, client):
    # given three deliveries of c1, the second acked, and a group dead-lettering at the second delivery
    r, _, gk, s = raw
    publish(raw, b"a", b"b", b"c")
    twice = Settings(ack_wait=10, max_deliveries=2)
    s.join(keys=gk, args=group_argv())
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, twice, 10, "t1"))
    assert s.ack(keys=ack_keys(gk), args=ack_argv("c1", "1", 2, 1, "t1")) == [b"ok"]
    # when the three are nacked in one call with a delay, an error and the failed event
    tags = [1, 1, "t1", "250", "boom", "failed", 2, 1, "t1", 3, 1, "t1"]
    reply = s.nack(keys=gk, args=group_argv("g", "c1", NOW, twice, *tags))
    # then each held one is requeued after the delay with its event, and the acked one is refused alone
    assert reply == [b"requeued", NOW + 250, b"RQ_ACKED", b"", b"requeued", NOW + 250]
    assert [(e["event"], e["seq"], e["reason"]) for e in queue.events()] == [
        ("failed", "1", "boom"),
        ("failed", "3", "boom"),
    ]
    # and at their next delivery, the last one allowed, the same call dead-letters them
    again = s.fetch(keys=gk, args=group_argv("g", "c1", NOW + 300, twice, 10, "t2"))
    assert again[6:] == [1, 2, again[8], 3, 2, again[11]]
    reply = s.nack(keys=gk, args=group_argv("g", "c1", NOW + 300, twice, 1, 2, "t2", "", "again", "", 3, 2, "t2"))
    assert reply == [b"dead", 1, b"dead", 2]
    assert [m.seq for m in queue.dead_letters()] == [1, 3]
    # and tags not in threes are refused, nothing changed
    with nothing_changes(client), pytest.raises(redis.ResponseError, match=r"^RQ_BAD_ARGUMENT .*in threes"):
        s.nack(keys=gk, args=group_argv("g", "c1", NOW, twice, 1, 2, "t2", "", "", "", 3, 2))


def test_nack_of_many_tags_names_a_state_that_does_not_parse_and_nacks_the_others(raw, queue, client):
    # given three deliveries of c1, the second one's delivery state overwritten with garbage
    r, _, gk, s = raw
    publish(raw, b"a", b"b", b"c")
    s.join(keys=gk, args=group_argv())
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 10, "t1"))
    r.hset(gk[8], 2, b"nonsense")
    # when the three are nacked in one call
    reply = s.nack(keys=gk, args=group_argv("g", "c1", NOW, None, 1, 1, "t1", "0", "boom", "", 2, 1, "t1", 3, 1, "t1"))
    # then the damaged one is refused alone, left as it was, and the others are requeued
    assert reply == [b"requeued", NOW, b"RQ_CORRUPT", b"", b"requeued", NOW]
    assert r.hget(gk[8], 2) == b"nonsense"
    assert r.zscore(gk[5], 2) is not None
    assert [int(x) for x in r.zrange(gk[6], 0, -1)] == [1, 3]


def test_nack_of_many_tags_that_meets_damage_of_the_call_changes_nothing(raw, queue, client):
    # given a held delivery that a failure requeues, one at its last allowed delivery,
    # and a dead letter where the next one is to go (its meta's seq was reset)
    r, qk, gk, s = raw
    twice = Settings(ack_wait=10, max_deliveries=2)
    publish(raw, b"a", b"b")
    s.join(keys=gk, args=group_argv())
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, twice, 1, "t1"))
    assert s.nack(keys=gk, args=group_argv("g", "c1", NOW, twice, 1, 1, "t1", "0", "", ""))[0] == b"requeued"
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, twice, 2, "t2"))  # 1 (its second delivery), then 2
    logview.put(r, qk.dead_letters, 1, b"an older dead letter")
    # when both are nacked in one call, the one that requeues first
    # then the call is refused naming the dead-letter queue, and nothing changed
    with nothing_changes(client), pytest.raises(redis.ResponseError, match=r"RQ_CORRUPT .*dead letter 1 exists"):
        s.nack(keys=gk, args=group_argv("g", "c1", NOW, twice, 2, 1, "t2", "0", "boom", "failed", 1, 2, "t2"))
    # and a floor that is not a seq, met at a tag without a delivery state after a held one, changes nothing either
    assert logview.delete(r, qk.dead_letters, 1) == 1
    r.hset(gk[2], "g", "garbage")
    with nothing_changes(client), pytest.raises(redis.ResponseError, match=r"RQ_CORRUPT .*the ack floor"):
        s.nack(keys=gk, args=group_argv("g", "c1", NOW, twice, 2, 1, "t2", "0", "boom", "failed", 9, 1, "t2"))


def test_nack_of_many_tags_with_a_failure_policy_that_does_not_parse_changes_nothing(raw, client):
    # given two deliveries of c1
    r, _, gk, s = raw
    publish(raw, b"a", b"b")
    s.join(keys=gk, args=group_argv())
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 10, "t1"))
    bad = group_argv("g", "c1", NOW, None, 9, 1, "t1", "", "boom", "failed", 1, 1, "t1", 2, 1, "t1")
    bad[6] = "3 250 2.0 4000 0.5"  # three words short
    # when both are nacked in one call after a tag that is refused, with a policy that does not parse
    # then the call is refused, and nothing changed
    with nothing_changes(client), pytest.raises(redis.ResponseError, match=r"RQ_BAD_ARGUMENT the failure policy"):
        s.nack(keys=gk, args=bad)


def test_nack_of_a_tag_named_twice_dead_letters_it_once(raw, queue, client):
    # given two deliveries of c1 at their last allowed delivery
    r, _, gk, s = raw
    once = Settings(ack_wait=10, max_deliveries=1)
    publish(raw, b"a", b"b")
    s.join(keys=gk, args=group_argv())
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, once, 10, "t1"))
    # when one call names the first twice, around the second, with the failed event
    reply = s.nack(
        keys=gk, args=group_argv("g", "c1", NOW, once, 1, 1, "t1", "", "boom", "failed", 2, 1, "t1", 1, 1, "t1")
    )
    # then each is dead-lettered exactly once, the repeat refused as settled
    assert reply == [b"dead", 1, b"dead", 2, b"RQ_ACKED", b""]
    assert [m.seq for m in queue.dead_letters()] == [1, 2]
    assert [(e["event"], e["seq"]) for e in queue.events() if e["event"] == "failed"] == [
        ("failed", "1"),
        ("failed", "2"),
    ]


def test_nack_many_of_one_tag_is_as_lenient_as_of_more(raw, queue, client):
    # given two deliveries of c1, the second one's delivery state overwritten with garbage
    r, _, gk, s = raw
    publish(raw, b"a", b"b")
    c = queue.consumer("g", name="c1", prefetch=2)
    d1, d2 = c.fetch(2)
    r.hset(gk[8], 2, b"nonsense")
    # when each is nacked alone through nack_many (the tag after an empty first one, ARGV[14..])
    damaged = commands.nack_many(c._group_call(), [c._tag_of(d2)], 0, "boom", "")
    held = commands.nack_many(c._group_call(), [c._tag_of(d1)], 0, "boom", "")
    # then the damage is the tag's status, not an error of the call, and the held one is requeued
    assert damaged == ["RQ_CORRUPT"]
    assert held == [commands.NackReply(False, held[0].where)]
    assert r.hget(gk[8], 2) == b"nonsense"


def test_a_full_group_gets_its_expired_lease_back_in_the_same_fetch(raw):
    # given a group at its max_inflight of 1, whose one lease has run out
    _, _, gk, s = raw
    publish(raw, b"a", b"b")
    s.join(keys=gk, args=group_argv())
    one = Settings(ack_wait=10, max_inflight=1)
    assert s.fetch(keys=gk, args=group_argv("g", "c1", NOW, one, 5, "t1"))[6:8] == [1, 1]
    assert s.fetch(keys=gk, args=group_argv("g", "c1", NOW, one, 5, "t2"))[6:] == []
    # when a fetch comes after the lease's deadline
    reply = s.fetch(keys=gk, args=group_argv("g", "c1", NOW + 10_001, one, 5, "t3"))
    # then the expiry frees the room it takes: seq 1 again, its second delivery
    assert reply[6:8] == [1, 2]


def test_a_fetch_with_nothing_in_flight_delivers_new_messages(raw):
    # given a message fetched and acked, and one more published
    r, _, gk, s = raw
    publish(raw, b"a")
    s.join(keys=gk, args=group_argv())
    assert s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 1, "t1"))[6:8] == [1, 1]
    assert s.ack(keys=ack_keys(gk), args=ack_argv("c1", "1", 1, 1, "t1")) == [b"ok"]
    publish(raw, b"b")
    # when the next fetch comes long after the first lease would have run out
    reply = s.fetch(keys=gk, args=group_argv("g", "c1", NOW + 60_000, None, 5, "t2"))
    # then it delivers the new message, and the group counts nothing expired
    assert reply[6:] == [2, 1, compact(NOW, b"b")]
    assert r.hget(gk[4], "expired") is None  # KEYS[5], the group hash
    assert r.hget(gk[4], "cursor") == b"2"


def test_failure_policy_is_one_argument_of_eight_words():
    # given settings with every part of the failure policy set
    s = Settings(
        max_deliveries=3,
        redelivery_delay=0.25,
        redelivery_multiplier=2,
        max_redelivery_delay=4,
        redelivery_jitter=0.5,
        dead_letter="none",
    )
    # when the policy is built around a call's random number and queue name
    before, after = commands.failure_policy(s, "orders")
    # then it is the eight words of group_args.lua's ARGV[7]
    assert f"{before}0.125{after}".split(" ") == ["3", "250", "2.0", "4000", "0.5", "0.125", "drop", "orders"]


def test_a_failure_policy_that_does_not_parse_changes_nothing(raw):
    # given a delivery held by c1
    r, _, gk, s = raw
    publish(raw, b"a")
    s.join(keys=gk, args=group_argv())
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 10, "t1"))
    before = {k: r.dump(k) for k in gk if r.exists(k)}
    bad = group_argv("g", "c1", NOW, None, 1, 1, "t1", "", "")
    bad[6] = "3 250 2.0 4000 0.5"  # three words short
    # when nack, reject and a dead member's removal are sent it
    for script, args in (
        (s.nack, bad),
        (s.reject, bad[:7] + [1, 1, "t1", "rejected", ""]),
        (s.leave, bad[:7] + ["c1", "dead"]),
    ):
        with pytest.raises(
            redis.ResponseError, match=r"RQ_BAD_ARGUMENT the failure policy \(ARGV\[7\]\) does not parse"
        ):
            script(keys=gk, args=args)
    # then no key of the group changed
    assert {k: r.dump(k) for k in gk if r.exists(k)} == before


def test_a_refused_argument_maps_to_invalid_input():
    # given the error reply of a script that refused its failure policy
    reply = redis.ResponseError("user_script:40: RQ_BAD_ARGUMENT the failure policy (ARGV[7]) does not parse: x")
    # when it is mapped to rqueue's exceptions
    exc = from_script_error(reply, queue="orders")
    # then it is an InvalidInput that says what was refused
    assert isinstance(exc, InvalidInput)
    assert "the failure policy (ARGV[7]) does not parse: x" in str(exc)


def test_an_expired_lease_is_left_whole_when_the_failure_policy_does_not_parse(raw):
    # given a lease that has run out
    r, _, gk, s = raw
    publish(raw, b"a")
    s.join(keys=gk, args=group_argv())
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 10, "t1"))
    lease, dlv, consumers = gk[5], gk[8], gk[10]  # KEYS[6], KEYS[9], KEYS[11]
    before = (r.zrange(lease, 0, -1, withscores=True), r.hgetall(dlv), r.hgetall(consumers))
    # when a fetch after its deadline is sent a failure policy that does not parse
    late = group_argv("g", "c1", NOW + 10_001, None, 10, "t2")
    late[6] = "3 250"
    with pytest.raises(redis.ResponseError, match="RQ_BAD_ARGUMENT"):
        s.fetch(keys=gk, args=late)
    # then the lease, the delivery state and the holder's count are as they were
    assert (r.zrange(lease, 0, -1, withscores=True), r.hgetall(dlv), r.hgetall(consumers)) == before
    # and a good policy takes it back and redelivers it
    assert s.fetch(keys=gk, args=group_argv("g", "c1", NOW + 10_001, None, 10, "t3"))[6:8] == [1, 2]


def test_stats_reads_the_group_name_and_now_alone(raw):
    # given a group with one delivery in flight
    _, _, gk, s = raw
    publish(raw, b"a")
    s.join(keys=gk, args=group_argv())
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 10, "t1"))
    # when stats is sent the group name and now, the settings left empty
    flat = s.stats(keys=gk, args=["g", "", NOW, "", "", "", ""])
    # then it answers
    stats = dict(zip(flat[0:40:2], flat[1:40:2]))
    assert stats[b"in_flight"] == 1 and stats[b"now"] == NOW


def test_a_fetch_reads_the_failure_policy_only_when_a_delivery_fails(raw):
    # given a fetch sent a failure policy that does not parse
    _, _, gk, s = raw
    publish(raw, b"a")
    s.join(keys=gk, args=group_argv())
    args = group_argv("g", "c1", NOW, None, 10, "t1")
    args[6] = "not a policy"
    # when nothing fails, it delivers
    assert s.fetch(keys=gk, args=args)[6:] == [1, 1, compact(NOW, b"a")]
    # and when the lease has expired, the policy is read and refused
    later = group_argv("g", "c1", NOW + 10_001, None, 10, "t2")
    later[6] = "not a policy"
    with pytest.raises(redis.ResponseError, match=r"RQ_BAD_ARGUMENT"):
        s.fetch(keys=gk, args=later)


def test_reject_reply_is_dead_letter_seq(raw):
    r, qk, gk, s = raw
    publish(raw, b"a")
    s.join(keys=gk, args=group_argv())
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 10, "t1"))
    assert s.reject(keys=gk, args=group_argv("g", "c1", NOW, None, 1, 1, "t1", "rejected", "why")) == 1
    assert r.hget(qk.dead_letters.meta, "seq") == b"1"


def test_extend_reply_is_deadline_and_statuses(raw):
    r, _, gk, s = raw
    publish(raw, b"a")
    s.join(keys=gk, args=group_argv())
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 10, "t1"))
    assert s.extend(keys=gk, args=group_argv("g", "c1", NOW + 5, None, 1, 1, "t1", 1, 2, "t1")) == [
        NOW + 5 + 10_000,
        b"ok",
        b"RQ_UNKNOWN_TAG",
    ]
    assert r.zscore(gk[5], 1) == NOW + 5 + 10_000


def test_leave_graceful_and_dead(raw):
    r, _, gk, s = raw
    publish(raw, b"a", b"b")
    s.join(keys=gk, args=group_argv())
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 1, "t1"))
    assert s.leave(keys=gk, args=group_argv("g", "c1", NOW, None, "c1", "graceful")) == [1, 0]
    assert r.zrange(gk[6], 0, -1) == [b"1"]
    s.join(keys=gk, args=group_argv("g", "c2"))
    one_try = Settings(ack_wait=10, max_deliveries=2)
    s.fetch(keys=gk, args=group_argv("g", "c2", NOW, one_try, 1, "t2"))
    assert s.leave(keys=gk, args=group_argv("g", "c9", NOW, one_try, "c2", "dead")) == [0, 1]


def test_stats_reply_is_name_value_pairs(raw):
    _, _, gk, s = raw
    publish(raw, b"a")
    s.join(keys=gk, args=group_argv())
    flat = s.stats(keys=gk, args=group_argv())
    pairs = dict(zip(flat[0:-5:2], flat[1:-5:2]))
    assert pairs[b"last_seq"] == b"1" and int(pairs[b"floor"]) == 0 and pairs[b"reopened_below_floor"] == 0
    # consumer, name, held, liveness deadline, liveness timeout (ack_wait by default)
    assert flat[-5:] == [b"consumer", b"c1", b"0", str(NOW + 10_000).encode(), b"10000"]


def test_corrupt_delivery_state_is_a_coded_error(raw):
    r, _, gk, s = raw
    publish(raw, b"a")
    s.join(keys=gk, args=group_argv())
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 10, "t1"))
    r.hset(gk[8], 1, b"nonsense")
    with pytest.raises(redis.ResponseError, match="RQ_CORRUPT"):
        s.ack(keys=ack_keys(gk), args=ack_argv("c1", "1", 1, 1, "t1"))


def test_delivery_states_are_kept_in_a_hash_table(raw):
    # fetch writes the pin with every batch of states: as a listpack (under
    # 128 small fields) the hash would be scanned whole by every HSET, HMGET
    # and HDEL. The pin outlives the states, so the hash stays a hash table.
    r, qk, gk, s = raw
    publish(raw, b"a", b"b")
    s.join(keys=gk, args=group_argv())
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 10, "t1"))
    assert sorted(r.hkeys(gk[8])) == [b"1", b"2", b"pin"] and len(r.hget(gk[8], "pin")) > 64
    assert s.ack(keys=ack_keys(gk), args=ack_argv("c1", "1", 1, 1, "t1", 2, 1, "t1")) == [b"ok", b"ok"]
    assert r.hkeys(gk[8]) == [b"pin"]
    try:
        encoding = r.object("encoding", gk[8])
    except redis.ResponseError:  # memory:// has no OBJECT ENCODING
        return
    assert encoding == b"hashtable"


def test_leases_are_kept_in_a_skiplist_and_the_pin_is_no_delivery(raw):
    # fetch adds the pin (a long member at +inf) with every batch of leases:
    # as a listpack every ZADD would move the whole set. Nothing counts it.
    r, qk, gk, s = raw
    publish(raw, b"a", b"b")
    one = Settings(ack_wait=10, max_inflight=2)
    s.join(keys=gk, args=group_argv())
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, one, 1, "t1"))
    members = r.zrange(gk[5], 0, -1, withscores=True)
    assert members[0] == (b"1", NOW + 10_000) and members[1][0].startswith(b"pin:") and members[1][1] == float("inf")
    assert len(members) == 2 and len(members[1][0]) > 64
    # max_inflight 2 still lets a second delivery out, and no more
    assert s.fetch(keys=gk, args=group_argv("g", "c1", NOW, one, 5, "t2"))[6:8] == [2, 1]
    assert s.fetch(keys=gk, args=group_argv("g", "c1", NOW, one, 5, "t3"))[:2] == [NOW, NOW + 10_000]
    stats = dict(zip(*[iter(s.stats(keys=gk, args=group_argv("g", "", NOW + 20_000, one))[:40])] * 2))
    assert stats[b"in_flight"] == 2 and stats[b"expired_leases"] == 2
    # a sync heartbeat and a leave pass over the pin
    hb = s.heartbeat(keys=gk, args=group_argv("g", "c1", NOW, one, 10_000, "1", 1, 1, "t1", 2, 1, "t2"))
    assert hb[4] == 0
    assert s.leave(keys=gk, args=group_argv("g", "c1", NOW, one, "c1", "graceful")) == [2, 0]
    assert [m[:4] for m in r.zrange(gk[5], 0, -1)] == [b"pin:"]
    try:
        encoding = r.object("encoding", gk[5])
    except redis.ResponseError:  # memory:// has no OBJECT ENCODING
        return
    assert encoding == b"skiplist"


def test_fetch_names_seqs_across_hundreds_exactly(raw, queue):
    # A large fetch from the cursor builds its seq strings from the hundreds
    # and a two-digit table: each must be the seq's canonical form, or the
    # states and leases would be kept under other names than acks look for.
    r, qk, gk, s = raw
    queue.publish_many([b"m"] * 330)
    c = queue.consumer("g", "c1", prefetch=1000)
    got = c.fetch(95) + c.fetch(10) + c.fetch(200) + c.fetch(25)
    assert [d.seq for d in got] == list(range(1, 331))
    # (a stream log's fetch of more than a few from the cursor writes a call record instead)
    assert all(
        r.hexists(gk[8], seq) and r.zscore(gk[5], seq) is not None or callview.out_on_call(r, gk, seq)
        for seq in (100, 199, 200, 299, 300, 330)
    )
    c.ack(got)
    # (no state at all when the fetches were call records: a stream log's)
    assert set(r.hkeys(gk[8])) <= {b"pin"} and r.zrangebyscore(gk[5], "-inf", "(+inf") == []
    assert logview.count(r, qk) == 0 and callview.calls_of(r, gk) == {}


def test_publish_names_seqs_across_hundreds_exactly(raw):
    # A stream log's batch of 16 or more builds its entry ids from the
    # hundreds and a two-digit table: each id must carry the seq's canonical
    # form, or a record would stand under another seq than fetch reads.
    r, qk, _, _ = raw
    # given batches of 95, 10 (a small batch: each id by sprintf), 200 and 25, crossing 100, 200 and 300
    bodies = [f"m{i}".encode() for i in range(1, 331)]
    sizes, first, replies = (95, 10, 200, 25), 0, []
    for size in sizes:
        replies.append(publish(raw, *bodies[first : first + size]))
        first += size
    # then each call replied its seqs in order, and each record stands under its seq, published at NOW
    assert [seq for reply in replies for seq in reply[1::2]] == list(range(1, 331))
    assert logview.records(r, qk) == {seq: compact(NOW, bodies[seq - 1]) for seq in range(1, 331)}
    if logview.is_stream(qk):
        assert [i for i, _ in r.xrange(qk.msgs)] == [f"{seq}-{NOW}".encode() for seq in range(1, 331)]
    # and a batch whose seqs' hundreds gain a digit (99,991 to 100,010) stands under those seqs too
    r.hset(qk.meta, "seq", 99_990)
    reply = publish(raw, *bodies[:20])
    assert reply[1::2] == list(range(99_991, 100_011))
    assert {seq: logview.record(r, qk, seq) for seq in range(99_991, 100_011)} == {
        seq: compact(NOW, bodies[seq - 99_991]) for seq in range(99_991, 100_011)
    }
    # and so does a batch with ids, which takes the general loop (100,011 to 100,030)
    reply = publish(raw, *bodies[:20], ids=[f"id{i}" for i in range(20)])
    assert reply[1::2] == list(range(100_011, 100_031))
    assert [logview.record(r, qk, seq) for seq in range(100_011, 100_031)] == [compact(NOW, b) for b in bodies[:20]]


# -- fencing tokens (guarantee 11 in docs/guarantees.md) -------------------------------


def ack_of(s, gk, consumer, strict, *tags):
    """ack.lua, its tags given as (seq, count, token) triples."""
    return s.ack(keys=ack_keys(gk), args=ack_argv(consumer, strict, *[x for tag in tags for x in tag]))


def test_a_tag_with_another_token_names_no_delivery_and_changes_nothing(raw, client):
    # given c1 holding seqs 1 and 2 from the fetch with token t1
    r, _, gk, s = raw
    publish(raw, b"a", b"b")
    s.join(keys=gk, args=group_argv())
    assert s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 2, "t1"))[6::3] == [1, 2]
    # when the same seq and count come with another token: alone, in a batch,
    # leniently, with a fetch, and to nack, reject and extend
    with nothing_changes(client):
        for tags in ([(1, 1, "t2")], [(2, 1, "t1"), (1, 1, "t2")]):
            with pytest.raises(redis.ResponseError, match=r"^RQ_UNKNOWN_TAG 1\.1\.t2$"):
                ack_of(s, gk, "c1", "1", *tags)
        assert ack_of(s, gk, "c1", "0", (1, 1, "t2")) == [b"RQ_UNKNOWN_TAG"]
        # (a prefix or an extension of the token is no match either)
        assert ack_of(s, gk, "c1", "0", (1, 1, "t"), (1, 1, "t11")) == [b"RQ_UNKNOWN_TAG"] * 2
        for script, tail in ((s.nack, ["", ""]), (s.reject, ["rejected", ""])):
            with pytest.raises(redis.ResponseError, match=r"^RQ_UNKNOWN_TAG 1\.1\.t2$"):
                script(keys=gk, args=group_argv("g", "c1", NOW, None, 1, 1, "t2", *tail))
        # (at the fetch's time: extend records a beat, the same one again)
        assert s.extend(keys=gk, args=group_argv("g", "c1", NOW, None, 1, 1, "t2")) == [NOW + 10_000, b"RQ_UNKNOWN_TAG"]
    # (a fetch that carries it acks nothing; it claims nothing new either: all is held)
    assert s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 2, "t3", 1, 1, "t2"))[6:] == [b"RQ_UNKNOWN_TAG"]
    assert r.hget(gk[8], 1) == b"1:c1:%d:%d:t1" % (NOW, NOW) and r.hget(gk[10], "c1") == b"2"
    # then the right token settles both
    assert ack_of(s, gk, "c1", "1", (1, 1, "t1"), (2, 1, "t1")) == [b"ok", b"ok"]


@pytest.mark.parametrize("then", ["ack", "ack_lenient", "ack_with_fetch", "nack", "reject", "extend"])
def test_a_delivery_nacked_by_its_holder_is_stale_to_every_later_settle(raw, client, then):
    # given c1's delivery of seq 1 nacked for a retry in 30 s
    r, _, gk, s = raw
    publish(raw, b"a")
    s.join(keys=gk, args=group_argv())
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 1, "t1"))
    assert s.nack(keys=gk, args=group_argv("g", "c1", NOW, None, 1, 1, "t1", "30000", "")) == [
        b"requeued",
        NOW + 30_000,
    ]
    # then its state remembers that its holder settled it
    assert r.hget(gk[8], 1) == b"1::%d:%d:t1\n1!c1=t1" % (NOW, NOW)
    stale = r"^RQ_STALE 1\.1\.t1$"
    # when c1 settles that same delivery again, it is stale and changes nothing
    with nothing_changes(client):
        if then == "ack":
            with pytest.raises(redis.ResponseError, match=stale):
                ack_of(s, gk, "c1", "1", (1, 1, "t1"))
        elif then == "ack_lenient":
            assert ack_of(s, gk, "c1", "0", (1, 1, "t1")) == [b"RQ_STALE"]
        elif then == "ack_with_fetch":
            reply = s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 1, "t2", 1, 1, "t1"))
            assert reply[:2] + reply[6:] == [NOW, NOW + 30_000, b"RQ_STALE"]
        elif then == "extend":
            assert s.extend(keys=gk, args=group_argv("g", "c1", NOW, None, 1, 1, "t1"))[1:] == [b"RQ_STALE"]
        else:
            script, tail = (s.nack, ["", ""]) if then == "nack" else (s.reject, ["rejected", ""])
            with pytest.raises(redis.ResponseError, match=stale):
                script(keys=gk, args=group_argv("g", "c1", NOW, None, 1, 1, "t1", *tail))
    # and the retry still comes, after which the old tag is stale against the new delivery too
    assert s.fetch(keys=gk, args=group_argv("g", "c1", NOW + 30_000, None, 1, "t3"))[6:8] == [1, 2]
    assert ack_of(s, gk, "c1", "0", (1, 1, "t1")) == [b"RQ_STALE"]
    assert ack_of(s, gk, "c1", "1", (1, 2, "t3")) == [b"ok"]


def test_a_late_ack_is_judged_by_the_token_it_was_delivered_with(raw, client):
    # given seq 1 delivered to c1 (t1), its lease run out and the message redelivered to c2 (t2)
    r, qk, gk, s = raw
    publish(raw, b"a")
    s.join(keys=gk, args=group_argv())
    s.join(keys=gk, args=group_argv("g", "c2"))
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 1, "t1"))
    assert s.fetch(keys=gk, args=group_argv("g", "c2", NOW + 10_001, None, 1, "t2"))[6:8] == [1, 2]
    assert r.hget(gk[8], 1) == b"2:c2:%d:%d:t2\n1=c1=t1" % (NOW, NOW + 10_001)
    # when c1 acks its earlier delivery with another token (c2's, or one never
    # handed out), or c2 with c1's token, it is not held, and nothing changes
    with nothing_changes(client):
        for consumer, tag in (("c1", (1, 1, "t2")), ("c1", (1, 1, "t9")), ("c2", (1, 1, "t1"))):
            with pytest.raises(redis.ResponseError, match=rf"^RQ_NOT_HELD 1\.1\.{tag[2]}$"):
                ack_of(s, gk, consumer, "1", tag)
            assert ack_of(s, gk, consumer, "0", tag) == [b"RQ_NOT_HELD"]
    # when it acks it with the token it was delivered with, it is stale: c2 holds
    # the message now (a late ack completes only a message nobody holds), and nothing changes
    with nothing_changes(client):
        with pytest.raises(redis.ResponseError, match=r"^RQ_STALE 1\.1\.t1$"):
            ack_of(s, gk, "c1", "1", (1, 1, "t1"))
        assert ack_of(s, gk, "c1", "0", (1, 1, "t1")) == [b"RQ_STALE"]
    # then c2's ack completes the message
    assert ack_of(s, gk, "c2", "0", (1, 2, "t2")) == [b"ok"]
    assert r.hget(qk.floors, "g") == b"1" and r.hget(gk[10], "c2") == b"0" and r.hkeys(gk[8]) == [b"pin"]


def test_a_delivery_state_without_a_token_still_reads(raw):
    # given states written before tokens: seq 1 in flight with a history, seq 2 in flight
    r, _, gk, s = raw
    publish(raw, b"a", b"b")
    s.join(keys=gk, args=group_argv())
    assert s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 2, "t1"))[6::3] == [1, 2]
    r.hset(gk[8], mapping={1: b"2:c1:%d:%d\n1=c0" % (NOW, NOW), 2: b"1:c1:%d:%d" % (NOW, NOW)})
    # when stats and a fetch read them, then neither fails
    stats = dict(zip(*[iter(s.stats(keys=gk, args=group_argv("g", "", NOW, None))[:40])] * 2))
    assert stats[b"in_flight"] == 2
    assert s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 2, "t2"))[:2] == [NOW, NOW + 10_000]
    # when their leases run out, the next fetch takes them back and redelivers them
    reply = s.fetch(keys=gk, args=group_argv("g", "c1", NOW + 10_001, None, 2, "t3"))
    assert reply[6::3] == [1, 2] and reply[7::3] == [3, 2]
    # with the token "" kept in their history and the new token in the state
    assert r.hget(gk[8], 1) == b"3:c1:%d:%d:t3\n1=c0\n2=c1=" % (NOW, NOW + 10_001)
    assert r.hget(gk[8], 2) == b"2:c1:%d:%d:t3\n1=c1=" % (NOW, NOW + 10_001)
    assert ack_of(s, gk, "c1", "1", (1, 3, "t3"), (2, 2, "t3")) == [b"ok", b"ok"]


@pytest.mark.parametrize("token", [None, "", "T1", "t-1", "t.1", "t 1", "t1\n", "é", "1t", "t" * 33])
def test_a_fetch_with_a_bad_token_is_refused_and_changes_nothing(raw, client, token):
    # given c1 holding seq 1, and seq 2 waiting
    _, _, gk, s = raw
    publish(raw, b"a", b"b")
    s.join(keys=gk, args=group_argv())
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 1, "t1"))
    # when a fetch (acking seq 1 first, or a plain one) is sent a token that is not a letter then
    # letters and digits, 32 at most
    args = group_argv("g", "c1", NOW, None, 5) + ([] if token is None else [token])
    for tail in ([1, 1, "t1"], []) if token is not None else ([],):
        with nothing_changes(client), pytest.raises(redis.ResponseError) as exc:
            s.fetch(keys=gk, args=args + tail)
        # then it is refused, naming the argument
        assert str(exc.value).startswith("RQ_BAD_ARGUMENT the token (ARGV[9]) must be a letter, then letters")


@pytest.mark.parametrize("strict", ["1", "0"])
def test_a_token_holding_a_colon_cannot_reach_into_another_consumers_state(raw, client, strict):
    # given consumer "c1:5:6" (names may hold ":") holding seq 1 from the fetch with token t1
    _, _, gk, s = raw
    publish(raw, b"a")
    s.join(keys=gk, args=group_argv("g", "c1:5:6"))
    s.fetch(keys=gk, args=group_argv("g", "c1:5:6", NOW, None, 1, "t1"))
    # when consumer c1 acks (1, 1) with a token made of the rest of that state
    forged = (1, 1, f"{NOW}:{NOW}:t1")
    with nothing_changes(client):
        if strict == "1":
            with pytest.raises(redis.ResponseError, match="RQ_UNKNOWN_TAG"):
                ack_of(s, gk, "c1", strict, forged)
        else:
            # then it names no delivery, and "c1:5:6" still holds seq 1
            assert ack_of(s, gk, "c1", strict, forged) == [b"RQ_UNKNOWN_TAG"]
    assert ack_of(s, gk, "c1:5:6", "1", (1, 1, "t1")) == [b"ok"]


def test_a_token_holding_an_equals_sign_cannot_late_ack_another_consumers_delivery(raw, client):
    # given consumer "a=b" (names may hold "=") whose delivery 1 of seq 1 (token t1) was taken
    # back when its lease ran out, and c2 holding delivery 2
    _, _, gk, s = raw
    publish(raw, b"a")
    for name in ("a=b", "c2"):
        s.join(keys=gk, args=group_argv("g", name))
    s.fetch(keys=gk, args=group_argv("g", "a=b", NOW, None, 1, "t1"))
    s.fetch(keys=gk, args=group_argv("g", "c2", NOW + 10_001, None, 1, "t2"))
    # when consumer "a" late-acks (1, 1) with the token "b=t1", which would read as the history line
    with nothing_changes(client):
        assert ack_of(s, gk, "a", "0", (1, 1, "b=t1")) == [b"RQ_UNKNOWN_TAG"]
    # then the consumer that received it is judged as that delivery's holder: stale, as c2 holds it now
    assert ack_of(s, gk, "a=b", "0", (1, 1, "t1")) == [b"RQ_STALE"]


def test_a_state_before_tokens_of_a_consumer_whose_name_holds_colons_reads_right(raw, client):
    # given a delivery state in the format before tokens, held by consumer "w:5"
    r, _, gk, s = raw
    publish(raw, b"a")
    s.join(keys=gk, args=group_argv("g", "w:5"))
    s.fetch(keys=gk, args=group_argv("g", "w:5", NOW, None, 1, "t1"))
    r.hset(gk[8], 1, b"1:w:5:%d:%d" % (NOW, NOW))
    # when consumer "w" acks it with the last field as a token, then that names no delivery
    with nothing_changes(client):
        assert ack_of(s, gk, "w", "0", (1, 1, str(NOW))) == [b"RQ_UNKNOWN_TAG"]
        assert ack_of(s, gk, "w", "0", (1, 1, "t1")) == [b"RQ_NOT_HELD"]
    # and its lease running out hands it back to the group for redelivery, to any consumer
    s.join(keys=gk, args=group_argv("g", "w", NOW + 10_001))
    reply = s.fetch(keys=gk, args=group_argv("g", "w", NOW + 10_001, None, 1, "t2"))
    assert reply[6:8] == [1, 2]


def test_nack_and_reject_without_a_token_name_the_tag(raw, client):
    # given c1 holding seq 1
    _, _, gk, s = raw
    publish(raw, b"a")
    s.join(keys=gk, args=group_argv())
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 1, "t1"))
    # when nack and reject are sent no token (a client of the layout before tokens)
    for script in (s.nack, s.reject):
        with nothing_changes(client), pytest.raises(redis.ResponseError, match=r"^RQ_UNKNOWN_TAG 1\.1\.nil"):
            script(keys=gk, args=group_argv("g", "c1", NOW, None, 1, 1))


# -- corruption and repair.lua ---------------------------------------------------------------


def test_a_fetch_of_a_group_whose_cursor_is_below_its_floor_is_corrupt_and_changes_nothing(raw, client):
    # given a group that settled seq 1, its cursor then moved back to 0
    r, _, gk, s = raw
    publish(raw, b"a", b"b")
    s.join(keys=gk, args=group_argv())
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 1, "t1"))
    s.ack(keys=ack_keys(gk), args=["g", "c1", "1", 1, 1, "t1"])
    r.hset(gk[4], "cursor", 0)
    # when it fetches, then the reply names the group's key and nothing changes
    with nothing_changes(client), pytest.raises(redis.ResponseError, match=rf"^RQ_CORRUPT {gk[4]} field cursor is 0"):
        s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 10, "t2"))


def test_repair_acts_only_while_the_finding_holds(raw, client):
    # given a healthy group holding seq 1
    _, qk, gk, s = raw
    publish(raw, b"a")
    s.join(keys=gk, args=group_argv())
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 1, "t1"))
    # A stream log's doctor does not repair an untracked seq, only reports it
    # (docs/layout-d-plan.md, "Step 3, first part (built)"): repair.lua
    # refuses that repair, and its check, for a stream key, whether or not
    # the finding holds (check:lost-seq, below, is what reports it).
    stream = logview.is_stream(qk)
    # when repair.lua is asked to repair what is not broken, then it answers gone and changes nothing
    with nothing_changes(client):
        for what in (
            ["lease-without-state", 1],
            ["state-without-lease", 1],
            ["cursor", 0, 1],
            ["counts"],
            ["meta", 9],
            ["untracked", 1],
        ):
            check = [f"check:{what[0]}", *what[1:]]
            if stream and what[0] == "untracked":
                for asked in (what, check):
                    with pytest.raises(redis.ResponseError, match='^RQ_BAD_ARGUMENT "untracked" is not repaired'):
                        s.repair(keys=gk, args=group_argv("g", "", NOW, None, *asked))
                continue
            assert s.repair(keys=gk, args=group_argv("g", "", NOW, None, *what)) == [b"gone", b""], what
            assert s.repair(keys=gk, args=group_argv("g", "", NOW, None, *check)) == [b"gone", b""], check
        # and the findings that are only checked are gone too
        for check in (["check:record-missing", 1], ["check:lost-seq", 1], ["check:last-below-cursor"]):
            assert s.repair(keys=gk, args=group_argv("g", "", NOW, None, *check)) == [b"gone", b""], check
    # and a check of a broken state holds, and changes nothing
    client.redis.delete(gk[5])  # the lease set
    with nothing_changes(client):
        assert s.repair(keys=gk, args=group_argv("g", "", NOW, None, "check:state-without-lease", 1)) == [
            b"holds",
            b"",
        ]
    # and an unknown repair is refused
    with nothing_changes(client), pytest.raises(redis.ResponseError, match="^RQ_BAD_ARGUMENT unknown repair nope"):
        s.repair(keys=gk, args=group_argv("g", "", NOW, None, "nope"))


# -- settle_to: a group settles everything up to a seq ---------------------------


def settle_to(raw, target, after=0, limit=5000, group="g"):
    _, _, gk, s = raw
    return s.settle_to(keys=gk, args=group_argv(group, "", NOW, None, target, after, limit))


def test_settle_to_settles_unread_messages_and_moves_the_floor_and_cursor(raw, client):
    # given a group and five messages it has not read
    r, qk, gk, s = raw
    s.join(keys=gk, args=group_argv())
    publish(raw, b"1", b"2", b"3", b"4", b"5")
    # when it settles through seq 3
    assert settle_to(raw, 3) == [3, 3, 0]
    # then the floor and the cursor are at 3, records 1..3 are gone, and fetch hands out seq 4 next
    assert r.hget(qk.floors, "g") == b"3"
    assert r.hget(gk[4], "cursor") == b"3"
    assert logview.seqs(r, qk) == [4, 5]
    reply = s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 1, "t1"))
    assert reply[6] == 4  # after now, next due, incarnation, last seq, floor and generation
    # and settling the same range again settles nothing
    assert settle_to(raw, 3) == [0, 3, 0]


def test_settle_to_leaves_a_delivery_in_flight_to_its_consumer(raw, client):
    # given c1 holding seq 2 of five
    r, qk, gk, s = raw
    s.join(keys=gk, args=group_argv())
    publish(raw, b"1", b"2", b"3", b"4", b"5")
    settle_to(raw, 1)
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 1, "t1"))
    # when the group settles through 5
    assert settle_to(raw, 5) == [3, 5, 0]
    # then seq 2 is still c1's, the floor stops below it, and 3..5 are one acked run
    assert r.hget(qk.floors, "g") == b"1"
    assert r.zrange(gk[9], 0, -1, withscores=True) == [(b"3", 5.0)]
    # A stream log keeps a record settled above the lowest floor until the
    # floor passes it (docs/layout-d-plan.md, "Step 3, first part (built)");
    # a hash log deletes it at its settle.
    assert logview.seqs(r, qk) == ([2, 3, 4, 5] if logview.is_stream(qk) else [2])
    # and c1's ack of it moves the floor over the run
    assert ack_of(s, gk, "c1", "0", (2, 1, "t1")) == [b"ok"]
    assert r.hget(qk.floors, "g") == b"5"
    assert logview.count(r, qk) == 0


def test_settle_to_settles_a_message_waiting_for_redelivery(raw, client):
    # given seq 1 nacked with a delay: waiting, held by nobody
    r, qk, gk, s = raw
    s.join(keys=gk, args=group_argv())
    publish(raw, b"1")
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 1, "t1"))
    s.nack(keys=gk, args=group_argv("g", "c1", NOW, None, 1, 1, "t1", "60000", "boom"))
    assert r.zcard(gk[7]) == 1
    # when the group settles through 1
    assert settle_to(raw, 1) == [1, 1, 0]
    # then it left the delay set and its state, and the floor passed it
    assert r.zcard(gk[7]) == 0 and r.hget(gk[8], 1) is None
    assert r.hget(qk.floors, "g") == b"1"


def test_settle_to_does_bounded_work_and_never_passes_the_last_seq(raw, client):
    # given a group and five messages
    r, qk, gk, s = raw
    s.join(keys=gk, args=group_argv())
    publish(raw, b"1", b"2", b"3", b"4", b"5")
    # when it settles through 9 two seqs a call
    assert settle_to(raw, 9, 0, 2) == [2, 2, 1]
    assert settle_to(raw, 9, 2, 2) == [2, 4, 1]
    assert settle_to(raw, 9, 4, 2) == [1, 5, 0]
    # then seq 6, published later, is not settled
    publish(raw, b"6")
    assert r.hget(qk.floors, "g") == b"5"
    assert logview.seqs(r, qk) == [6]


def test_settle_to_refuses_a_missing_group_and_bad_numbers(raw, client):
    # given a queue with messages and no group "g"
    publish(raw, b"1")
    for args in ((1, 0, 10, "nope"), ("x", 0, 10, "g"), (1, 0, 0, "g"), (1, -1, 10, "g"), (1.5, 0, 10, "g")):
        target, after, limit, group = args
        # when settle_to is called for a missing group, or with a bad number, then nothing changes
        with nothing_changes(client), pytest.raises(redis.ResponseError, match="^RQ_BAD_ARGUMENT"):
            settle_to(raw, target, after, limit, group)


# -- publish_tracked: what a re-run writer stored, one hash per writer ---------------


def publish_tracked(raw, mode, offset, *messages, writer="w1"):
    r, qk, _, s = raw
    args = [NOW, 60_000, "0", "", mode, offset]
    for key, body in messages:
        args += [key, 0, body]
    return s.publish_tracked(keys=[*qk.publish_keys(), qk.tracker(writer)], args=args)


def test_publish_tracked_position_skips_the_rows_a_writer_stored(raw, client):
    # given a writer that stored rows 0..2 in two calls
    r, qk, _, _ = raw
    assert publish_tracked(raw, "position", 0, ("", b"a"), ("", b"b")) == [1, 0, 2, 0]
    assert publish_tracked(raw, "position", 2, ("", b"c")) == [3, 0]
    # when it runs again from row 0 with one row more
    reply = publish_tracked(raw, "position", 0, ("", b"a"), ("", b"b"), ("", b"c"), ("", b"d"))
    # then only row 3 is stored; the tracker is one hash with one field, expiring
    assert reply == [0, 1, 0, 1, 0, 1, 4, 0]
    assert logview.count(r, qk) == 4
    assert r.hgetall(qk.tracker("w1")) == {b"rows": b"4"}
    assert r.pttl(qk.tracker("w1")) > 0
    # and another writer's rows are its own
    assert publish_tracked(raw, "position", 0, ("", b"a"), writer="w2") == [5, 0]


def test_publish_tracked_content_skips_stored_rows_in_any_order(raw, client):
    # given a writer that stored rows keyed x, y, y#1
    r, qk, _, _ = raw
    assert publish_tracked(raw, "content", 0, ("x", b"x"), ("y", b"y"), ("y#1", b"y")) == [1, 0, 2, 0, 3, 0]
    # when it runs again with the rows in another order and a new one, z repeated inside the call
    reply = publish_tracked(raw, "content", 0, ("y#1", b"y"), ("z", b"z"), ("x", b"x"), ("z", b"z"), ("y", b"y"))
    # then only z is stored, once; duplicates name the seq they were stored under
    assert reply == [3, 1, 4, 0, 1, 1, 4, 1, 2, 1]
    assert logview.count(r, qk) == 4


def test_publish_tracked_refuses_bad_arguments(raw, client):
    # given a queue
    publish(raw, b"1")
    # when the mode is unknown, the row number does not parse, or a content key is empty, then nothing changes
    for mode, offset, key in (("other", 0, "k"), ("position", "x", ""), ("position", -5, ""), ("content", 0, "")):
        with nothing_changes(client), pytest.raises(redis.ResponseError, match="^RQ_BAD_ARGUMENT"):
            publish_tracked(raw, mode, offset, (key, b"a"))
    # and a message short of its three arguments changes nothing either
    r, qk, _, s = raw
    with nothing_changes(client), pytest.raises(redis.ResponseError, match="^RQ_BAD_ARGUMENT"):
        s.publish_tracked(keys=[*qk.publish_keys(), qk.tracker("w")], args=[NOW, 60_000, "0", "", "position", 0, "", 0])


def test_publish_tracked_refuses_as_publish_does_a_paused_or_partitioned_queue(raw, client, queue):
    # given a queue paused to refuse publishes
    r, qk, _, _ = raw
    publish(raw, b"1")
    queue.pause(mode="refuse")
    # when a tracked writer stores to it, then it is refused as a publish is, and nothing changes
    with nothing_changes(client), pytest.raises(redis.ResponseError, match="^RQ_PAUSED"):
        publish_tracked(raw, "position", 0, ("", b"a"))
    with pytest.raises(QueuePaused):
        queue.publish(b"b")
    # given it resumed, then made a partitioned queue behind this writer's back (its meta says so)
    queue.resume()
    r.hset(qk.meta, "partitioned", "3")
    # when the writer stores to it, then it is refused with the layout, and nothing changes
    with nothing_changes(client), pytest.raises(redis.ResponseError, match="^RQ_PARTITIONED 3"):
        publish_tracked(raw, "content", 0, ("k", b"a"))


def test_queue_settle_through_loops_until_the_target_and_refuses_a_missing_group(client, queue):
    # given 12,000 messages (more than one script call settles) and c1 holding the first
    queue.publish_many([b"x"] * 12_000)
    assert [d.seq for d in queue.consumer("g", "c1").fetch(1)] == [1]
    # when it settles through 11,000
    settled = queue.settle_through("g", 11_000)
    # then every message up to it but the one c1 holds is settled
    assert settled == 10_999
    group = queue.stats().groups[0]
    assert group.ack_floor == 0 and group.pending == 12_000 - 10_999
    # and a missing group is refused, changing nothing
    with nothing_changes(client), pytest.raises(InvalidInput, match="no group 'other'"):
        queue.settle_through("other", 5)


def test_settle_through_settles_a_replayed_dead_letter_below_the_floor(client, queue):
    # given seq 1 dead-lettered by group g, the floor past it, then replayed: reopened, waiting below the floor
    queue.publish_many([b"a", b"b"])
    with queue.consumer("g", "c1") as c:
        first, second = c.fetch(2)
        first.reject(reason="bad")
        second.ack()
    assert queue.replay_dead_letters().replayed == 1
    assert queue.stats().groups[0].ready == 1
    # when the group settles through seq 0, then the replayed message (seq 1) stays
    assert queue.settle_through("g", 0) == 0
    # and when it settles through seq 2, it is settled: nothing is left for the group, and fetch finds nothing
    assert queue.settle_through("g", 2) == 1
    group = queue.stats().groups[0]
    assert (group.ready, group.pending, group.ack_floor) == (0, 0, 2)
    assert queue.consumer("g", "c2").fetch(1) == []


def pause_call(raw, target, action, group="", mode="", channel=""):
    r, qk, gk, s = raw
    return s.pause(keys=[qk.meta, qk.floors, gk[4]], args=[target, action, group, mode, channel])


def test_pause_of_a_group_is_a_field_fetch_reads_and_acks_ignore(raw):
    r, qk, gk, s = raw
    publish(raw, b"a", b"b")
    s.join(keys=gk, args=group_argv())
    [*_, seq, count, _rec] = s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 1, "t1"))
    # when the group is paused, then its hash holds the field and a second pause changes nothing
    assert pause_call(raw, "group", "pause", "g") == [1, b"paused"]
    assert pause_call(raw, "group", "pause", "g") == [0, b"paused"]
    assert r.hget(gk[4], "paused") == b"1"
    # and a fetch that acks a tag acks it, records the beat and hands out nothing
    reply = s.fetch(keys=gk, args=group_argv("g", "c1", NOW + 1, None, 10, "t2", seq, count, "t1"))
    assert reply == [NOW + 1, b"", b"itest", 2, 1, b"1", b"ok"]
    assert r.zscore(gk[13], "c1") == NOW + 1 + 10_000
    # when resumed, the field is gone and the next message is handed out
    assert pause_call(raw, "group", "resume", "g") == [1, b""]
    assert r.hget(gk[4], "paused") is None
    assert s.fetch(keys=gk, args=group_argv("g", "c1", NOW + 2, None, 10, "t3"))[6] == 2


def test_pause_of_a_queue_stores_its_mode_and_the_seq_a_hold_began_at(raw):
    r, qk, gk, s = raw
    publish(raw, b"a", b"b")
    assert pause_call(raw, "queue", "pause", mode="hold") == [1, b"hold"]
    assert r.hget(qk.meta, "paused") == b"hold:2"
    publish(raw, b"c")
    assert pause_call(raw, "queue", "pause", mode="hold") == [0, b"hold"]  # the hold keeps seq 2
    assert pause_call(raw, "queue", "pause", mode="refuse") == [1, b"refuse"]
    with pytest.raises(redis.ResponseError, match="^RQ_PAUSED"):
        publish(raw, b"d")
    with pytest.raises(redis.ResponseError, match="^RQ_PAUSED"):
        publish(raw, b"e", ids=["x"])
    assert r.hget(qk.meta, "seq") == b"3" and r.exists(qk.message_id("x")) == 0
    assert pause_call(raw, "queue", "resume") == [1, b""]
    assert r.hget(qk.meta, "paused") is None


def test_pause_refuses_what_it_does_not_know_and_changes_nothing(raw):
    r, qk, gk, s = raw
    publish(raw, b"a")
    with pytest.raises(redis.ResponseError, match="^RQ_NOT_MEMBER"):
        pause_call(raw, "group", "pause", "nope")
    with pytest.raises(redis.ResponseError, match="^RQ_BAD_ARGUMENT"):
        pause_call(raw, "queue", "pause", mode="later")
    with pytest.raises(redis.ResponseError, match="^RQ_BAD_ARGUMENT"):
        pause_call(raw, "partition", "pause")
    with pytest.raises(redis.ResponseError, match="^RQ_BAD_ARGUMENT"):
        pause_call(raw, "queue", "stop")
    assert r.hget(qk.meta, "paused") is None


def test_fetch_with_a_rate_limit_counts_the_window_and_names_when_it_has_room(raw):
    r, qk, gk, s = raw
    publish(raw, b"a", b"b", b"c")
    s.join(keys=gk, args=group_argv())
    # given a limit of 2 per 1000 ms after the token
    reply = s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 10, "t1:2:1000"))
    assert reply[6::3] == [1, 2]
    assert r.zrange(gk[19], 0, -1, withscores=True) == [(b"1:t1", NOW), (b"2:t1", NOW)]
    # when the window is full, then nothing, and the next due time is when the first leaves it
    assert s.fetch(keys=gk, args=group_argv("g", "c1", NOW + 400, None, 10, "t2:2:1000")) == [
        NOW + 400,
        NOW + 1000,
        b"itest",
        3,
        b"0",
        b"1",
    ]
    # and once it left, the next one
    assert s.fetch(keys=gk, args=group_argv("g", "c1", NOW + 1000, None, 10, "t3:2:1000"))[6] == 3
    # and a limit that does not parse is refused, naming the token
    for bad in ("t4:0:1000", "t4:2:0", "t4:2", "T4:2:1000"):
        with pytest.raises(redis.ResponseError, match="^RQ_BAD_ARGUMENT the token"):
            s.fetch(keys=gk, args=group_argv("g", "c1", NOW + 1000, None, 10, bad))


def keyed_publish(raw, *pairs, now=NOW):
    """publish.lua with ordering keys: (body, timing) pairs, the priority log last."""
    r, qk, _, s = raw
    args = [now, 60_000, "0", "", INC]
    for body, timing in pairs:
        args += [0, timing, body]
    return s.publish(keys=[*qk.publish_keys(), *qk.publish_flow_keys], args=args)


def test_publish_logs_an_ordering_key_and_fetch_hands_its_messages_out_one_at_a_time(raw):
    r, qk, gk, s = raw
    # given messages of keys a and b ("<delay>:<headers_len>::<key>")
    keyed_publish(raw, (b"a1", "0:0::a"), (b"b1", "0:0::b"), (b"a2", "0:0::a"))
    assert r.zrange(qk.prio, 0, -1) == [b"1:k:a", b"2:k:b", b"3:k:a"] and r.hget(qk.meta, "prio") == b"1"
    s.join(keys=gk, args=group_argv())
    # when the group fetches, then one of each key, in seq order, and what waits stays in the key queue
    assert s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 10, "t1"))[6::3] == [1, 2]
    assert r.zrange(gk[20], 0, -1) == [b"a 0000000000000003"]
    assert r.hgetall(gk[23]) == {b"a": b"1", b"b": b"2"}
    # and with key_concurrency 2 after the token (":<limit>:<period>:<conc>:<key_limit>:<key_period>"), a2 too
    assert s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 10, "t2:0:1000:2:0:1000"))[6::3] == [3]


def test_publish_refuses_a_bad_ordering_key_or_one_with_a_priority_storing_nothing(raw):
    r, qk, _, s = raw
    for timing, message in (
        ("0:0::has space", 'the ordering key "has space" must be'),
        ("0:0::", 'the ordering key "" must be'),
        ("0:0::" + "x" * 129, 'the ordering key "x+" must be 1 to 128'),
        ("0:0:3:k", "a message has both a priority \\(3\\) and the ordering key k"),
    ):
        with pytest.raises(redis.ResponseError, match="^RQ_BAD_ARGUMENT " + message):
            keyed_publish(raw, (b"ok", "0:0::k"), (b"bad", timing))
    assert not r.exists(qk.meta) and not logview.exists(r, qk) and not r.exists(qk.prio)


def test_fetch_takes_the_short_layout_until_the_queue_had_a_priority_or_keyed_message(raw, client):
    r, qk, gk, s = raw
    publish(raw, b"plain")
    s.join(keys=gk, args=group_argv())
    # given a plain queue, then fetch works with KEYS[1..17] alone
    assert s.fetch(keys=[*gk[:17], *call_keys_of(gk)], args=group_argv("g", "c1", NOW, None, 10, "t1"))[6::3] == [1]
    # when a keyed message is published, then the short layout is refused before anything changes
    keyed_publish(raw, (b"a1", "0:0::a"))
    with nothing_changes(client), pytest.raises(redis.ResponseError, match="^RQ_FLOW_KEYS .*KEYS\\[1..24\\]"):
        s.fetch(keys=[*gk[:17], *call_keys_of(gk)], args=group_argv("g", "c1", NOW, None, 10, "t2", 1, 1, "t1"))
    # and a rate limit with the short layout is refused, naming the keys it needs
    with nothing_changes(client), pytest.raises(redis.ResponseError, match="^RQ_BAD_ARGUMENT .*KEYS\\[1..24\\]"):
        s.fetch(keys=[*gk[:17], *call_keys_of(gk)], args=group_argv("g", "c1", NOW, None, 10, "t2:5:1000"))
    # and the whole layout hands it out
    assert s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 10, "t2"))[6::3] == [2]


def test_fetch_refuses_key_settings_that_do_not_parse(raw):
    r, qk, gk, s = raw
    keyed_publish(raw, (b"a1", "0:0::a"))
    s.join(keys=gk, args=group_argv())
    for bad in ("t1:0:1000:0:0:1000", "t1:0:1000:1:0:0", "t1:0:0:1:0:1000", "t1:0:1000:1:0"):
        with pytest.raises(redis.ResponseError, match="^RQ_BAD_ARGUMENT the token"):
            s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 10, bad))
    assert not r.exists(gk[20]) and not r.exists(gk[5])  # nothing pulled, nothing leased


def test_fetch_with_a_key_rate_limit_passes_the_key_over_and_names_when_it_has_room(raw):
    r, qk, gk, s = raw
    keyed_publish(raw, (b"a1", "0:0::a"), (b"a2", "0:0::a"), (b"a3", "0:0::a"))
    s.join(keys=gk, args=group_argv())
    # given at most 2 of a key per 1000 ms, concurrency 5
    assert s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 10, "t1:0:1000:5:2:1000"))[6::3] == [1, 2]
    assert r.hget(gk[23], "~a") == f"{NOW} {NOW}".encode()
    # when the key is at its limit, then nothing, and the next due time is when the window has room
    assert s.fetch(keys=gk, args=group_argv("g", "c1", NOW + 300, None, 10, "t2:0:1000:5:2:1000"))[1] == NOW + 1000
    assert s.fetch(keys=gk, args=group_argv("g", "c1", NOW + 1000, None, 10, "t3:0:1000:5:2:1000"))[6::3] == [3]


# -- retain, group_create, group_reset, group_delete (docs/retention.md) ---------


def retain(raw, age="-", length="-", apply="1", limit=5000, now=NOW):
    r, qk, _, s = raw
    return s.retain(keys=qk.retain_keys(), args=[now, age, length, apply, limit])


def test_retain_stores_the_retention_and_trims_only_what_every_group_settled(raw):
    # given 4 messages a group settled 3 of, in retention mode keeping the last 1
    r, qk, gk, s = raw
    assert retain(raw) == [0, 0, 0] and not r.exists(qk.meta)  # no retention, no queue: nothing written
    publish(raw, b"a", b"b", b"c", b"d")
    s.join(keys=gk, args=group_argv("g", "c1", NOW, None, 10_000, INC))
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 3, "tok"))
    assert retain(raw, length="1") == [1, 0, 0]
    assert r.hget(qk.meta, "retain") == b"- 1"
    s.ack(keys=ack_keys(gk), args=ack_argv("c1", "1", *[x for seq in (1, 2, 3) for x in (seq, 1, "tok")]))
    # then acks deleted nothing, and a step deletes the settled seqs beyond the length only
    assert logview.count(r, qk) == 4
    assert retain(raw, length="1", limit=2) == [1, 2, 2]  # at most the limit per call
    assert retain(raw, length="1") == [1, 3, 1]
    assert logview.seqs(r, qk) == [4]
    # and with apply "0" the stored retention is kept
    assert retain(raw, apply="0") == [1, 3, 0] and r.hget(qk.meta, "retain") == b"- 1"


def test_retain_by_age_reads_the_publish_time(raw):
    r, qk, gk, s = raw
    publish(raw, b"a", now=NOW)
    publish(raw, b"b", now=NOW + 10_000)
    s.join(keys=gk, args=group_argv("g", "c1", NOW, None, 10_000, INC))
    retain(raw, age="5000")
    s.settle_to(keys=gk, args=group_argv("g", "", NOW, None, 2, 0, 100))
    assert retain(raw, age="5000", now=NOW + 12_000) == [1, 1, 1]
    assert retain(raw, age="5000", now=NOW + 15_000) == [1, 2, 1]


def test_retain_leaves_retention_mode_once_nothing_is_stored(raw):
    r, qk, gk, s = raw
    publish(raw, b"a")
    s.join(keys=gk, args=group_argv("g", "c1", NOW, None, 10_000, INC))
    retain(raw, length="5")
    s.settle_to(keys=gk, args=group_argv("g", "", NOW, None, 1, 0, 100))
    assert retain(raw) == [0, 1, 1]
    assert r.hget(qk.meta, "retain") is None and logview.count(r, qk) == 0


@pytest.mark.parametrize(
    ("args", "fragment"),
    [(["x", "-", "1", 10], "ARGV[2]"), (["-", "1.5", "1", 10], "ARGV[3]"), (["-", "-", "1", 0], "ARGV[5]")],
)
def test_retain_refuses_bad_arguments(raw, client, args, fragment):
    _, qk, _, s = raw
    publish(raw, b"a")
    with nothing_changes(client), pytest.raises(redis.ResponseError, match=re.escape(fragment)):
        s.retain(keys=qk.retain_keys(), args=[NOW, *args])


def test_group_create_at_a_position_and_its_refusals(raw, client):
    r, qk, gk, s = raw
    publish(raw, b"a", b"b", b"c")
    hk = qk.group("h").as_list()
    assert s.group_create(keys=hk, args=group_argv("h", "", NOW, None, "seq", "2")) == [1, 3]
    assert r.hget(qk.floors, "h") == b"1"
    assert r.hmget(qk.group("h").state, "cursor", "since") == [b"1", b"3"]
    for mode, value, code in [
        ("seq", "5", "RQ_POSITION seq 5 is beyond the last published seq, 3"),
        ("seq", "x", "RQ_POSITION seq x is not a seq"),
        ("time", "-1", "RQ_POSITION time -1 is not a time"),
        ("later", "", "RQ_POSITION later is not a position"),
    ]:
        with nothing_changes(client), pytest.raises(redis.ResponseError, match=re.escape(code)):
            s.group_create(keys=gk, args=group_argv("g", "", NOW, None, mode, value))
    with nothing_changes(client), pytest.raises(redis.ResponseError, match="RQ_GROUP_EXISTS group h exists"):
        s.group_create(keys=hk, args=group_argv("h", "", NOW, None, "first", ""))


def test_group_reset_takes_back_what_was_in_flight_and_fences_its_tags(raw, client):
    r, qk, gk, s = raw
    publish(raw, b"a", b"b", b"c")
    s.join(keys=gk, args=group_argv("g", "c1", NOW, None, 10_000, INC))
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 2, "tok"))
    tags = [x for seq in (1, 2) for x in (seq, 1, "tok")]
    with nothing_changes(client), pytest.raises(redis.ResponseError, match="RQ_GROUP_BUSY 2 group g has 2"):
        s.group_reset(keys=gk, args=group_argv("g", "", NOW, None, "last", "", "0"))
    with nothing_changes(client), pytest.raises(redis.ResponseError, match="RQ_NO_GROUP group x does not exist"):
        s.group_reset(keys=qk.group("x").as_list(), args=group_argv("x", "", NOW, None, "last", "", "1"))
    assert s.group_reset(keys=gk, args=group_argv("g", "", NOW, None, "seq", "3", "1")) == [0, 2, 2]
    gkeys = qk.group("g")
    assert r.zcount(gkeys.lease, "-inf", "(+inf") == 0 and r.hget(gkeys.consumers, "c1") == b"0"
    assert r.hget(qk.meta, "retain") == b"- -"
    # the old tags settle nothing: seq 1 and 2 are at or below the new floor
    assert s.ack(keys=ack_keys(gk), args=ack_argv("c1", "0", *tags)) == [b"RQ_ACKED", b"RQ_ACKED"]
    assert r.hget(qk.floors, "g") == b"2"


def test_a_group_gets_a_new_generation_when_made_and_reset_and_fetch_returns_it_with_the_floor(raw):
    r, qk, gk, s = raw
    publish(raw, b"a", b"b", b"c")
    # given a group made by a join, and another made by group_create
    s.join(keys=gk, args=group_argv("g", "c1", NOW, None, 10_000, INC))
    hk = qk.group("h").as_list()
    s.group_create(keys=hk, args=group_argv("h", "", NOW, None, "first", ""))
    # then each has a generation of its own, counted in the meta
    assert (r.hget(qk.group("g").state, "gen"), r.hget(qk.group("h").state, "gen")) == (b"1", b"2")
    assert r.hget(qk.meta, "gens") == b"2"
    # when g's first two are fetched and acked with the next fetch
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 2, "t1"))
    reply = s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 0, "t2", 1, 1, "t1", 2, 1, "t1"))
    # then that reply carries the floor after its acks, and the generation
    assert reply[3:6] == [3, 2, b"1"]  # the floor as the acks left it, the generation as stored
    # when g is reset back to the start, then its generation is new, and the floor is the reset's
    s.group_reset(keys=gk, args=group_argv("g", "", NOW, None, "first", "", "0"))
    assert r.hget(qk.group("g").state, "gen") == b"3"
    assert s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 1, "t3"))[3:7] == [3, b"0", b"3", 1]
    # when the meta's count is lost (a meta hash made anew), then a reset still moves the generation up
    r.hdel(qk.meta, "gens")
    s.group_reset(keys=gk, args=group_argv("g", "", NOW, None, "first", "", "1"))
    assert r.hget(qk.group("g").state, "gen") == b"4" and r.hget(qk.meta, "gens") == b"4"
    # and a floor that is not a seq comes back as stored, which the client reads as none (-1)
    r.hset(qk.floors, "g", "x")
    reply = s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 0, "t4"))
    assert reply[4:6] == [b"x", b"4"]
    assert (commands.parse_fetch(reply, "t4", 0).floor, commands.parse_fetch(reply, "t4", 0).generation) == (-1, 4)
    # and a group whose hash has no generation (made by an older rqueue) returns 0
    r.hdel(qk.group("g").state, "gen")
    assert s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 0, "t5"))[5] == 0


def test_group_delete_removes_the_group_keys(raw, client):
    r, qk, gk, s = raw
    publish(raw, b"a")
    s.join(keys=gk, args=group_argv("g", "c1", NOW, None, 10_000, INC))
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 1, "tok"))
    with nothing_changes(client), pytest.raises(redis.ResponseError, match="RQ_GROUP_BUSY 1"):
        s.group_delete(keys=gk, args=group_argv("g", "", NOW, None, "0"))
    assert s.group_delete(keys=gk, args=group_argv("g", "", NOW, None, "1")) == [1]
    assert r.hlen(qk.floors) == 0
    assert [k for k in qk.group("g").group_only() if r.exists(k)] == []
    assert logview.count(r, qk) == 1


def test_status_by_id_and_by_seq_per_group(raw, client):
    r, qk, gk, s = raw
    publish(raw, b"a", b"b", ids=["x", ""])
    s.join(keys=gk, args=group_argv("g", "c1", NOW, None, 10_000, INC))
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 1, "tok"))

    def status(msg_id, seq):
        return s.status(keys=qk.status_keys(msg_id, ["g"]), args=[NOW, seq, 100, "g"])

    assert status("x", "") == [1, 1, 2, str(NOW).encode(), b"", b"g", b"in-flight", b"c1", 1, b""]
    assert status(None, 2)[5:] == [b"g", b"pending", b"", 0, b""]
    assert status("nope", "") == [0, 0, 2, b"", b""]
    assert status(None, 3) == [0, 3, 2, b"", b""]
    with nothing_changes(client), pytest.raises(redis.ResponseError, match="RQ_BAD_ARGUMENT the seq"):
        status(None, "1.5")


def test_set_aside_dead_letters_each_tag_and_names_the_refused_ones(raw):
    # given three deliveries of one fetch, the second of them acked
    r, qk, gk, s = raw
    publish(raw, b"a", b"b", b"c")
    s.join(keys=gk, args=group_argv())
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 10, "t1"))
    s.ack(keys=ack_keys(gk), args=ack_argv("c1", "1", 2, 1, "t1"))
    tags = []
    for seq, event in ((1, "expired"), (2, ""), (3, "failed")):
        tags += [seq, 1, "t1", "expired" if event == "expired" else "corrupted-record", f"why {seq}", event]
    # when all three are set aside in one call
    reply = s.set_aside(keys=settle_keys(gk), args=group_argv("g", "c1", NOW, None, "", *tags))
    # then the first and the third are dead letters 1 and 2, and the acked one is named, changed nothing
    assert reply == [1, b"RQ_ACKED", 2]
    dead = logview.records(r, qk.dead_letters)
    assert sorted(dead) == [1, 2]
    assert r.hmget(qk.group("g").deliveries, 1, 2, 3) == [None, None, None]
    assert commands.parse_set_aside(reply) == [1, "RQ_ACKED", 2]


def test_set_aside_keeps_the_failure_of_each_message_it_dead_letters(raw):
    # given two deliveries, the second of them acked
    r, qk, gk, s = raw
    publish(raw, b"a", b"b")
    s.join(keys=gk, args=group_argv())
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 10, "t1"))
    s.ack(keys=ack_keys(gk), args=ack_argv("c1", "1", 2, 1, "t1"))
    tags = [1, 1, "t1", "expired", 'late "by" 1 s', "", 2, 1, "t1", "expired", "late", ""]
    # when both are set aside keeping results for 60 s
    result_keys = [qk.result(1, "g"), qk.result(2, "g")]
    reply = s.set_aside(
        keys=[*gk[:17], *call_keys_of(gk), *result_keys, *side_of(gk)],
        args=group_argv("g", "c1", NOW, None, 60_000, *tags),
    )
    # then the first is a dead letter whose failure, as the client decodes one, is kept after the
    # queue's incarnation; the acked one keeps none
    assert reply == [1, b"RQ_ACKED"]
    kept = r.get(result_keys[0])
    assert decode_result(1, kept, INC) == Result(1, None, Failure("expired", 'late "by" 1 s'))
    assert 0 < r.pttl(result_keys[0]) <= 60_000
    assert r.exists(result_keys[1]) == 0


def test_set_aside_keeps_the_reason_its_dead_letter_got(raw, client):
    # given a delivery whose record is deleted before it is set aside as expired
    r, qk, gk, s = raw
    publish(raw, b"a")
    s.join(keys=gk, args=group_argv())
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 10, "t1"))
    logview.delete(r, qk, 1)
    # when it is set aside keeping results
    key = qk.result(1, "g")
    assert s.set_aside(
        keys=[*gk[:17], *call_keys_of(gk), key, *side_of(gk)],
        args=group_argv("g", "c1", NOW, None, 1000, 1, 1, "t1", "expired", "late", ""),
    ) == [1]
    # then its result says what its dead letter says: missing-record, with the dead letter's text
    [dead] = client.queue("orders").dead_letters()
    result = decode_result(1, r.get(key), INC)
    assert (dead.reason, result.failure.reason, result.failure.error) == (
        "missing-record",
        "missing-record",
        dead.error,
    )


def test_set_aside_puts_a_not_due_delivery_back_to_wait_unrun(raw, client):
    # given a delivery held by c1
    r, qk, gk, s = raw
    publish(raw, b"a")
    s.join(keys=gk, args=group_argv())
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 10, "t1"))
    # when its client sets it aside as handed out before its time
    assert s.set_aside(
        keys=[*gk[:17], *call_keys_of(gk), *side_of(gk)],
        args=group_argv("g", "c1", NOW, None, "", 1, 1, "t1", "not-due", NOW + 60_000, ""),
    ) == [b"deferred"]
    # then it waits in the group's delay set until then, with no delivery state, lease or holder
    q = client.queue("orders")
    group = q.keys.group("g")
    assert r.zrange(group.delay, 0, -1, withscores=True) == [(b"1", NOW + 60_000)]
    assert r.hexists(group.deliveries, 1) == 0 and r.zscore(group.lease, 1) is None
    assert int(r.hget(group.consumers, "c1")) == 0
    # and it is no dead letter; a corrupt event names it
    assert q.dead_letters() == []
    assert [(e["event"], e["seq"]) for e in q.events()] == [("corrupt", "1")]


@pytest.mark.parametrize(
    ("ttl", "tail", "result_keys"),
    [
        ("", [1, 1, "t1", "expired", "why"], 0),  # five, not six
        ("", [1, 1, "t1", "expired", "why", "acked"], 0),  # no such event
        ("1.5", [1, 1, "t1", "expired", "why", ""], 0),  # a ttl that is no whole number of ms
        ("99999999999999999999", [1, 1, "t1", "expired", "why", ""], 1),  # past what SET PX takes
        (1000, [1, 1, "t1", "expired", "why", ""], 0),  # no result key
        (1000, [1, 1, "t1", "expired", "why", ""], 2),  # the key of another seq
        (1000, ["01", 1, "t1", "expired", "why", ""], 1),  # a seq not written as one
        ("", [1, 1, "t1", "not-due", "soon", ""], 0),  # a not-before that is no time in ms
        ("", [1, 1, "t1", "not-due", "1000", "failed"], 0),  # a not-due tag with an event
    ],
)
def test_set_aside_refuses_a_malformed_call_and_changes_nothing(raw, client, ttl, tail, result_keys):
    # given a delivery held
    _, qk, gk, s = raw
    publish(raw, b"a")
    s.join(keys=gk, args=group_argv())
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 10, "t1"))
    keys = [*gk[:17], *call_keys_of(gk), *[qk.result(seq, "g") for seq in range(result_keys, 0, -1)][:1], *side_of(gk)]
    # when set_aside is sent its tags wrongly, then it is refused by name and nothing changes
    with nothing_changes(client), pytest.raises(redis.ResponseError, match=r"^RQ_BAD_ARGUMENT "):
        s.set_aside(keys=keys, args=group_argv("g", "c1", NOW, None, ttl, *tail))


def test_set_aside_without_its_time_to_live_is_refused_by_name(raw, client):
    _, _, gk, s = raw
    with nothing_changes(client), pytest.raises(redis.ResponseError, match=r"^RQ_BAD_ARGUMENT set_aside takes"):
        s.set_aside(keys=settle_keys(gk), args=group_argv("g", "c1", NOW, None))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_no_helper_name_is_defined_twice_across_the_includes_and_a_script(layout):
    # A script that takes in two definitions of one name calls whichever stands nearer above each
    # call, which the loader's lazy regions may reorder. Each layout's text is its own (a helper
    # may have one definition per --@layout block, as group_keys.lua's deliveriesOut has).
    defined: dict[str, str] = {}
    for path in sorted((lua_dir() / "includes").glob("*.lua")):
        text = select_layout(path.read_text(), layout, path.name)
        for name in re.findall(r"^local function (\w+)", text, re.MULTILINE):
            assert name not in defined, f"{name} is defined in includes/{defined[name]} and includes/{path.name}"
            defined[name] = path.name
    for script in SCRIPT_NAMES:
        text = select_layout((lua_dir() / f"{script}.lua").read_text(), layout, f"{script}.lua")
        for name in re.findall(r"^local function (\w+)", text, re.MULTILINE):
            assert name not in defined, f"{script}.lua defines {name}, as includes/{defined[name]} does"


def test_set_aside_refuses_a_tag_whose_delivery_state_does_not_parse_and_settles_the_others(raw):
    # given three deliveries, the second's delivery state damaged
    r, qk, gk, s = raw
    publish(raw, b"a", b"b", b"c")
    s.join(keys=gk, args=group_argv())
    s.fetch(keys=gk, args=group_argv("g", "c1", NOW, None, 10, "t1"))
    r.hset(qk.group("g").deliveries, 2, "garbage")
    tags = []
    for seq in (1, 2, 3):
        tags += [seq, 1, "t1", "expired", "late", ""]
    # when the three are set aside in one call
    reply = s.set_aside(keys=settle_keys(gk), args=group_argv("g", "c1", NOW, None, "", *tags))
    # then the two others are dead letters, and the damaged one is named, its state left as it was
    assert reply == [1, b"RQ_CORRUPT", 2]
    assert r.hget(qk.group("g").deliveries, 2) == b"garbage"


def test_a_group_view_knows_once_which_text_each_of_its_key_lists_runs(client, queue):
    # given a consumer's view of its group (the layout the run chose)
    c = queue.consumer("g")
    call = c._group_call()
    # then each key list's flag is sent_stream_log of that list, worked out once
    assert call.keys_stream == sent_stream_log(call.keys)
    assert call.fetch_keys_stream == sent_stream_log(call.fetch_keys)
    assert call.ack_keys_stream == sent_stream_log(call.ack_keys)
    assert call.settle_keys_stream == sent_stream_log(call.settle_keys)
    assert call.fetch_keys_stream == queue.keys.msgs.endswith(":log")


def test_a_group_named_log_fetches_and_acks_in_either_layout(client, queue):
    # given a group whose state key ends in ":log" (the stream text runs
    # for it in the hash layout too: sent_stream_log)
    queue.publish_many([b"a", b"b", b"c"])
    c = queue.consumer("log")
    assert c._group_call().keys_stream
    # when it fetches, acks, and acks and fetches
    got = c.fetch(2)
    c.ack(got)
    statuses, more, _ = c.ack_and_fetch([], 5)
    # then the replies read right: every message once, in order, all acked at the end
    assert [d.data for d in got + more] == [b"a", b"b", b"c"] and statuses == []
    c.ack(more)
    assert queue.stats().group("log").acked == 3
