"""The Lua scripts' text: one file per command in lua/, with the includes
it names expanded.

A line ``--@include name`` pulls in ``lua/includes/name.lua`` (once per
script, an include's own includes first); the includes' top-level helpers
that the script never calls are left out. ``--@lazy name inc ...`` pulls in
includes whose helpers are made only where a ``--@make name`` line stands
(see make_lazy).
"""

from __future__ import annotations

import re
from collections import Counter
from functools import cache
from pathlib import Path

_DIRECTIVE = re.compile(r"^--@(include|lazy)[ \t]+(\w+)((?:[ \t]+\w+)*)[ \t]*$", re.MULTILINE)
_MAKE = re.compile(r"^([ \t]*)--@make[ \t]+(\w+)[ \t]*\n", re.MULTILINE)
_LAZY_REGION = re.compile(r"^--@lazy-begin (\w+)\n(.*?)^--@lazy-end\n", re.MULTILINE | re.DOTALL)
_COMMENT = re.compile(r"--\[\[.*?\]\]|--[^\n]*", re.DOTALL)
# A top-level helper of an include: "local function name(" at the start of a
# line, up to the first "end" alone at the start of a line (the scripts'
# layout; nested functions are indented).
_TOP_FUNCTION = re.compile(r"^local function (\w+)\(.*?^end\n", re.MULTILINE | re.DOTALL)
# A top-level helper with the comment lines right above it, moved together.
_NOTED_FUNCTION = re.compile(r"(?:^--(?!\[\[)[^\n]*\n)*" + _TOP_FUNCTION.pattern, re.MULTILINE | re.DOTALL)
_WORD = re.compile(r"\w+")

SCRIPT_NAMES = (
    "publish",
    "fetch",
    "ack",
    "nack",
    "reject",
    "extend",
    "heartbeat",
    "join",
    "leave",
    "purge",
    "replay",
    "stats",
)


def lua_dir() -> Path:
    """The scripts' folder, beside this module."""
    return Path(__file__).resolve().parent / "lua"


@cache
def source(name: str) -> str:
    """The full text of script ``name`` with its includes expanded."""
    root = lua_dir()
    seen: set[str] = set()

    def include(inc: str) -> str:
        if inc in seen:
            return ""
        seen.add(inc)
        return _DIRECTIVE.sub(expand, root.joinpath("includes", f"{inc}.lua").read_text())

    def expand(match: re.Match[str]) -> str:
        kind, first, rest = match.groups()
        if kind == "include":
            if rest.strip():
                raise ValueError(f"{match.group(0)!r}: --@include takes one name")
            return include(first)
        if not rest.strip():
            raise ValueError(f"{match.group(0)!r}: --@lazy takes a loader name, then the includes it makes")
        return f"--@lazy-begin {first}\n" + "".join(include(inc) for inc in rest.split()) + "--@lazy-end\n"

    return make_lazy(drop_unused(_DIRECTIVE.sub(expand, root.joinpath(f"{name}.lua").read_text())))


def drop_unused(text: str) -> str:
    """``text`` without the top-level local functions nothing calls. Every
    local function is made anew (a closure) on each script call, about 750
    Redis instructions each, so a script pays only for the helpers it uses."""
    while True:
        words = Counter(_WORD.findall(text))
        unused = [m for m in _TOP_FUNCTION.finditer(text) if words[m.group(1)] == 1]  # only its own definition
        if not unused:
            return text
        for m in unused:
            # The span must be one function: a one-line function, an "end"
            # followed by a comment, or a long string or comment ([[ ]]) that
            # holds "end" at column 0 would cut it wrongly.
            span = m.group(0)
            inner = span.split("\n")[1:-2]
            if (
                span.split("\n", 1)[0].rstrip().endswith("end")
                or "[[" in span
                or any(line[:1].strip() for line in inner)
            ):
                raise ValueError(
                    f"cannot tell where the Lua helper {m.group(1)!r} ends: write it over several "
                    "lines, its body indented, closed by 'end' alone at the start of a line"
                )
        for m in reversed(unused):
            text = text[: m.start()] + text[m.end() :]


def make_lazy(text: str) -> str:
    """Helpers of a ``--@lazy name`` region made where ``--@make name`` stands.

    The region's constants stay where they are and its top-level helpers
    become locals declared there, still nil. Each ``--@make name`` line is
    replaced by their definitions, run only when the first of them is still
    nil. A script puts it on the paths that need them (a failure, a
    redelivery), so the common call builds none: every closure a call makes
    costs Redis about 1,500 instructions (the closure, the upvalues it binds,
    their collection). A loader function would not do: making it binds every
    upvalue its helpers use, on every call.
    """
    regions = {m.group(1): m for m in _LAZY_REGION.finditer(text)}
    if not regions:
        return text
    helpers = {name: list(_NOTED_FUNCTION.finditer(m.group(2))) for name, m in regions.items()}
    nested = [h.group(1) for found in helpers.values() for h in found if _MAKE.search(h.group(0))]
    if nested:
        raise ValueError(f"--@make inside the lazy helper {', '.join(nested)}: its copy would keep the directive")

    def region(match: re.Match[str]) -> str:
        name = match.group(1)
        names = [h.group(1) for h in helpers[name]]
        # Named above the region, a helper would be read as a global there.
        above = _COMMENT.sub("", text[: match.start()])
        early = [n for n in names if re.search(rf"\b{n}\b", above)]
        if early:
            raise ValueError(f"--@lazy {name}: {', '.join(early)} named above the region that defines them")
        constants = re.sub(r"\n{3,}", "\n\n", _NOTED_FUNCTION.sub("", match.group(2)))
        if not names:  # the script calls none of them
            return constants
        return f"{constants}local {', '.join(names)} -- made where --@make {name} stands\n"

    def make(match: re.Match[str]) -> str:
        indent, name = match.group(1), match.group(2)
        if name not in regions or regions[name].start() > match.start():
            raise ValueError(f"--@make {name}: no --@lazy {name} region above it")
        found = helpers[name]
        if not found:
            return ""
        shadowed = _free_names("".join(h.group(0) for h in found)) & _visible_block_locals(text, match.start())
        if shadowed:
            raise ValueError(
                f"--@make {name}: {', '.join(sorted(shadowed))} would be read from the enclosing "
                "block, not from the top level its helpers were written for"
            )
        bodies = "".join(
            re.sub(r"^local function ", "function ", h.group(0), count=1, flags=re.MULTILINE) for h in found
        )
        return f"{indent}if {found[0].group(1)} == nil then\n{bodies}{indent}end\n"

    made = {m.group(2) for m in _MAKE.finditer(text)}
    text = _MAKE.sub(make, text)
    unused = [name for name in regions if name not in made and helpers[name]]
    if unused:
        raise ValueError(f"--@lazy {', '.join(unused)}: no --@make to define its helpers")
    return _LAZY_REGION.sub(region, text)


_LUA_KEYWORDS = frozenset(
    [
        "and",
        "break",
        "do",
        "else",
        "elseif",
        "end",
        "false",
        "for",
        "function",
        "if",
        "in",
        "local",
        "nil",
        "not",
        "or",
        "repeat",
        "return",
        "then",
        "true",
        "until",
        "while",
    ]
)
_STRING = re.compile(r"'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\"")
_DECLARED = re.compile(
    r"\blocal\s+function\s+(\w+)\s*\(([^)]*)\)|\blocal\s+(\w+(?:\s*,\s*\w+)*)|\bfunction\b[^(\n]*\(([^)]*)\)"
    r"|\bfor\s+(\w+(?:\s*,\s*\w+)*)\s+(?:in|=)"
)


def _declared(code: str) -> set[str]:
    """Names that ``code`` declares: locals, parameters, loop variables."""
    out: set[str] = set()
    for m in _DECLARED.finditer(code):
        out.update(re.findall(r"\w+", " ".join(g or "" for g in m.groups())))
    return out


def _free_names(code: str) -> set[str]:
    """Names ``code`` reads that it does not declare (globals included;
    field names after "." or ":" left out)."""
    bare = _STRING.sub("''", _COMMENT.sub("", code))
    words = set(re.findall(r"(?<![.:\w])[A-Za-z_]\w*", bare))
    return words - _LUA_KEYWORDS - _declared(bare)


def _visible_block_locals(text: str, pos: int) -> set[str]:
    """Names declared in the blocks that enclose ``pos`` (not at the top
    level), read from the scripts' two-space indentation."""
    names: set[str] = set()
    *lines, site = text[:pos].split("\n")
    site += text[pos:].split("\n", 1)[0]
    limit = len(site) - len(site.lstrip())
    for line in reversed(lines):
        if limit == 0:
            break
        code = _STRING.sub("''", _COMMENT.sub("", line))
        if not code.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if indent < limit:
            limit = indent  # the line that opens an enclosing block: its parameters and loop variables count
            names |= _declared(code)
        elif indent == limit:
            names |= {
                w
                for m in re.finditer(r"\blocal\s+(?:function\s+)?(\w+(?:\s*,\s*\w+)*)", code)
                for w in re.findall(r"\w+", m.group(1))
            }
    return names
