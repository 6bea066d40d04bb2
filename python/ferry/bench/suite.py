"""The shape of a `ferry bench` suite (nvbandwidth's test cases): a key, a one-line
description, a "can this machine run it" check and a run method.

    class CopySuite(Suite):                     # `ferry bench copy --help`: the module's docstring
        key = "copy"
        description = "pageable host<->GPU copies: ferry beside cudaMemcpy and torch"

        def add_arguments(self, parser):     # the suite's own options (--json is given)
            parser.add_argument("--sizes", type=size_list, default="4K,1G",
                                help="copy sizes (default: %(default)s)")
            add_repeats(parser, 5, "timed copies per case")   # --repeats N, the one spelling

        def waived(self, args):              # default: needs a CUDA device
            return super().waived(args)      # None, or why this machine cannot run it

        def run(self, args) -> int:          # prints its tables, returns the exit status
            out = Records(self.key)          # bench/records.py
            ...
            out.compare({"direction": "h2d", "nbytes": n}, "bandwidth", "GB/s",
                        {"ferry auto": ferry_gbps, "cudaMemcpy pageable": cuda_gbps},
                        baseline="cudaMemcpy pageable")
            write_json(args.json, self.key, out.items)   # bench/report.py
            return 0

    SUITE = CopySuite()
    main = SUITE.main                        # `python -m ferry.bench.copy`, tests

`main(argv)` parses the arguments (`ferry bench copy --help` shows them: give each
option a checking `type=`, such as `size_list` or `int_at_least(1)`, so that a typo is
refused on any machine, before the waiver), asks `waived()`, and prints "ferry bench copy: waived: <why>" (exit status 0) instead of
running where the machine cannot; `run()` may also raise `Waived(why)` when it
learns so late (e.g. from a probe process). A waived suite with --json records
why in the file (no records). `--json FILE` is checked first (report.check_json_path:
exit status 2 with the reason, before anything is measured); `--json -` writes the
records to stdout and the tables to stderr. Register the module in
bench/__init__.py's SUITE_MODULES: `ferry bench --help` then lists it.

One vocabulary (tests/python/test_cli_vocabulary.py): the repeat count is
`--repeats` (add_repeats), where the data lives `--device` (add_device), every help
ends "(default: %(default)s)"; a renamed option keeps its old spelling one release
through deprecated_alias (a DeprecationWarning and a stderr note naming the new one,
hidden from --help). Checks that need several arguments go in check_args().

Results: every suite writes the same JSON, a list of records, one per figure
(nvbandwidth's shape; bench/records.py builds them, report.write_json writes
them under the machine's header and merges them with other suites' records
in the same file):

    {"suite": "copy", "case": "ferry auto",
     "params": {"direction": "h2d", "nbytes": 1073741824, "baseline_case": "cudaMemcpy pageable"},
     "metric": "bandwidth", "value": 52.1, "unit": "GB/s",
     "baseline": 8.4, "ratio": 6.2}

- suite: the suite's key; case: what was measured, ferry's path or a
  baseline's ("ferry auto", "cudaMemcpy pageable", "torch pinned");
- params: the case's parameters (bytes under keys ending in `bytes`,
  direction h2d/d2h/bidir, backing, ...) and `baseline_case` where the record
  has a baseline;
- metric: what value is (bandwidth, time, latency_median, ...); value: a
  number (a string for a state or a fact: "Passed", "staged"); unit: "GB/s"
  (1e9 bytes/s), "s", "ms", "us", null for a state;
- baseline: the baseline's value measured in the same run with the same
  params, or null; ratio: value / baseline, or null.
(suite, case, params, metric) names one figure: a case compared with two
baselines has one record, with its main baseline; the other ratios follow from
the records. Every figure the printed tables show is a record's value or
follows from records; the tables stay the suite's own.
"""

from __future__ import annotations

import argparse
import sys
import warnings

from ..errors import InvalidArgumentError


def _checked(convert, name: str):
    """An argparse type from a converter that raises InvalidArgumentError (or int()'s ValueError)."""

    def check(text: str):
        try:
            return convert(text)
        except ValueError as e:  # InvalidArgumentError is one, and so is int()'s error
            raise argparse.ArgumentTypeError(str(e)) from None

    check.__name__ = name  # argparse names the type in its message
    return check


def _size_list(text: str) -> str:
    from ..units import parse_size_list

    if not parse_size_list(text):
        raise InvalidArgumentError(f"'{text}': expected a list of sizes such as 4K,64M,1G")
    return text  # kept as written; run() parses it again


size_list = _checked(_size_list, "size list")
size_list_or_none = _checked(lambda t: t if t == "none" else _size_list(t), "size list")


def _size(text: str) -> str:
    from ..units import parse_size

    parse_size(text)
    return text


size = _checked(_size, "size")


def int_at_least(lo: int):
    """An argparse type: an integer >= lo."""

    def convert(text: str) -> int:
        v = int(text)
        if v < lo:
            raise InvalidArgumentError(f"'{text}': expected an integer >= {lo}")
        return v

    return _checked(convert, "integer")


def choices_list(allowed):
    """An argparse type: a comma-separated list whose items are all in `allowed`."""

    def convert(text: str) -> str:
        items = [x for x in text.split(",") if x]
        bad = [x for x in items if x not in allowed]
        if bad or not items:
            raise InvalidArgumentError(f"'{text}': expected a comma-separated list of {', '.join(allowed)}")
        return text

    return _checked(convert, "list")


# ---- one vocabulary: --repeats, --device, --json FILE ----------------------------------
#
# Every suite spells "how many timed runs" --repeats, where the data lives --device and
# where the records go --json FILE ("-": stdout). Spellings of earlier releases still
# parse, with a DeprecationWarning and a note on stderr naming the new spelling; they go
# away one release after they were deprecated (docs/bench.md lists them).


def deprecation_note(prog: str, old: str, new: str) -> None:
    """Tells the user (stderr: a DeprecationWarning is hidden by default) and the
    warnings machinery (tests, -W error) that `old` is spelled `new` now."""
    note = f"{prog}: {old} is deprecated: use {new}"
    print(note, file=sys.stderr, flush=True)
    warnings.warn(note, DeprecationWarning, stacklevel=3)


class DeprecatedAlias(argparse.Action):
    """An old spelling of an option: stores what the new one would (into its dest), after
    deprecation_note(). nargs=0 with const: a flag that stood for a value (fork --cpu
    is --device cpu)."""

    def __init__(self, option_strings, dest, new: str, **kwargs):
        kwargs.setdefault("help", argparse.SUPPRESS)  # `--help` shows the new spelling only
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None):
        deprecation_note(parser.prog, option_string, self.new)
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)


def deprecated_alias(parser: argparse.ArgumentParser, old: str, new: str, dest: str, **kwargs) -> None:
    """`old` is parsed as `new` (whose dest is `dest`), with a deprecation note. kwargs:
    the new option's type (or nargs=0 and const for a flag that stood for a value)."""
    parser.add_argument(old, dest=dest, action=DeprecatedAlias, new=new, **kwargs)


def add_repeats(parser: argparse.ArgumentParser, default: int, what: str, old: tuple[str, ...] = (),
                lo: int = 1) -> None:
    """--repeats N, the one spelling of a suite's repeat count (what: "timed copies per
    case"); `old`: the suite's earlier spellings, kept as deprecated aliases."""
    kind = int_at_least(lo)
    parser.add_argument("--repeats", type=kind, default=default, metavar="N", help=f"{what} (default: %(default)s)")
    for spelling in old:
        deprecated_alias(parser, spelling, "--repeats", "repeats", type=kind, metavar="N")


def add_device(parser: argparse.ArgumentParser, choices=("cuda", "cpu"), default="cuda", what: str = "",
               old_cpu_flag: str | None = None) -> None:
    """--device, where a suite's data lives: cuda (a GPU) or cpu (the suite's host-side
    code, e.g. in CI without a GPU). old_cpu_flag: an earlier `--cpu` flag, kept as a
    deprecated spelling of `--device cpu`."""
    parser.add_argument("--device", choices=choices, default=default,
                        help=f"{what or 'where the data lives'} (default: %(default)s)")
    if old_cpu_flag:
        deprecated_alias(parser, old_cpu_flag, "--device cpu", "device", nargs=0, const="cpu")


STDOUT = "-"  # --json -: the records go to stdout (the tables to stderr)


# What each suite says when a package is missing, in one form: what, then how to get it.
NEEDS = {"torch": "needs PyTorch: pip install 'ferry[torch]'",
         "safetensors": "needs safetensors: pip install safetensors"}


def missing_module(*names: str) -> str | None:
    """Why a suite cannot run for want of a Python package (NEEDS: "needs PyTorch:
    pip install 'ferry[torch]'"; with the error when the package is there but fails
    to import), or None when every one of `names` imports."""
    for module in names:
        try:
            __import__(module)
        except ImportError as e:
            why = NEEDS.get(module, f"needs {module}: pip install {module}")
            absent = isinstance(e, ModuleNotFoundError) and e.name == module
            return why if absent else f"{why} (import {module} failed: {e})"
    return None


class Waived(Exception):
    """This machine cannot run the suite (or one of its checks); the message says why."""


class Suite:
    key: str = ""  # `ferry bench KEY`
    description: str = ""  # one line, in `ferry bench --help`

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """The suite's own options; --json FILE is already there."""

    def waived(self, args: argparse.Namespace) -> str | None:
        """Why this machine cannot run the suite, or None. Default: it needs a CUDA device."""
        from .. import _ferry, measure

        why = measure.gpu_absent_reason(_ferry.cuda_info())
        return None if why is None else f"needs a CUDA device: {why}"

    def run(self, args: argparse.Namespace) -> int:
        """Measures, prints ferry beside its baseline, writes args.json; the exit status."""
        raise NotImplementedError

    def parser(self) -> argparse.ArgumentParser:
        p = argparse.ArgumentParser(prog=f"ferry bench {self.key}",
                                    description=sys.modules[type(self).__module__].__doc__ or self.description,
                                    formatter_class=argparse.RawDescriptionHelpFormatter)
        p.add_argument("--json", metavar="FILE",
                       help="write the results as JSON records (with the machine's facts); "
                            "other suites' records in FILE are kept; '-': the records to stdout, "
                            "the tables to stderr")
        self.add_arguments(p)
        return p

    def check_args(self, args: argparse.Namespace) -> None:
        """Refuses bad argument combinations (InvalidArgumentError) on any machine,
        before the waiver. Default: nothing to check."""

    def main(self, argv: list[str] | None = None) -> int:
        args = self.parser().parse_args(argv)
        try:
            self.check_args(args)
        except InvalidArgumentError as e:
            print(f"ferry bench {self.key}: {e}", file=sys.stderr)
            return 2
        if args.json == STDOUT:
            from .report import records_to_stdout

            with records_to_stdout() as path:
                args.json = path
                return self._main(args)
        return self._main(args)

    def _main(self, args: argparse.Namespace) -> int:
        if args.json is not None:  # before measuring, not after: a bad FILE must not cost the results
            from .report import check_json_path

            try:
                check_json_path(args.json)
            except InvalidArgumentError as e:
                print(f"ferry bench {self.key}: error: {e}", file=sys.stderr)
                return 2
        try:
            why = self.waived(args)
            if why is None:
                return self.run(args)
        except Waived as e:
            why = str(e)
        print(f"ferry bench {self.key}: waived: {why}")
        if args.json is not None:
            from .report import write_json

            write_json(args.json, self.key, [], waived=why)
        return 0
