"""The Lua scripts' text: one file per command in lua/, with the includes
it names expanded.

Long because the directives' checks belong with their expansion: every
refusal names the file and the rule, where a split would part them.

A line ``--@include name`` pulls in ``lua/includes/name.lua``. An include
names what it needs with its own ``--@include`` lines, before its code;
each include is expanded once per script, its prerequisites first, so
every local stands before the code that reads it (see expand_includes).
``--@lazy region inc ...`` pulls in includes whose helpers are made only
where a ``--@make region`` line stands (see make_lazy). The includes'
top-level helpers that the script never calls are left out (see
drop_unused). A line ``--@flags allow-oom`` in a script declares the flags
Redis reads from a ``#!lua flags=...`` first line (see source).

Each script is built once per log layout (LAYOUTS, rqueue.engine.keys.
LogLayout). Lines ``--@layout stream`` and ``--@end`` (each alone on its
line, indented or not) enclose a block kept in the stream layout's text
only; ``--@layout hash`` ... ``--@end`` one kept in the hash layout's text
only. Blocks do not nest, and each is closed in the file that opens it;
an unknown layout, a nested or unterminated block, or an ``--@end`` with
no block open is refused (ValueError naming the file and line; see
select_layout). The blocks are cut from every file before its includes
are expanded, so an include named only inside one layout's block is
expanded in that layout's text alone, and a helper called only there is
dropped from the other's. A script whose files have no such block has one
text, shared by both layouts (see layout_texts).
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from dataclasses import dataclass
from functools import cache
from pathlib import Path

LAYOUTS = ("hash", "stream")
_LAYOUT_LINE = re.compile(r"^[ \t]*--@(layout|end)(?![\w-])([^\n]*)(?:\n|\Z)", re.MULTILINE)
_DIRECTIVE = re.compile(r"^--@(include|lazy)[ \t]+(\w+)((?:[ \t]+\w+)*)[ \t]*$", re.MULTILINE)
_FLAGS = re.compile(r"^--@flags((?:[ \t]+[a-z-]+)+)[ \t]*$", re.MULTILINE)
# The flags a script may declare: allow-oom lets a call that frees memory or
# holds what is already stored (an ack, a fetch of stored messages, a purge)
# run while Redis is at maxmemory, where a script without it is refused at
# its first write that can grow memory.
KNOWN_FLAGS = ("allow-oom",)
_MAKE = re.compile(r"^([ \t]*)--@make[ \t]+(\w+)[ \t]*\n", re.MULTILINE)
_LAZY_REGION = re.compile(r"^--@lazy-begin (\w+)\n(.*?)^--@lazy-end\n", re.MULTILINE | re.DOTALL)
_COMMENT = re.compile(r"--\[\[.*?\]\]|--[^\n]*", re.DOTALL)
_STRING = re.compile(r"'(?:[^'\\\n]|\\.)*'|\"(?:[^\"\\\n]|\\.)*\"")
# Comments and strings read from left to right, so that "--" in a string
# starts no comment and a quote in a comment starts no string.
_NOISE = re.compile(f"{_COMMENT.pattern}|{_STRING.pattern}", re.DOTALL)
# A top-level helper of an include: "local function name(" at the start of a
# line, up to the first "end" alone at the start of a line (the scripts'
# layout; nested functions are indented).
_TOP_FUNCTION = re.compile(r"^local function (\w+)\(.*?^end\n", re.MULTILINE | re.DOTALL)
# A top-level helper with the comment lines right above it, moved together.
_NOTED_FUNCTION = re.compile(r"(?:^--(?!\[\[)[^\n]*\n)*" + _TOP_FUNCTION.pattern, re.MULTILINE | re.DOTALL)
_WORD = re.compile(r"\w+")
# The words that open and close Lua blocks ("then" opens none of its own:
# "if" and "elseif" stand for it).
_BLOCK_WORD = re.compile(r"\b(function|do|repeat|if|elseif|else|end|until)\b")

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
    "schedule_fire",
    "repair",
    "settle_to",
    "publish_tracked",
    "retain",
    "group_create",
    "group_reset",
    "group_delete",
    "status",
    "partition",
    "pause",
    "ack_result",
    "set_aside",
    "migrate",
)


def lua_dir() -> Path:
    """The scripts' folder, beside this module."""
    return Path(__file__).resolve().parent / "lua"


@cache
def source(name: str, shebang: bool = True, layout: str = "hash") -> str:
    """The full text of script ``name`` for queues of log layout ``layout``
    (LAYOUTS) with its includes expanded; with ``shebang``, a first line
    ``#!lua flags=...`` with the flags the script declares (none: no such
    line). memory:// (fakeredis) reads no shebang and has no maxmemory: it
    is sent the text without one."""
    text = make_lazy(drop_unused(expand_includes(lua_dir(), name, layout)))
    declared = flags(name)
    if shebang and declared:
        return f"#!lua flags={','.join(declared)}\n{text}"
    return text


@cache
def script_sha(text: str) -> str:
    """The SHA1 that EVALSHA names ``text`` by: worked out once per text in
    a process, not once per client (a client makes a Script of each)."""
    return hashlib.sha1(text.encode()).hexdigest()


@cache
def layout_texts(name: str, shebang: bool = True) -> dict[str, str]:
    """Script ``name``'s text per layout: ``{"hash": ...}`` alone when both
    layouts' texts are the same (the script has no ``--@layout`` block that
    changes it), else ``{"hash": ..., "stream": ...}``."""
    texts = {layout: source(name, shebang, layout) for layout in LAYOUTS}
    if texts["stream"] == texts["hash"]:
        del texts["stream"]
    return texts


def select_layout(text: str, layout: str, where: str) -> str:
    """``text`` with its ``--@layout`` blocks of other layouts than
    ``layout`` cut out, and the directive lines of its own dropped.
    ValueError for an unknown layout (either one), a block opened inside
    another, an ``--@end`` with none open, or a block still open at the end
    of the file."""
    if layout not in LAYOUTS:
        raise ValueError(f"{where}: unknown layout {layout!r} (known: {', '.join(LAYOUTS)})")
    kept: list[str] = []
    pos = 0
    open_block: tuple[str, int] | None = None  # (layout, line) of the block open
    for m in _LAYOUT_LINE.finditer(text):
        kind, rest = m.group(1), m.group(2).strip()
        line = text.count("\n", 0, m.start()) + 1
        if kind == "layout":
            if rest not in LAYOUTS:
                raise ValueError(f"{where}:{line}: --@layout {rest!r}: unknown layout (known: {', '.join(LAYOUTS)})")
            if open_block is not None:
                raise ValueError(
                    f"{where}:{line}: --@layout {rest} inside the --@layout {open_block[0]} block of line "
                    f"{open_block[1]}: blocks do not nest (close it with --@end first)"
                )
            kept.append(text[pos : m.start()])
            open_block = (rest, line)
        else:
            if rest and not rest.startswith("--"):
                raise ValueError(f"{where}:{line}: --@end takes nothing, not {rest!r}")
            if open_block is None:
                raise ValueError(f"{where}:{line}: --@end with no --@layout block open")
            if open_block[0] == layout:
                kept.append(text[pos : m.start()])
            open_block = None
        pos = m.end()
    if open_block is not None:
        raise ValueError(
            f"{where}:{open_block[1]}: --@layout {open_block[0]} is never closed: end the block with --@end "
            "in the same file"
        )
    kept.append(text[pos:])
    return "".join(kept)


@cache
def flags(name: str) -> tuple[str, ...]:
    """The flags script ``name`` declares with ``--@flags`` lines."""
    return declared_flags(lua_dir().joinpath(f"{name}.lua").read_text(), f"{name}.lua")


def declared_flags(text: str, where: str) -> tuple[str, ...]:
    """The flags of a script's ``--@flags`` lines; ValueError naming an unknown one."""
    found = tuple(flag for line in _FLAGS.findall(text) for flag in line.split())
    unknown = sorted(set(found) - set(KNOWN_FLAGS))
    if unknown:
        raise ValueError(f"{where}: unknown --@flags {', '.join(unknown)} (known: {', '.join(KNOWN_FLAGS)})")
    return found


def expand_includes(root: Path, name: str, layout: str = "hash") -> str:
    """``root/name.lua``, for queues of log layout ``layout`` (each file's
    ``--@layout`` blocks cut first, see select_layout), with its ``--@include`` and ``--@lazy`` lines
    replaced by the includes' text, from ``root/includes/``.

    Each include is expanded once, where it is first named, with its own
    includes expanded in its place first (depth first), so a prerequisite's
    text stands before the include that needs it. An include first named
    inside a ``--@lazy`` region lands in that region, even a prerequisite
    that eager code needs later: nothing leaves a region for the eager part.
    An include's helpers are therefore reachable only from where it landed,
    and a layout that needs them elsewhere is refused (ValueError): eager
    code after the region, unless it stands after a ``--@make`` of that
    region in the same or an enclosing block; another region; or code
    outside the block of a script that an include was expanded in. So are a
    cycle of includes, an include's ``--@include`` after its own code, and a
    ``--@lazy`` line in a block or in another region.
    """
    return _Expansion(root, name, layout).text


@dataclass(frozen=True)
class _Site:
    """Where in a script an include is named, or where its text landed."""

    at: int  # offset in the script's own file of the directive it stems from
    blocks: tuple[int, ...]  # the script's blocks open there, outermost first ((): the top level)
    lazy: str | None = None  # the --@lazy region it is in


class _Expansion:
    """One script's includes, expanded once each."""

    def __init__(self, root: Path, name: str, layout: str = "hash") -> None:
        self.root = root
        self.layout = layout
        self.script = select_layout(root.joinpath(f"{name}.lua").read_text(), layout, f"{name}.lua")
        self.code = _code(self.script, strings=False)
        self.landed: dict[str, _Site] = {}
        self.named_by: dict[str, str] = {}  # include -> the file that first named it
        self.open: list[str] = []  # the includes being expanded, outermost first
        self.regions: set[str] = set()
        self.text = _DIRECTIVE.sub(
            lambda m: self.directive(m, _Site(m.start(), _blocks_at(self.code, m.start())), f"{name}.lua"),
            self.script,
        )

    def directive(self, match: re.Match[str], site: _Site, where: str) -> str:
        kind, first, rest = match.groups()
        names = rest.split()
        if kind == "include":
            if names:
                raise ValueError(f"{where}: {match.group(0)!r}: --@include takes one name")
            return self.include(first, site, where)
        if not names:
            raise ValueError(f"{where}: {match.group(0)!r}: --@lazy takes a region name, then the includes it makes")
        if site.blocks or site.lazy is not None:
            raise ValueError(
                f"{where}: --@lazy {first} stands in a block or in --@lazy {site.lazy}: "
                "its helpers must be locals of the script's top level"
            )
        region = _Site(site.at, (), first)
        if first in self.regions:
            # Named again (by another include that needs it): it may add nothing.
            before = set(self.landed)
            for inc in names:
                self.include(inc, region, where)
            added = sorted(set(self.landed) - before)
            if added:
                raise ValueError(
                    f"{where}: --@lazy {first} stands twice, the second time with {', '.join(added)}: "
                    "one region per name"
                )
            return ""
        self.regions.add(first)
        return f"--@lazy-begin {first}\n" + "".join(self.include(inc, region, where) for inc in names) + "--@lazy-end\n"

    def include(self, name: str, site: _Site, where: str) -> str:
        if name in self.open:
            cycle = " -> ".join([*self.open[self.open.index(name) :], name])
            raise ValueError(f"{where}: --@include {name}: the includes form a cycle, {cycle}")
        landed = self.landed.get(name)
        if landed is not None:
            self.check_reach(name, landed, site, where)
            return ""
        path = self.root.joinpath("includes", f"{name}.lua")
        if not path.is_file():
            raise ValueError(f"{where}: --@include {name}: there is no includes/{name}.lua")
        self.landed[name] = site
        self.named_by[name] = where
        self.open.append(name)
        text = select_layout(path.read_text(), self.layout, f"includes/{name}.lua")

        def nested(match: re.Match[str]) -> str:
            if _code(text[: match.start()]).strip():
                raise ValueError(
                    f"includes/{name}.lua: {match.group(0)!r} stands after code: "
                    "an include names what it needs before its own code"
                )
            return self.directive(match, site, f"includes/{name}.lua")

        expanded = _DIRECTIVE.sub(nested, text)
        self.open.pop()
        return expanded

    def check_reach(self, name: str, landed: _Site, site: _Site, where: str) -> None:
        """Refuses a need for an include, already expanded, whose helpers are
        not defined where ``site`` stands."""
        first = self.named_by[name]
        if site.blocks[: len(landed.blocks)] != landed.blocks:
            raise ValueError(
                f"{where} needs {name}, which {first} expanded inside a block of the script, where its "
                f"helpers are locals: include {name} at the top level, before both"
            )
        if landed.lazy is None or landed.lazy == site.lazy:
            return
        if site.lazy is None and self.made_before(landed.lazy, site):
            return
        raise ValueError(
            f"{where} needs {name}, which {first} brought into --@lazy {landed.lazy}, so its helpers "
            f"exist only after --@make {landed.lazy}: include {name} before that region, or include what "
            f"needs it after a --@make {landed.lazy} line in the same or an enclosing block"
        )

    def made_before(self, region: str, site: _Site) -> bool:
        """Whether a ``--@make region`` line of the script stands before
        ``site`` in a block still open there (or at the top level)."""
        for m in _MAKE.finditer(self.script, 0, site.at):
            blocks = _blocks_at(self.code, m.start())
            if m.group(2) == region and site.blocks[: len(blocks)] == blocks:
                return True
        return False


def _code(text: str, strings: bool = True) -> str:
    """``text`` with its comments blanked out, and its strings too unless
    ``strings``; every line break is kept, so offsets stay the same."""

    def blank(match: re.Match[str]) -> str:
        found = match.group(0)
        if strings and not found.startswith("--"):
            return found
        return "\n".join(" " * len(line) for line in found.split("\n"))

    return _NOISE.sub(blank, text)


def _blocks_at(code: str, pos: int) -> tuple[int, ...]:
    """The blocks of ``code`` (comments and strings blanked) open at
    ``pos``, outermost first, each named by the offset of the word that
    opens it ("else" and "elseif" end one block and open another)."""
    stack: list[int] = []
    for m in _BLOCK_WORD.finditer(code, 0, pos):
        if m.group(1) in ("end", "until", "else", "elseif"):
            if not stack:
                raise ValueError(f"{m.group(1)!r} at offset {m.start()} closes no block")
            stack.pop()
        if m.group(1) not in ("end", "until"):
            stack.append(m.start())
    return tuple(stack)


def drop_unused(text: str) -> str:
    """``text`` without the top-level local functions nothing calls (names
    in comments do not count). Every local function is made anew (a
    closure) on each script call, so a script pays only for the helpers it
    uses."""
    # The text's code (comments and strings blanked, offsets kept) and its
    # words are made once: a helper's span is whole lines of code, so each
    # cut takes the same span from the code and its words from the count.
    code = _code(text)
    words = Counter(_WORD.findall(code))
    while True:
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
            words.subtract(_WORD.findall(code[m.start() : m.end()]))
            text = text[: m.start()] + text[m.end() :]
            code = code[: m.start()] + code[m.end() :]


def make_lazy(text: str) -> str:
    """Helpers of a ``--@lazy name`` region made where ``--@make name`` stands.

    The region's constants stay where they are and its top-level helpers
    become locals declared there, still nil. Each ``--@make name`` line is
    replaced by their definitions, run only when the first of them is still
    nil. A script puts it on the paths that need them (a failure, a
    redelivery), so the common call builds none: every closure a call makes
    costs Redis the closure, the upvalues it binds and their collection. A
    loader function would not do: making it binds every upvalue its helpers
    use, on every call.
    """
    regions = {m.group(1): m for m in _LAZY_REGION.finditer(text)}
    if not regions:
        return text
    helpers = {name: list(_NOTED_FUNCTION.finditer(m.group(2))) for name, m in regions.items()}
    nested = [h.group(1) for found in helpers.values() for h in found if _MAKE.search(h.group(0))]
    if nested:
        raise ValueError(f"--@make inside the lazy helper {', '.join(nested)}: its copy would keep the directive")
    for name, m in regions.items():
        # The region's own top-level code runs where the region stands, before any --@make.
        names = {h.group(1) for h in helpers[name]}
        early = sorted(names & set(_WORD.findall(_code(_NOTED_FUNCTION.sub("", m.group(2)), strings=False))))
        if early:
            raise ValueError(f"--@lazy {name}: its top-level code names {', '.join(early)}, still nil there")

    def region(match: re.Match[str]) -> str:
        name = match.group(1)
        names = [h.group(1) for h in helpers[name]]
        # Named above the region, a helper would be read as a global there.
        above = set(_WORD.findall(code[: match.start()]))
        early = [n for n in names if n in above]
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
    code = _code(text)  # a region starts a line of code: what stands above it is code[:start]
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
    bare = _code(code, strings=False)
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
