"""The `ferry` command: doctor, options, --version."""

from __future__ import annotations

import argparse
import sys

from . import _ferry
from .errors import FerryError, InvalidArgumentError


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{(v % 1000) // 10}" if v else "none"


def version_text() -> str:
    v = _ferry.versions()
    return (
        f"ferry {v['library']} (C API {v['api']}, "
        f"CUDA runtime {_cuda_version(v['cuda_runtime'])}, "
        f"CUDA driver {_cuda_version(v['cuda_driver'])})"
    )


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """'64M' -> 67108864; '4096' -> 4096; units K, M, G, T (binary), optional 'iB'/'B'."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    num, unit = (t[:-1], t[-1]) if t and t[-1] in _UNITS and t[-1] != "" else (t, "")
    try:
        value = int(num) * _UNITS[unit]
    except (ValueError, KeyError):
        raise InvalidArgumentError(f"'{text}' is not a size (expected e.g. 4096, 64M, 1G)") from None
    if value <= 0:
        raise InvalidArgumentError(f"'{text}': size must be positive")
    return value


def parse_size_list(text: str) -> list[int]:
    return [parse_size(x) for x in text.split(",") if x.strip()]


def cmd_bench(args) -> int:
    import importlib

    from .bench import SUITES

    if args.suite not in SUITES:
        raise InvalidArgumentError(
            f"unknown bench suite '{args.suite}' (suites: {', '.join(sorted(SUITES))})"
        )
    return importlib.import_module(SUITES[args.suite]).main(args.rest)


def cmd_options(args) -> int:
    rows = _ferry.option_table()
    if args.markdown:
        print("| option | default | meaning |\n| --- | --- | --- |")
        for name, default, doc in rows:
            print(f"| `{name}` | `{default or '(empty)'}` | {doc} |")
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
    from .doctor import add_arguments

    add_arguments(d)
    d.set_defaults(func=cmd_doctor)

    b = sub.add_parser(
        "bench",
        help="benchmarks: ferry beside its baseline (`ferry bench SUITE --help`)",
        add_help=False,
    )
    b.add_argument("suite", help="pool")
    b.add_argument("rest", nargs=argparse.REMAINDER)
    b.set_defaults(func=cmd_bench)

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
