"""rqueue's scripts as one Redis Functions library (a prototype).

Each script becomes ``redis.register_function('rq_<name>', ...)`` inside its
own ``do ... end`` block of the library (so its locals, and its includes',
stay apart from the other scripts' and under Lua's 200 locals). The script
is assembled as the loader does, but without make_lazy: the lazy helpers
need no laziness when they are made once, at FUNCTION LOAD.

The script's top-level statements are sorted into:

- hoisted, run once at load: ``local function`` helpers (the includes' and
  the script's own), constants (``local X = <number or string literal>``
  never assigned again; not ``local rcall = redis.call``: during FUNCTION
  LOAD ``redis`` holds register_function and log only), forward
  declarations whose every name is a hoisted helper;
- per call, in their order, inside the registered function: everything
  else (``local x = <expression>``, ``local settledFloor = nil``, KEYS and
  ARGV, ``if``/``for``/``do`` blocks, ``return``).

A name a per-call statement declares stays a local of the registered
function unless a hoisted helper reads or writes it: it is then a local of
the library's block ("shared"), declared at its top, and the statement that
declared it becomes an assignment, so every call sets it again before any
helper runs (``local settledFloor = nil`` turns into ``settledFloor = nil``
at the same place). KEYS and ARGV are treated so too: the function's
parameters are ``(keys, args)`` and its first statements are
``local KEYS = keys`` and ``local ARGV = args``, or, for one a helper
reads, the assignment to the block's local.

The analysis is lexical (a Lua tokenizer, no parser): a name counts as read
wherever it stands as a word not after ``.`` or ``:``, so a helper's own
local of the same name makes a per-call local shared needlessly (harmless).
It relies on the scripts' layout, as the loader does: a top-level statement
starts at column 0.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field

from rqueue.engine.loader import (
    _LAZY_REGION,
    _LUA_KEYWORDS,
    SCRIPT_NAMES,
    drop_unused,
    expand_includes,
    flags,
    lua_dir,
    source,
)

# Scripts that only read. A script without flags sent by EVAL (no shebang)
# is refused at maxmemory only at its first write; a function without flags
# is refused before it runs, so a read-only one must say no-writes (which
# also lets FCALL_RO run it on a replica).
READ_ONLY = frozenset(("stats", "status"))

_TOKEN = re.compile(
    r"""
    (?P<space>[ \t\r\n]+)
  | (?P<longcomment>--\[(?P<lceq>=*)\[.*?\](?P=lceq)\])
  | (?P<comment>--[^\n]*)
  | (?P<longstring>\[(?P<lseq>=*)\[.*?\](?P=lseq)\])
  | (?P<string>'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*")
  | (?P<number>0[xX][0-9a-fA-F]+|\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)
  | (?P<name>[A-Za-z_]\w*)
  | (?P<op>\.\.\.|\.\.|==|~=|<=|>=|[-+*/%^\#<>=(){}\[\];:,.])
    """,
    re.VERBOSE | re.DOTALL,
)


@dataclass
class Token:
    kind: str
    text: str
    start: int
    line_start: bool  # the first token of its line, at column 0


def tokens(text: str) -> list[Token]:
    out: list[Token] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ValueError(f"cannot tokenize at {text[pos : pos + 40]!r}")
        kind = m.lastgroup or ""
        if kind in ("lceq", "lseq"):
            kind = "longcomment" if m.group("longcomment") else "longstring"
        if kind not in ("space", "comment", "longcomment"):
            col0 = pos == 0 or text[pos - 1] == "\n"
            out.append(Token(kind, m.group(0), pos, col0))
        pos = m.end()
    return out


@dataclass
class Statement:
    text: str
    toks: list[Token]
    kind: str = "call"  # hoist-function, hoist-const, hoist-forward, per-call
    declares: list[str] = field(default_factory=list)
    region: str | None = None  # the --@lazy region it stands in


def statements(text: str) -> list[Statement]:
    """The top-level statements of a chunk, cut where a token at column 0
    stands at block and bracket depth 0."""
    toks = tokens(text)
    starts: list[int] = []
    depth = 0
    brackets = 0
    for i, t in enumerate(toks):
        if t.line_start and depth == 0 and brackets == 0 and t.text not in ("end", "until"):
            starts.append(i)
        if t.kind == "name":
            if t.text in ("function", "do", "if", "repeat"):
                depth += 1
            elif t.text in ("end", "until"):
                depth -= 1
        elif t.kind == "op":
            if t.text in "({[":
                brackets += 1
            elif t.text in ")}]":
                brackets -= 1
    if depth != 0 or brackets != 0:
        raise ValueError(f"unbalanced: depth {depth}, brackets {brackets}")
    out = []
    for a, b in zip(starts, [*starts[1:], len(toks)], strict=True):
        # the statement's text, up to its last token: the comments before the
        # next statement are left out
        last = toks[b - 1]
        body = text[toks[a].start : last.start + len(last.text)]
        out.append(Statement(body + "\n", toks[a:b]))
    return out


def free_names(toks: list[Token]) -> set[str]:
    """Every name read or written as a variable (not a field after . or :)."""
    out = set()
    for i, t in enumerate(toks):
        if t.kind != "name" or t.text in _LUA_KEYWORDS:
            continue
        if i > 0 and toks[i - 1].kind == "op" and toks[i - 1].text in (".", ":"):
            continue
        out.add(t.text)
    return out


def assigned_names(all_toks: list[Token]) -> set[str]:
    """Names that stand as a target of an assignment somewhere (a crude
    look: NAME followed by '=' or ',' ... '=' in a name list)."""
    out = set()
    for i, t in enumerate(all_toks):
        if t.kind != "name" or t.text in _LUA_KEYWORDS:
            continue
        if i > 0 and all_toks[i - 1].kind == "op" and all_toks[i - 1].text in (".", ":"):
            continue
        j = i + 1
        while j < len(all_toks) and all_toks[j].text == ",":
            j += 2  # ", name"
        if j < len(all_toks) and all_toks[j].text == "=":
            out.add(t.text)
    return out


def classify(stmts: list[Statement]) -> None:
    for s in stmts:
        t = s.toks
        if t[0].text == "local" and t[1].text == "function":
            s.kind, s.declares = "hoist-function", [t[2].text]
        elif t[0].text == "function" and t[1].kind == "name" and t[2].text == "(":
            s.kind, s.declares = "assign-function", [t[1].text]
        elif t[0].text == "local":
            names = []
            i = 1
            while i < len(t) and t[i].kind == "name":
                names.append(t[i].text)
                if i + 1 < len(t) and t[i + 1].text == ",":
                    i += 2
                else:
                    i += 1
                    break
            s.declares = names
            rest = t[i:]
            if not rest:
                s.kind = "forward"
            elif (
                rest[0].text == "="
                and len(names) == 1
                and (
                    (len(rest) == 2 and rest[1].kind in ("number", "string", "longstring"))
                    or (len(rest) == 3 and rest[1].text == "-" and rest[2].kind == "number")
                )
            ):
                s.kind = "const"
            else:
                s.kind = "per-call"
        else:
            s.kind = "per-call"


# The globals the scripts may read (Redis's Lua 5.1 sandbox).
LUA_GLOBALS = frozenset(
    (
        "redis",
        "cjson",
        "cmsgpack",
        "bit",
        "struct",
        "string",
        "table",
        "math",
        "tonumber",
        "tostring",
        "type",
        "pairs",
        "ipairs",
        "next",
        "select",
        "unpack",
        "error",
        "pcall",
        "assert",
        "setmetatable",
        "getmetatable",
        "rawget",
        "rawset",
        "rawequal",
        "_G",
        "keys",
        "args",
    )
)


def undeclared(lua: str) -> set[str]:
    """Names the library reads that nothing in it declares and that are not
    Lua's or Redis's globals: each would be a global read, an error in a
    function ("Script attempted to access nonexistent global variable").
    Lexical and generous (a declaration anywhere counts), so it finds a name
    misspelt or left out, not one read out of its scope."""
    from rqueue.engine.loader import _code, _declared

    if lua.startswith("#!"):
        lua = lua.split("\n", 1)[1]
    toks = tokens(lua)
    declared = _declared(_code(lua, strings=False))
    # leave out the keys of table constructors ({name = value, ...})
    read: list[Token] = []
    stack: list[str] = []
    for i, t in enumerate(toks):
        if t.kind == "op" and t.text in "({[":
            stack.append(t.text)
        elif t.kind == "op" and t.text in ")}]":
            stack.pop()
        is_key = (
            stack[-1:] == ["{"]
            and i + 1 < len(toks)
            and toks[i + 1].text == "="
            and toks[i - 1].text in ("{", ",", ";")
        )
        if not is_key:
            read.append(t)
    return free_names(read) - declared - LUA_GLOBALS - _LUA_KEYWORDS


@dataclass
class Built:
    name: str
    lua: str
    defined_twice: list[str]
    hoisted_functions: list[str]
    hoisted_consts: list[str]
    shared: list[str]
    body_locals: list[str]
    body_upvalues: set[str]
    kept_consts: list[str]


def build_script(name: str, fname: str | None = None) -> Built:
    text = drop_unused(expand_includes(lua_dir(), name))
    # The --@lazy-begin/end lines are comments: kept, to tell which
    # statements a lazy region holds.
    regions = [(m.start(), m.end(), m.group(1)) for m in _LAZY_REGION.finditer(text)]
    stmts = statements(text)
    for st in stmts:
        st.region = next((r for a, b, r in regions if a <= st.toks[0].start < b), None)
    classify(stmts)
    all_toks = [t for s in stmts for t in s.toks]
    assigned_anywhere = assigned_names(all_toks)
    # names declared at the top level, to spot a name declared twice
    declared_count: dict[str, int] = {}
    for s in stmts:
        if s.kind in ("hoist-function", "const", "forward", "per-call") and s.toks[0].text == "local":
            for n in s.declares:
                declared_count[n] = declared_count.get(n, 0) + 1
    hoisted_fn_names = {n for s in stmts if s.kind in ("hoist-function", "assign-function") for n in s.declares}
    for s in stmts:
        if s.kind == "const":
            # a constant written again anywhere is per-call state
            decl_assign = sum(
                1
                for i, t in enumerate(all_toks)
                if t.text == s.declares[0] and i + 1 < len(all_toks) and all_toks[i + 1].text == "="
            )
            if s.declares[0] in assigned_anywhere and decl_assign > 1:
                s.kind = "per-call"
        if s.kind == "forward":
            s.kind = "hoist-forward" if all(n in hoisted_fn_names for n in s.declares) else "per-call-forward"
    dup = sorted(n for n, c in declared_count.items() if c > 1)
    hoisted = [s for s in stmts if s.kind in ("hoist-function", "assign-function", "hoist-forward")]
    consts = [s for s in stmts if s.kind == "const"]
    per_call = [s for s in stmts if s.kind in ("per-call", "per-call-forward")]
    # names per-call statements declare, with KEYS and ARGV
    per_call_names = {"KEYS", "ARGV"}
    for s in per_call:
        if s.toks[0].text == "local":
            per_call_names.update(s.declares)
    read_by_hoisted = set()
    for s in hoisted:
        read_by_hoisted |= free_names(s.toks)
    shared = sorted(per_call_names & read_by_hoisted)
    bad_dup = [n for n in dup if n in shared or n in {c.declares[0] for c in consts}]
    dup_fns = [n for n in dup if n in hoisted_fn_names]
    if bad_dup:
        raise ValueError(f"{name}: names declared twice at the top level, per call or constant: {bad_dup}")
    # the body's reads of library-level names (upvalues)
    body_names = set()
    for s in per_call:
        body_names |= free_names(s.toks)
    body_local = set()
    for s in per_call:
        if s.toks[0].text == "local":
            body_local.update(n for n in s.declares if n not in shared)
    const_names = [c.declares[0] for c in consts]
    lib_names = set(shared) | hoisted_fn_names | set(const_names)
    upvalues = (body_names & lib_names) - body_local
    # A helper defined twice in one lazy region (record.lua's and
    # retry_or_dead_letter.lua's recordPublished): make_lazy declares the
    # name once for the region and each definition assigns it, so every
    # caller, before or after, gets the last one. Kept so: one library
    # local, assigned by each definition in turn.
    single = [
        n
        for n in dup_fns
        if len({st.region for st in stmts if n in st.declares and st.kind == "hoist-function"} - {None}) == 1
        and all(st.region is not None for st in stmts if n in st.declares)
    ]
    for n in dup_fns:
        if n in single:
            continue
        # a helper defined twice: the body must see the same one it saw
        # before; with both definitions hoisted it sees the last one
        last = max(i for i, s in enumerate(stmts) if n in s.declares)
        first_use = min(
            (i for i, s in enumerate(stmts) if s in per_call and n in free_names(s.toks)),
            default=len(stmts),
        )
        if first_use < last:
            raise ValueError(f"{name}: helper {n} is defined twice and the body reads it between")
    # keep constants the body reads as locals of the body too when the
    # upvalues would pass Lua 5.1's 60
    kept_consts: list[str] = []
    if len(upvalues) > 60:
        for c in const_names:
            if c in upvalues:
                kept_consts.append(c)
        upvalues -= set(kept_consts)
    fname = fname or f"rq_{name}"
    lines = [f"-- {name}.lua\ndo\n"]
    if shared:
        for i in range(0, len(shared), 10):
            lines.append(f"local {', '.join(shared[i : i + 10])}\n")
    if single:
        lines.append(f"local {', '.join(single)} -- defined twice in a lazy region: the last one counts\n")
    for s in stmts:
        if s.kind in ("hoist-function", "assign-function", "hoist-forward", "const"):
            if s.kind == "hoist-function" and s.declares[0] in single:
                lines.append(re.sub(r"^local function ", "function ", s.text, count=1))
            else:
                lines.append(s.text)
    body = []
    for var, param in (("KEYS", "keys"), ("ARGV", "args")):
        body.append(f"{var} = {param}\n" if var in shared else f"local {var} = {param}\n")
    for c in consts:
        if c.declares[0] in kept_consts:
            body.append(c.text)
    for s in per_call:
        txt = s.text
        if s.toks[0].text == "local" and s.toks[1].text != "function":
            sh = [n for n in s.declares if n in shared]
            if sh:
                rest_names = [n for n in s.declares if n not in shared]
                # "local a, b = e" -> "local b; a, b = e", "local a" -> "a = nil"
                m = re.match(r"local\s+[\w\s,]*?(?=(=|$|\n|--))", txt)
                assert m is not None
                tail = txt[m.end() :]
                prefix = f"local {', '.join(rest_names)}; " if rest_names else ""
                if s.kind == "per-call-forward" or not tail.lstrip().startswith("="):
                    txt = prefix + ", ".join(s.declares) + " = nil" + tail
                else:
                    txt = prefix + ", ".join(s.declares) + " " + tail
        body.append(txt)
    flag = flags(name) + (("no-writes",) if name in READ_ONLY else ())
    flagtext = f", flags = {{{', '.join(repr(f) for f in flag)}}}" if flag else ""
    lines.append(
        f"redis.register_function{{function_name = '{fname}', callback = function(keys, args)\n"
        + "".join(body)
        + f"end{flagtext}}}\n"
    )
    lines.append("end\n")
    return Built(
        name,
        "".join(lines),
        single,
        sorted(hoisted_fn_names),
        const_names,
        shared,
        sorted(body_local),
        upvalues,
        kept_consts,
    )


def wrap_script(name: str, fname: str | None = None) -> Built:
    """The control: the script as EVALSHA gets it (make_lazy included), whole
    inside the registered function; nothing hoisted."""
    text = source(name, shebang=False)
    flag = flags(name) + (("no-writes",) if name in READ_ONLY else ())
    flagtext = f", flags = {{{', '.join(repr(f) for f in flag)}}}" if flag else ""
    lua = (
        f"-- {name}.lua, wrapped\nredis.register_function{{function_name = '{fname or 'rq_' + name}', "
        f"callback = function(keys, args)\nlocal KEYS, ARGV = keys, args\n{text}\nend{flagtext}}}\n"
    )
    return Built(name, lua, [], [], [], [], [], set(), [])


def build_library(
    names: tuple[str, ...] = SCRIPT_NAMES, libname: str = "rqueue", wrap: bool = False
) -> tuple[str, list[Built]]:
    built = [wrap_script(n) if wrap else build_script(n) for n in names]
    return f"#!lua name={libname}\n" + "".join(b.lua for b in built), built


if __name__ == "__main__":
    wrap = "--wrap" in sys.argv
    names = tuple(a for a in sys.argv[1:] if a != "--wrap") or SCRIPT_NAMES
    lib, built = build_library(names, wrap=wrap)
    for b in built:
        print(
            f"{b.name}: {len(b.hoisted_functions)} helpers and {len(b.hoisted_consts)} constants hoisted, "
            f"{len(b.shared)} per-call names shared with helpers, {len(b.body_locals)} body locals, "
            f"{len(b.body_upvalues)} body upvalues, {len(b.kept_consts)} constants kept per call",
            file=sys.stderr,
        )
    missing = undeclared(lib)
    if missing:
        print(f"names read and never declared: {sorted(missing)}", file=sys.stderr)
    sys.stdout.write(lib)
