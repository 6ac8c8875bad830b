"""The core of the command line: the ``ge`` parser, the error guard and the ``plugins`` diagnostic
(which works however the other plugins fare). Every other command is a plugin's, added through
``ge_register_cli_commands``: ``compile``, ``run``, ``inspect``, ``passes``, ``bench``, ... come
from ``ge_tools``, ``atc`` from ``ge_atc``; what such commands share is :mod:`ge_sdk.cli`.

Errors a user can cause print ``error: <message>`` on stderr and exit with status 2, with no
traceback (``GE_DEBUG=1`` shows it).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

from . import __version__
from .errors import GEError, OptionError


# ------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------
def console(stderr: bool = False):
    """The rich console ``ge`` commands print with (on stderr with ``stderr``)."""
    from rich.console import Console

    # no emoji codes (":x:"), no highlighting: text from a model file prints as it is; into a
    # pipe or file, tables keep their natural width (no 80-column cut) and there are no colours
    stream = sys.stderr if stderr else sys.stdout
    tty = hasattr(stream, "isatty") and stream.isatty()
    return Console(stderr=stderr, highlight=False, soft_wrap=True, emoji=False,
                   width=None if tty else 100_000, no_color=not tty)


def table(title: str, columns: Sequence[str] = (), **kw: Any):
    """A rich table whose cells wrap (fold) on a narrow terminal instead of being cut with '…'."""
    from rich.table import Table

    t = Table(title=title, **kw)
    for c in columns:
        t.add_column(c, overflow="fold")
    return t


def plain(x: Any) -> str:
    """``x`` as text that rich prints literally (a model's ``x[/b]`` or ``[red]`` is no markup)."""
    from rich.markup import escape

    return escape(str(x))


def guard(fn: Callable[[], int]) -> int:
    """``fn()``'s exit status; a :class:`GEError` prints ``error: ...`` and exits with its code (2 for
    a usage error), Ctrl-C 130, a bug in ge or a plugin ``internal error: ...`` and 3. As a last
    resort, running out of memory and an ``OSError`` that names its file (a full disk, no
    permission) are ``error: ...`` and 2 too: the machine's or the file's fault, not a bug."""
    try:
        return fn() or 0
    except GEError as e:
        print(f"error: {e}", file=sys.stderr)
        if os.environ.get("GE_DEBUG"):
            raise
        return e.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except MemoryError:  # a model or inputs too large for this machine: not a bug
        if os.environ.get("GE_DEBUG"):
            raise
        print("error: out of memory (the model, its inputs or their shapes need more memory than this machine "
              "has: give smaller shapes or inputs)", file=sys.stderr)
        return 2
    except OSError as e:  # a file the command reads or writes (disk full, no permission): name it
        if os.environ.get("GE_DEBUG"):
            raise
        if e.filename is None:
            print(f"internal error: {type(e).__name__}: {e} (this is a bug in ge or a plugin; rerun with GE_DEBUG=1 "
                  "for the traceback and report it)", file=sys.stderr)
            return 3
        def shown(f: Any) -> str:
            return f"'{os.fsdecode(f) if isinstance(f, (str, bytes)) else f}'"

        where = shown(e.filename) + (f" -> {shown(e.filename2)}" if e.filename2 is not None else "")
        print(f"error: {where}: {e.strerror or e} (check the path, its permissions and the free space)", file=sys.stderr)
        return 2
    except Exception as e:  # a bug, not the user's fault: say so, briefly
        if os.environ.get("GE_DEBUG"):
            raise
        print(f"internal error: {type(e).__name__}: {e} (this is a bug in ge or a plugin; "
              "rerun with GE_DEBUG=1 for the traceback and report it)", file=sys.stderr)
        return 3


def cmd_plugins(args: argparse.Namespace) -> int:
    from .plugins import get_host

    host = get_host()
    regs = host.registries.complete()  # every hook called, so that its errors show up
    rows = host.describe()
    counts: dict[str, dict[str, int]] = {}
    for kind in ("ops", "frontends", "passes", "backends", "memory_planners", "stream_allocators", "fusion_patterns", "op_mappers"):
        reg = getattr(regs, kind)
        for key in reg.keys():
            per = counts.setdefault(reg.origin(key) or "?", {})
            per[kind] = per.get(kind, 0) + 1
    for be, reg in regs.kernels.items():
        for key in reg.keys():
            per = counts.setdefault(reg.origin(key) or "?", {})
            per[f"{be}_kernels"] = per.get(f"{be}_kernels", 0) + 1
    for r in rows:
        r["provides"] = counts.get(r["name"], {})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    t = table("ge plugins", ("name", "distribution", "version", "hooks", "provides", "status"))
    for r in rows:
        status = "disabled" if r["disabled"] else ("[red]" + plain("; ".join(r["errors"])) + "[/red]" if r["errors"] else "ok")
        t.add_row(plain(r["name"]), plain(r["distribution"] or "-"), plain(r["version"] or "-"),
                  plain(", ".join(h.replace("ge_register_", "") for h in r["hooks"])),
                  plain(", ".join(f"{k} {v}" for k, v in r["provides"].items())), status)
    console().print(t)
    return 0


class Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are :class:`OptionError` (``error: ...``, exit 2)
    with ``did you mean`` for a mistyped sub-command or flag. It remembers the flags added to it
    (``flags``) and, for the top parser, its sub-parsers (``commands``)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        kw.setdefault("allow_abbrev", False)  # a prefix of a flag is a typo to name, not a guess
        self.flags: list[str] = []
        self.commands: dict[str, Parser] = {}
        self.argv: list[str] = []
        super().__init__(*args, **kw)

    def add_argument(self, *names: Any, **kw: Any):  # type: ignore[override]
        self.flags += [n for n in names if isinstance(n, str) and n.startswith("-")]
        return super().add_argument(*names, **kw)

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None):  # type: ignore[override]
        self.argv = list(sys.argv[1:] if args is None else args)
        return super().parse_args(self.argv, namespace)

    def error(self, message: str):  # type: ignore[override]
        import re

        from .registry import close_matches

        hint = f"`{self.prog} --help` lists the options"
        m = re.search(r"invalid choice: '([^']*)'", message)
        if m and self.commands:
            raise OptionError(f"{self.prog}: unknown command '{m.group(1)}'{close_matches(m.group(1), list(self.commands))}",
                              hint=f"commands: {', '.join(self.commands)}")
        m = re.search(r"unrecognized arguments: (.*)", message)
        if m:
            cmd = next((self.commands[a] for a in self.argv if a in self.commands), None)
            known = (cmd or self).flags + self.flags
            bad = next((t for t in m.group(1).split() if t.startswith("-")), m.group(1).split()[0])
            flag = bad.split("=")[0]
            where = f"{self.prog} {cmd.prog.split()[-1]}" if cmd is not None else self.prog
            raise OptionError(f"{where}: unknown option '{flag}'{close_matches(flag, known)}" if flag.startswith("-")
                              else f"{where}: unexpected argument '{bad}'",
                              hint=f"`{where} --help` lists the options")
        raise OptionError(f"{self.prog}: {message}", hint=hint)


def build_parser(with_plugins: bool = True) -> argparse.ArgumentParser:
    parser = Parser(prog="ge", description="GE for Python: compile deep-learning models to .om and run them.")
    parser.add_argument("--version", action="version", version=f"ge {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)

    p = sub.add_parser("plugins", help="list plugins, what they provide and their load errors")
    p.add_argument("--json", action="store_true", help="print the list as JSON")
    p.set_defaults(func=cmd_plugins)

    if with_plugins:
        try:
            from .plugins import get_host

            for name, cmd in get_host().registries.cli_commands.items():
                if name in sub.choices:
                    continue
                sp = sub.add_parser(name, help=cmd.help, description=cmd.help)
                cmd.configure(sp)
                sp.set_defaults(func=lambda a, _c=cmd: _c.run(a))
        except GEError as e:
            print(f"warning: plugin commands unavailable: {e}", file=sys.stderr)
    parser.commands = {k: v for k, v in sub.choices.items() if isinstance(v, Parser)}
    return parser


_HISTORY = re.compile(r" \(passes before it: [^)]*\)")


class _OnceHandler(logging.Handler):
    """Prints each distinct log message once, as ``warning: ...`` (its level as the prefix)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[int, str]] = set()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
        except Exception:  # a malformed record must not stop the command
            return
        # a pass that fails in every round of a fixed-point stage is one failure: its history
        # ("passes before it: ...") is what differs between the rounds
        key = (record.levelno, _HISTORY.sub("", msg))
        if key in self.seen:
            return
        self.seen.add(key)
        print(f"{record.levelname.lower()}: {msg}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    def go() -> int:
        parser = build_parser()
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        return args.func(args)

    handler = _OnceHandler()  # the ge loggers' messages (a failing plugin, a skipped pass): once each
    logger = logging.getLogger("ge")
    logger.addHandler(handler)
    try:
        return guard(go)
    finally:
        logger.removeHandler(handler)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
