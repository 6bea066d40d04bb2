"""Tables and JSON for `ferry bench`: fixed keys, units in every label.

The JSON file: {"header": machine facts, "suites": {key: {"time", "waived"}},
"records": [records.py's records of every suite in the file], and where a
suite keeps raw rows for its own scripts "details": {key: ...}}. `--json FILE` is
checked before a suite measures (check_json_path) and replaced atomically: a path
that is not a regular file, or a file that is not a ferry bench file, is refused
and left as it is. `--json -` writes the document to stdout (records_to_stdout).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import sys
import tempfile
import time

from ..atomic_file import AtomicFile, check_replaceable
from ..bounded_read import Unreadable, read_regular_file
from ..errors import InvalidArgumentError, OSLayerError
from .records import is_record


def header() -> dict:
    """Versions and the facts that decide transfer speed (THP, hugetlb, NUMA, PCIe)."""
    from .. import _ferry, facts

    f = facts.collect(_ferry.cuda_info(), _ferry)
    host = f["host"]
    return {
        "ferry": _ferry.versions(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": {
            "name": platform.node(),
            "kernel": host.get("kernel"),
            "virtualization": (host.get("virtualization") or {}).get("kind"),
            "cpu": (host.get("cpu") or {}).get("model"),
            "thp": host.get("thp"),
            "hugetlb": host.get("hugetlb"),
            "numa_nodes": len(host.get("numa_nodes") or []),
        },
        "cuda": f["cuda"],
        "gpus": [
            {k: g.get(k) for k in ("name", "pcie", "link_gbps", "numa_node", "bar1_bytes")}
            for g in f["gpus"]
        ],
    }


def table(title: str, columns: list[str], rows: list[list]) -> str:
    """A plain aligned table; floats with 3 significant decimals."""

    def cell(x):
        if isinstance(x, float):
            return "-" if x != x else (f"{x:.3g}" if abs(x) < 1000 else f"{x:.0f}")
        return "-" if x is None else str(x)

    cells = [[cell(x) for x in r] for r in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) if cells else len(c) for i, c in enumerate(columns)]
    out = [title, "  ".join(c.rjust(w) for c, w in zip(columns, widths))]
    out += ["  ".join(x.rjust(w) for x, w in zip(r, widths)) for r in cells]
    return "\n".join(out)


def progress(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


# A records file of every suite is a few MB at most: the old file is read up to this
# (a --json FILE that never ends, such as a device, is refused before it is read).
MAX_RECORDS_FILE_BYTES = 64 << 20


def check_json_path(path) -> str:
    """The absolute path `--json path` writes, checked before a suite measures: where
    atomic_file.check_replaceable allows a file (nothing there, or a regular file; no
    FIFO, device or directory; a symbolic link is followed), and there nothing, an
    empty file or a file an earlier `ferry bench --json` wrote; else
    InvalidArgumentError saying why
    (OSLayerError for a directory this process cannot write), and whatever is there
    is left as it is (a file over MAX_RECORDS_FILE_BYTES is not read)."""
    try:
        dest = check_replaceable(path)  # the rule for every file ferry writes
        _read_records_file(dest)
    except InvalidArgumentError as e:
        raise InvalidArgumentError(f"--json '{path}': {e}") from None
    except OSLayerError as e:  # a directory this process cannot write
        raise OSLayerError(e.errno, f"--json '{path}': {e.strerror or e}") from None
    return dest


def write_json(path: str | None, suite: str, records: list[dict], waived: str | None = None,
               details: dict | None = None) -> None:
    """Writes `suite`'s records (records.py) to `path` under the machine's header.

    A file that holds records of other suites, written on this host, keeps
    them: this suite's earlier records are replaced, the header refreshed
    (`ferry bench --json FILE a,b` and runs one after another fill one file).
    A ferry bench file of another host or of an earlier shape is replaced; any
    other file, or a path check_json_path refuses, raises InvalidArgumentError
    and is left as it is. The file is replaced atomically (a temporary file in
    its directory, fsynced, renamed over it): a full disk or a crash leaves the
    earlier file whole (OSLayerError names the call that failed). waived: why the
    suite did not run. details: the suite's raw rows for its own scripts
    (file["details"][suite]); every figure still goes into a record.
    """
    if path is None:
        return
    bad = [r for r in records if not is_record(r)] if isinstance(records, list) else [records]
    if bad:
        raise TypeError(f"bench {suite}: write_json takes a list of records (ferry/bench/records.py), "
                        f"got {str(bad[0])[:120]}")
    dest = check_json_path(path)
    head = header()
    kept, suites, extra = [], {}, {}
    old = _read_records_file(dest)
    if old is not None and _is_records(old) and _host_name(old) == head["host"]["name"]:
        kept = [r for r in old["records"] if isinstance(r, dict) and r.get("suite") != suite]
        suites = {k: v for k, v in old["suites"].items() if k != suite}
        details_before = old.get("details")
        extra = {k: v for k, v in details_before.items() if k != suite} if isinstance(details_before, dict) else {}
    elif old is not None:
        progress(f"replacing {dest} (a ferry bench file of another host or an earlier version)")
    suites[suite] = {"time": head["time"], "waived": waived}
    doc = {"header": head, "suites": suites, "records": kept + list(records)}
    if details is not None:
        extra[suite] = details
    if extra:
        doc["details"] = extra
    _replace(dest, json.dumps(doc, indent=2).encode())
    progress(f"wrote {dest} ({len(records)} records of {suite}"
             + (f", {len(kept)} of {', '.join(k for k in suites if k != suite)} kept)" if kept else ")"))


@contextlib.contextmanager
def records_to_stdout():
    """`--json -`: yields the path of a new temporary file that the suites write
    their records into (write_json's rules, merging included); while they run,
    what they print goes to stderr, so that stdout holds the JSON document alone,
    written at the end (also when a suite failed after writing)."""
    fd, path = tempfile.mkstemp(prefix="ferry-bench-", suffix=".json")
    os.close(fd)
    real_stdout = sys.stdout
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield path
    finally:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        finally:
            os.unlink(path)
        if text.strip():
            real_stdout.write(text if text.endswith("\n") else text + "\n")
            real_stdout.flush()


def _replace(path: str, data: bytes) -> None:
    """data becomes the file at path whole, or path keeps what it held (AtomicFile:
    the new file keeps the old one's permissions)."""
    try:
        out = AtomicFile(path, direct=False)
        try:
            out.pwrite(data, 0)
        except BaseException:
            out.abort()
            raise
        out.commit(len(data))
    except OSError as e:
        raise OSLayerError(e.errno, f"cannot write the bench records to {path} ({e.strerror or e}); "
                                    f"{path} is as it was before this run") from e


def _read_records_file(path: str) -> dict | None:
    """The JSON object at path when an earlier `ferry bench --json` wrote it (a dict
    with a "header"), None when there is nothing (no file, or an empty one); else
    InvalidArgumentError. Reads at most MAX_RECORDS_FILE_BYTES; never waits on a FIFO."""
    try:
        text = read_regular_file(path, MAX_RECORDS_FILE_BYTES)
    except Unreadable as e:
        if e.missing:
            return None
        if "more than" in e.reason:
            raise InvalidArgumentError(f"{path} holds more than the {MAX_RECORDS_FILE_BYTES >> 20} MiB a bench "
                                       "records file may have (give another file)") from None
        if "regular file" in e.reason:  # replaced since check_replaceable looked
            raise InvalidArgumentError(f"{path} is not a regular file") from None
        raise InvalidArgumentError(f"{path}: {e.reason}") from None
    if not text.strip():
        return None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise InvalidArgumentError(f"{path} is not a ferry bench records file ({_short(e)}): it is left as "
                                   "it is (give another file, or remove it)") from None
    if not isinstance(data, dict) or not isinstance(data.get("header"), dict):
        raise InvalidArgumentError(f"{path} is JSON but not a ferry bench records file (no \"header\"): it is "
                                   "left as it is (give another file, or remove it)")
    return data


def _is_records(data: dict) -> bool:
    """The shape write_json writes (not an earlier version's)."""
    return isinstance(data.get("records"), list) and isinstance(data.get("suites"), dict)


def _host_name(data: dict):
    host = data["header"].get("host")
    return host.get("name") if isinstance(host, dict) else None


def _short(e: BaseException) -> str:
    text = str(e) or type(e).__name__
    return text if len(text) <= 100 else text[:97] + "..."
