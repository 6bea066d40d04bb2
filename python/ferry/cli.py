"""The `ferry` command: doctor, bench, options, --version.

The top of the package: it imports the rest, and nothing in ferry imports it.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

from . import _ferry
from .errors import FerryError, InvalidArgumentError
from .facts.parsers import cuda_version_string


def version_text() -> str:
    v = _ferry.versions()
    return (
        f"ferry {v['library']} (C API {v['api']}, "
        f"CUDA runtime {cuda_version_string(v['cuda_runtime']) or 'none'}, "
        f"CUDA driver {cuda_version_string(v['cuda_driver']) or 'none'})"
    )


# ---- ferry bench ---------------------------------------------------------------------


def bench_description() -> str:
    from . import bench

    return ("Benchmarks: ferry beside its baseline (CUDA, PyTorch) in one run, with the ratio; "
            "`ferry bench SUITE --help` shows a suite's options. `ferry bench --json FILE copy,pool` "
            "runs several suites (each with the options that follow) and writes their records "
            "into one file.\n\nsuites:\n" + bench.listing())


def cmd_bench(args) -> int:
    from . import bench

    if args.suite is None:
        print(bench_description())
        return 0
    found = bench.suites()
    keys = [k.strip() for k in args.suite.split(",") if k.strip()]
    unknown = [k for k in keys if k not in found]
    if unknown or not keys:
        raise InvalidArgumentError(f"unknown bench suite '{unknown[0] if unknown else args.suite}' "
                                   f"(suites: {', '.join(found)})")
    if args.json == "-":  # every suite's records in one document on stdout, the tables on stderr
        from .bench.report import records_to_stdout

        with records_to_stdout() as path:
            return _run_suites(found, keys, args.rest, path)
    if args.json is not None:
        from .bench.report import check_json_path

        check_json_path(args.json)  # before the first suite measures: InvalidArgumentError, exit status 2
    return _run_suites(found, keys, args.rest, args.json)


def _run_suites(found: dict, keys: list[str], rest: list[str], json_path: str | None) -> int:
    rest = list(rest) + (["--json", json_path] if json_path is not None else [])
    # Each suite merges its records into the file (bench/report.py write_json).
    return max(found[k].main(rest) for k in keys)


# ---- ferry doctor --------------------------------------------------------------------


DOCTOR_DESCRIPTION = (
    "This machine's host and GPU facts, measurements (pinned bandwidth against the link, "
    "CUDA's pageable path beside ferry's, pinned allocation, small-copy latency, host memcpy, "
    "first touch, registration by page size) within 60 s (--quick: 15 s), and findings with "
    "fixes, the findings first. Exit status: 0 when it ran (findings are not failures), "
    "1 when a report file could not be written, 2 for bad options.")


def add_doctor_arguments(parser: argparse.ArgumentParser) -> None:
    # `--json` alone is `--json -` (stdout): the spelling of earlier releases, kept as
    # the short form of `--json -`, not deprecated (docs/doctor.md).
    parser.add_argument("--json", nargs="?", const="-", metavar="FILE",
                        help="write the report as one JSON object to FILE, the text report still on stdout; "
                             "'-' or no FILE: the JSON on stdout instead of the text (no progress)")
    speed = parser.add_mutually_exclusive_group()
    speed.add_argument("--quick", action="store_true", help="smaller sizes, at most 15 s")
    speed.add_argument("--full", action="store_true", help="more sizes and threads, no time limit")
    parser.add_argument("--html", metavar="FILE",
                        help="also write the report as one self-contained HTML page with plots to FILE "
                             "(plots need matplotlib)")


def cmd_doctor(args) -> int:
    from . import doctor
    from .doctor import html_report, text_report

    mode = "full" if args.full else "quick" if args.quick else "default"
    if args.html is not None:  # "" is refused, not ignored
        problem = html_report.unwritable(args.html)  # before measuring, not after
        if problem:
            print(f"ferry doctor: error: cannot write the HTML report: {problem}", file=sys.stderr)
            return 2
    to_stdout = args.json == "-"
    if args.json is not None and not to_stdout:
        problem = html_report.unwritable(args.json)  # the page's path rule, before measuring
        if problem:
            print(f"ferry doctor: error: cannot write the JSON report: {problem}", file=sys.stderr)
            return 2
    report = doctor.run(mode, quiet=to_stdout)
    if to_stdout:
        json.dump(report, sys.stdout, indent=2, sort_keys=False, default=str)
        sys.stdout.write("\n")
    else:
        print(text_report.format_report(report))
    if args.json is not None and not to_stdout:
        sys.stdout.flush()
        text = json.dumps(report, indent=2, sort_keys=False, default=str) + "\n"
        try:
            written = html_report.write_bytes(text.encode("utf-8"), args.json)
        except OSError as e:
            print(f"ferry doctor: error: cannot write the JSON report to {args.json}: {e}", file=sys.stderr)
            return 1
        print(f"ferry doctor: JSON report written to {written}", file=sys.stderr, flush=True)
    if args.html is not None:
        sys.stdout.flush()
        try:
            written = html_report.write(report, args.html)
        except OSError as e:
            print(f"ferry doctor: error: cannot write the HTML report to {args.html}: {e}", file=sys.stderr)
            return 1
        print(f"ferry doctor: HTML report written to {written}", file=sys.stderr, flush=True)
    return 0


# ---- ferry options -------------------------------------------------------------------


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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ferry",
        description="Measure and explain host<->GPU data movement on this machine.",
    )
    p.add_argument("--version", action="version", version=version_text())
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    d = sub.add_parser("doctor", help="facts, measurements and findings for this machine",
                       description=DOCTOR_DESCRIPTION)
    add_doctor_arguments(d)
    d.set_defaults(func=cmd_doctor)

    b = sub.add_parser("bench", help="benchmarks: ferry beside its baseline (`ferry bench` lists the suites)",
                       description=bench_description(), formatter_class=argparse.RawDescriptionHelpFormatter)
    b.add_argument("--json", metavar="FILE",
                   help="write every suite's records into FILE (with the machine's facts); "
                        "'-': one document on stdout, the tables on stderr")
    b.add_argument("suite", nargs="?", help="the suite to run, or several: copy,pool (listed above)")
    b.add_argument("rest", nargs=argparse.REMAINDER, help="the suite's options")
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
        status = args.func(args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's flush at exit
        return status
    except FerryError as e:
        print(f"ferry: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (`ferry doctor --json | head -c 1`): end quietly, as
        # other commands do. stdout points at /dev/null from now on, so the
        # interpreter's own flush at exit cannot fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 128 + signal.SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
