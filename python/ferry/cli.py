"""The `ferry` command: doctor, options, --version."""

from __future__ import annotations

import argparse
import sys

from . import _ferry
from .errors import FerryError


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}" if v else "none"


def version_text() -> str:
    v = _ferry.versions()
    return (
        f"ferry {v['library']} (C API {v['api']}, "
        f"CUDA runtime {_cuda_version(v['cuda_runtime'])}, "
        f"CUDA driver {_cuda_version(v['cuda_driver'])})"
    )


def cmd_options(args) -> int:
    rows = _ferry.option_table()
    if args.markdown:
        print("| option | default | meaning |\n| --- | --- | --- |")
        for name, default, doc in rows:
            print(f"| `{name}` | `{default}` | {doc} |")
    else:
        for name, default, doc in rows:
            print(f"{name:<24} {default or '(empty)':<10} {doc}")
    return 0


def cmd_doctor(args) -> int:
    from . import doctor

    return doctor.main(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ferry",
        description="Measure and explain host<->GPU data movement on this machine.",
    )
    p.add_argument("--version", action="version", version=version_text())
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    d = sub.add_parser("doctor", help="facts, measurements and findings for this machine")
    d.add_argument("--json", action="store_true", help="print one JSON object")
    d.add_argument("--full", action="store_true", help="measure with larger sizes")
    d.set_defaults(func=cmd_doctor)

    o = sub.add_parser("options", help="list the FERRY_* options with defaults")
    o.add_argument("--markdown", action="store_true", help="as a Markdown table")
    o.set_defaults(func=cmd_options)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        _ferry.check_options()
        return args.func(args)
    except FerryError as e:
        print(f"ferry: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
