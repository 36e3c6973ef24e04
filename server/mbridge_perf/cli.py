"""`mbridge-perf` command line: a thin door over the same functions the MCP server calls."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from mbridge_perf import __version__


def _cmd_serve(args: argparse.Namespace) -> int:
    from mbridge_perf.server import build_server  # imports mcp: only when serving

    build_server().run()
    return 0


def _cmd_lint(args: argparse.Namespace) -> int:
    from mbridge_perf.skillpack.lint import lint
    from mbridge_perf.skillpack.pack import PackError, find_pack_root

    if args.path is not None:
        target = Path(args.path)
    else:
        try:
            target = find_pack_root(Path.cwd() / "x")
        except PackError:
            target = Path.cwd()
    findings = lint(target)
    for f in findings:
        print(f)
    errors = sum(f.severity == "error" for f in findings)
    if errors:
        print(f"{errors} error(s)", file=sys.stderr)
        return 1
    if not args.quiet:
        print(f"{target}: ok", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mbridge-perf",
        description="Megatron Bridge training-performance skills and MCP tools.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("serve", help="run the MCP server over stdio")
    p.set_defaults(func=_cmd_serve)

    p = sub.add_parser("lint", help="lint the skill pack or one skill folder")
    p.add_argument("path", nargs="?", help="pack root or skills/<name> (default: the pack "
                                           "containing the current directory)")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing when clean")
    p.set_defaults(func=_cmd_lint)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
