"""README.md and docs/*.md quote only what exists: every relative link (and its
#anchor) reaches a file of this tree, every `ferry ...` command names a real
subcommand, suite and option, every ferry.X / ferry_x / FERRY_X name is there
(Python: imported and looked up; C: include/ferry/ferry.h), and every path under
scripts/, src/, python/, ... is a file or directory of the source tree (a build output
is not: name its source; the tree is walked, not asked of git, so these tests pass in
any copy of the source). README stays a front door: its quick start is the two
commands CI relies on, its table names every `ferry bench` suite, <= 300 lines.
No GPU needed; PyTorch only for the ferry.torch names."""

from __future__ import annotations

import fnmatch
import functools
import importlib
import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))

# Paths quoted in the docs that are not ferry's files, each with the reason.
FOREIGN_PATHS = {
    "src/ucp/rma/rma_rndv.c": "UCX's source tree (openucx/ucx), quoted in docs/findings.md",
}
# Top-level folders whose quoted paths must exist in the tree.
PATH_ROOTS = ("scripts", "src", "python", "tests", "include", "docs", "examples", "backend", "cmake", ".ci")
FILE_SUFFIXES = {"h", "so", "py", "json", "txt", "md", "cpp", "cu", "png"}


# ---- reading the pages ---------------------------------------------------------------


# Never source, whatever .gitignore says: version control, build outputs linked or
# copied into the tree (python/ferry/_ferry*.so), caches, virtual environments.
NOT_SOURCE = (".git/", ".hg/", ".svn/", "build/", "build-*/", "*.so", "*.so.*", "*.o", "*.pyc",
              "*.whl", ".venv/", "venv/", ".tox/", ".nox/")


def ignore_rules(text: str) -> list[tuple[str, bool, bool, bool]]:
    """The rules of a .gitignore: (glob, negated, directories only, anchored at the root)."""
    rules = []
    for line in text.splitlines():
        line = line.rstrip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        line = line[1:] if negated else line
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        anchored = "/" in line  # git: a slash at the start or in the middle anchors it
        rules.append((line.lstrip("/"), negated, dir_only, anchored))
    return rules


def ignored(path: str, is_dir: bool, rules) -> bool:
    """Whether `path` (relative to the root, '/'-separated) is ignored: the last rule
    that matches decides, as in git."""
    name = path.rsplit("/", 1)[-1]
    out = False
    for glob, negated, dir_only, anchored in rules:
        if dir_only and not is_dir:
            continue
        if fnmatch.fnmatchcase(path if anchored else name, glob):
            out = not negated
    return out


def walk_tree(root: pathlib.Path) -> frozenset[str]:
    """The source files under `root`: every file, less NOT_SOURCE and what the root's
    .gitignore ignores (a folder ignored is not entered). Asks no version control, so
    it is the same from a checkout, an unpacked source archive or a copy vendored into
    another repository (issue 38, item 16: asking git there listed the outer repository)."""
    gitignore = root / ".gitignore"
    rules = ignore_rules("\n".join(NOT_SOURCE)) + (ignore_rules(gitignore.read_text()) if gitignore.exists() else [])
    files = []
    for here, dirs, names in os.walk(root):
        base = pathlib.Path(here).relative_to(root).as_posix()
        prefix = "" if base == "." else base + "/"
        dirs[:] = sorted(d for d in dirs if not ignored(prefix + d, True, rules))
        files += [prefix + n for n in names
                  if not ignored(prefix + n, False, rules) and os.path.isfile(os.path.join(here, n))]
    return frozenset(files)


@functools.lru_cache(maxsize=None)
def tree_files() -> frozenset[str]:
    """The tree's source files (walk_tree): build outputs are not here."""
    return walk_tree(ROOT)


@functools.lru_cache(maxsize=None)
def tree_dirs() -> frozenset[str]:
    dirs = set()
    for f in tree_files():
        parts = f.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            dirs.add("/".join(parts[:i]))
    return frozenset(dirs)


def split_page(text: str) -> tuple[list[tuple[str, str]], str]:
    """([(language, body)] of the fenced blocks, the text outside them)."""
    blocks, prose, lang, body = [], [], None, []
    for line in text.splitlines():
        fence = re.match(r"^\s*```(\S*)", line)
        if fence and lang is None:
            lang, body = fence.group(1), []
        elif fence:
            blocks.append((lang, "\n".join(body)))
            lang = None
        elif lang is not None:
            body.append(line)
        else:
            prose.append(line)
    assert lang is None, "a ``` fence is not closed"
    return blocks, "\n".join(prose)


def code_spans(prose: str) -> list[str]:
    """Inline `code`, whitespace (a span may wrap across lines) made single spaces."""
    return [" ".join(s.split()) for s in re.findall(r"`([^`]+)`", prose)]


def quoted(text: str) -> list[str]:
    """Everything quoted as code: fenced blocks and inline spans."""
    blocks, prose = split_page(text)
    return [body for _, body in blocks] + code_spans(prose)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    s = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return s.replace(" ", "-")


def anchors(page: pathlib.Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    _, prose = split_page(page.read_text())
    for m in re.finditer(r"^#{1,6}\s+(.*?)\s*#*\s*$", prose, re.M):
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def rel(page: pathlib.Path) -> str:
    return str(page.relative_to(ROOT))


def page_ids():
    return [rel(p) for p in PAGES]


# ---- links ---------------------------------------------------------------------------


@pytest.mark.parametrize("page", PAGES, ids=page_ids())
def test_relative_links_reach_files_and_headings(page):
    _, prose = split_page(page.read_text())
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", prose):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        where = str(dest.relative_to(ROOT)) if dest.is_relative_to(ROOT) else str(dest)
        if path and where not in tree_files() and where not in tree_dirs():
            bad.append(f"{target}: no file {where} in the tree")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading #{anchor} in {where}")
    assert not bad, f"{rel(page)}: broken links:\n  " + "\n  ".join(bad)


# ---- `ferry ...` commands ------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def cli():
    from ferry import bench, cli

    top = cli.build_parser()
    sub = next(a for a in top._actions if a.choices and "doctor" in a.choices)
    return top, sub.choices, bench.suites()


def commands(text: str) -> list[str]:
    """`ferry WORD ...` as quoted: inline spans, and shell blocks (an untagged block
    holds program output, where "ferry pool 33 ms" is a report line)."""
    blocks, prose = split_page(text)
    shell = [body for lang, body in blocks if lang in ("sh", "bash", "shell", "console")]
    found = []
    for piece in code_spans(prose) + [line for b in shell for line in b.splitlines()]:
        for m in re.finditer(r"(?:^|(?<=[\s;&|(]))ferry\s+(?=[a-z-])", piece):
            rest = re.split(r"\s(?:\||&&|;|#|2?>)\s?|\)", piece[m.start():])[0]
            found.append(rest.strip())
    return found


def command_problem(cmd: str) -> str | None:
    top, subs, suites = cli()
    words = cmd.split()[1:]

    def options_of(parser) -> set[str]:
        return set(parser._option_string_actions)

    def unknown_flags(tokens, allowed) -> list[str]:
        return [t for t in tokens if t.startswith("--") and t.split("=")[0] not in allowed]

    if words[0].startswith("-"):
        bad = unknown_flags(words[:1], options_of(top))
        return f"`ferry` has no option {bad[0]}" if bad else None
    if words[0] not in subs:
        return f"no subcommand '{words[0]}' (ferry has {', '.join(subs)})"
    if words[0] != "bench":
        bad = unknown_flags(words[1:], options_of(subs[words[0]]))
        return f"`ferry {words[0]}` has no option {bad[0]}" if bad else None
    rest = words[1:]
    while rest and rest[0].startswith("-"):  # bench's own: --json FILE, --help
        if rest[0] not in options_of(subs["bench"]):
            return f"`ferry bench` has no option {rest[0]}"
        rest = rest[2:] if rest[0] == "--json" else rest[1:]
    if not rest or rest[0].isupper():  # `ferry bench`, `ferry bench SUITE`
        return None
    keys = rest[0].split(",")
    missing = [k for k in keys if k not in suites]
    if missing:
        return f"no bench suite '{missing[0]}' (suites: {', '.join(suites)})"
    allowed = set().union(*(options_of(suites[k].parser()) for k in keys))
    bad = unknown_flags(rest[1:], allowed)
    return f"`ferry bench {rest[0]}` has no option {bad[0]}" if bad else None


@pytest.mark.parametrize("page", PAGES, ids=page_ids())
def test_ferry_commands_exist(page):
    bad = [f"`{c}`: {why}" for c in commands(page.read_text()) if (why := command_problem(c))]
    assert not bad, f"{rel(page)} quotes commands that do not exist:\n  " + "\n  ".join(bad)


# ---- Python and C names --------------------------------------------------------------


def python_names(text: str) -> set[str]:
    names = set()
    for piece in quoted(text):
        for m in re.finditer(r"(?<![\w./-])ferry(?:\.[A-Za-z_]\w*)+", piece):
            name = m.group(0)
            if name.rsplit(".", 1)[1] in FILE_SUFFIXES:  # ferry.h, a file
                continue
            names.add(name)
    return names


def lookup(name: str) -> str | None:
    """None when `name` (ferry.a.b) is a module or an attribute reached from one."""
    parts = name.split(".")
    obj, path = importlib.import_module("ferry"), "ferry"
    for part in parts[1:]:
        path += "." + part
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        try:
            obj = importlib.import_module(path)
        except ModuleNotFoundError as e:
            if e.name is not None and e.name.startswith("ferry"):
                return f"no {path}"
            raise
    return None


@pytest.mark.parametrize("page", PAGES, ids=page_ids())
def test_python_names_exist(page):
    names = python_names(page.read_text())
    has_torch = importlib.util.find_spec("torch") is not None
    unchecked = set() if has_torch else {n for n in names if n.startswith("ferry.torch")}
    bad = [f"{n}: {why}" for n in sorted(names - unchecked) if (why := lookup(n))]
    assert not bad, f"{rel(page)} quotes Python names that do not exist:\n  " + "\n  ".join(bad)
    if unchecked:
        pytest.skip(f"needs PyTorch to look up {len(unchecked)} ferry.torch names (the rest exist)")


@functools.lru_cache(maxsize=None)
def header_words() -> frozenset[str]:
    return frozenset(re.findall(r"\w+", (ROOT / "include/ferry/ferry.h").read_text()))


@functools.lru_cache(maxsize=None)
def tree_words() -> frozenset[str]:
    """FERRY_* / FERRYTEST_* words of the tracked code and scripts (not the docs)."""
    words = set()
    for f in tree_files():
        if f.endswith(".md") or f.startswith(("docs/", "tests/fuzz/corpus/")):
            continue
        try:
            words.update(re.findall(r"FERRY\w+", (ROOT / f).read_text(errors="replace")))
        except (IsADirectoryError, UnicodeDecodeError):
            continue
    return frozenset(words)


def c_name_problems(text: str) -> list[str]:
    import ferry

    options = {name for name, _, _ in ferry.option_table()}
    bad = []
    for piece in quoted(text):
        for m in re.finditer(r"(?<![\w./-])(ferry_\w+|FERRY(?:TEST)?_\w+)(\*?)(\.py)?", piece):
            name, glob, py = m.groups()
            if py:  # backend/ferry_build.py: a path, checked with the paths
                continue
            if name.startswith("ferry_"):
                pool = header_words()
                where = "include/ferry/ferry.h"
            else:
                pool = header_words() | options | tree_words()
                where = "ferry.h, the option table or the tracked code"
            found = any(w.startswith(name) for w in pool) if glob else name in pool
            if not found:
                bad.append(f"{name}{glob}: not in {where}")
    return sorted(set(bad))


@pytest.mark.parametrize("page", PAGES, ids=page_ids())
def test_c_names_and_variables_exist(page):
    bad = c_name_problems(page.read_text())
    assert not bad, f"{rel(page)} quotes names that do not exist:\n  " + "\n  ".join(bad)


# ---- paths ---------------------------------------------------------------------------


def expand(path: str) -> list[str]:
    """a/{b,c}.h -> a/b.h, a/c.h"""
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    return [x for alt in m.group(1).split(",") for x in expand(path[:m.start()] + alt + path[m.end():])]


def path_problem(path: str) -> str | None:
    if path in FOREIGN_PATHS:
        return None
    files, dirs = tree_files(), tree_dirs()
    for p in expand(path):
        if "<" in p:  # tests/fuzz/corpus/<target>/: the part before the placeholder
            p = p[:p.index("<")]
        p = p.rstrip("/")
        if "*" in p:
            if not any(fnmatch.fnmatch(f, p) or fnmatch.fnmatch(f, p + "/*") for f in files):
                return f"{path}: nothing in the tree matches {p}"
        elif p not in files and p not in dirs:
            return f"{path}: no file or directory {p} in the tree (a build output? name its source)"
    return None


def quoted_paths(text: str) -> set[str]:
    """Paths under the tree's folders, anywhere in the page (prose too)."""
    roots = "|".join(re.escape(r) for r in PATH_ROOTS)
    found = set()
    for m in re.finditer(rf"(?<![\w./$~-])(?:{roots})/[\w./{{}},*<>+-]*", text):
        found.add(m.group(0).rstrip(".,:;"))
    return found


@pytest.mark.parametrize("page", PAGES, ids=page_ids())
def test_quoted_paths_exist(page):
    bad = [why for p in sorted(quoted_paths(page.read_text())) if (why := path_problem(p))]
    assert not bad, f"{rel(page)} names paths that are not in the tree:\n  " + "\n  ".join(bad)


# ---- README, the front door; docs/layout.md, the whole tree --------------------------


def test_readme_is_a_front_door():
    text = (ROOT / "README.md").read_text()
    lines = text.count("\n")
    assert lines <= 300, f"README.md has {lines} lines: it is the front door (<= 300); guides go in docs/"
    start = text.index("## Quick start")
    blocks, _ = split_page(text[start:text.index("\n## ", start + 1)])
    assert [b for lang, b in blocks if lang == "sh"] == ["pip install . && ferry doctor\nscripts/test"], \
        "README's quick start must keep its two commands"
    assert re.search(r"^exec scripts/test$", (ROOT / ".ci/run").read_text(), re.M), \
        ".ci/run no longer runs scripts/test, README's test command"
    assert re.search(r"`scripts/test` takes [^.]*minutes[^.]*downloads[^.]*GB", text), \
        "README no longer says how long scripts/test takes and what it downloads"


def test_readme_table_names_every_bench_suite():
    from ferry import bench

    text = (ROOT / "README.md").read_text()
    missing = [k for k in bench.SUITE_MODULES if not re.search(rf"`ferry bench {k}\b", text)]
    assert not missing, f"README's table leaves out `ferry bench` suites: {', '.join(missing)}"


def layout_entries() -> list[str]:
    """The full paths docs/layout.md's tree names: a line at column 0 starts a path
    from the root; an indented entry is inside the last folder above it with less
    indentation; an entry is the text before a run of two spaces (comma lists too)."""
    blocks, _ = split_page((ROOT / "docs/layout.md").read_text())
    entries, stack = [], []  # stack: (indent, folder)
    for line in blocks[0][1].splitlines():
        indent = len(line) - len(line.lstrip())
        head = re.split(r"\s{2,}", line.strip())[0]
        if indent >= 8 or not re.match(r"^[\w.{}/,* -]+$", head) or not re.search(r"[/.]", head):
            continue  # a description's continuation
        while stack and stack[-1][0] >= indent:
            stack.pop()
        base = stack[-1][1] if stack else ""
        for name in re.split(r",\s+", head):  # a list: "errors.py, pool.py"; not a/{b,c}
            entries.append(base + name)
        if head.endswith("/") and ", " not in head:
            stack.append((indent, base + head))
    return entries


def test_layout_names_what_exists_and_leaves_out_no_folder():
    entries = layout_entries()
    bad = [why for e in entries if (why := path_problem(e))]
    assert not bad, "docs/layout.md names what is not in the tree:\n  " + "\n  ".join(bad)
    named = {p.rstrip("/") for e in entries for p in expand(e)}
    tracked = tree_files()
    folders = {"/".join(f.split("/")[:i]) for f in tracked if f.startswith(("src/", "python/ferry/"))
               for i in range(2, f.count("/") + 1)}
    modules = {f for f in tracked if re.fullmatch(r"python/ferry/[a-z]\w*\.py", f)}
    missing = sorted((folders | modules) - named)
    assert not missing, "docs/layout.md leaves out: " + ", ".join(missing)


# ---- the PyTorch range: what pyproject admits is what scripts/test tests -------------


def minor(version: str) -> tuple[int, int]:
    major, minor_, *_ = version.split(".")
    return int(major), int(minor_)


def test_the_torch_extra_admits_only_the_pytorch_scripts_test_tests():
    """Issue 38, item 14: `pip install '.[torch]'` resolved a PyTorch nothing tested.
    pyproject's range is `torch>=OLDEST,<NEXT`: OLDEST is scripts/test's
    FERRYTEST_TORCH_OLDEST, the minor before NEXT its FERRYTEST_TORCH; the comment above
    the extra and docs/building.md say the same; numpy is in the extra (item 13)."""
    text = (ROOT / "pyproject.toml").read_text()
    m = re.search(r'^torch = \[(.*)\]$', text, re.M)
    assert m, "pyproject.toml has no torch extra"
    extra = re.findall(r'"([^"]+)"', m.group(1))
    assert "numpy" in extra, f"the torch extra {extra} lacks numpy (the DataLoader's workers need it)"
    rng = next((r for r in extra if r.startswith("torch")), "")
    bounds = re.fullmatch(r"torch>=(\d+\.\d+),<(\d+\.\d+)", rng)
    assert bounds, f"the torch extra's range {rng!r} is not torch>=OLDEST,<NEXT (a bound above: the newest tested)"
    lower, upper = bounds.groups()
    script = (ROOT / "scripts/test").read_text()
    newest = re.search(r"\$\{FERRYTEST_TORCH-torch==(\d+\.\d+)\.\*\}", script)
    oldest = re.search(r"\$\{FERRYTEST_TORCH_OLDEST-torch==(\d+\.\d+)\.\*\}", script)
    assert newest and oldest, "scripts/test's FERRYTEST_TORCH / FERRYTEST_TORCH_OLDEST defaults moved"
    assert oldest.group(1) == lower, f"pyproject admits torch>={lower}; scripts/test tests {oldest.group(1)}"
    assert minor(newest.group(1)) < minor(upper), f"scripts/test tests {newest.group(1)}, outside <{upper}"
    assert (minor(newest.group(1))[0], minor(newest.group(1))[1] + 1) == minor(upper), \
        f"pyproject admits up to <{upper}, but the newest scripts/test tests is {newest.group(1)}"
    comment = text[:m.start()].rsplit("\n\n", 1)[-1]
    for v in (lower, newest.group(1)):
        assert f" {v} " in comment, f"pyproject's comment on the torch extra does not name {v}, a tested release"
    assert f"`{rng}`" in (ROOT / "docs/building.md").read_text(), f"docs/building.md does not give `{rng}`"


# ---- the same tests from a copy of the source inside another repository --------------


def test_passes_in_a_copy_inside_another_repository(tmp_path):
    """Issue 38, item 16: with the source inside another git repository that ignores
    it (a vendored copy, an archive unpacked there), these tests asked that repository
    for the tree and 29 failed. Here: the tree, without build outputs, copied into an
    ignored folder of a fresh repository, and this file run there."""
    if os.environ.get("FERRYTEST_DOCS_IN_COPY"):
        pytest.skip("this run is the copy's own")
    git = shutil.which("git")
    if git is None:
        pytest.skip("needs git, to make the outer repository")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    outer = tmp_path / "outer"
    subprocess.run([git, "init", "-q", str(outer)], check=True, env=env, timeout=60)
    (outer / ".gitignore").write_text("third_party/\n")
    (outer / "app.py").write_text("print('the outer project')\n")
    copy = outer / "third_party" / "ferry"


    def leave_out(folder, names):  # what no source archive has: build outputs, caches
        top = pathlib.Path(folder) == ROOT
        return [n for n in names if n in ("__pycache__", ".pytest_cache") or re.search(r"\.so(\.|$)", n)
                or top and (n in (".git", ".whl") or re.fullmatch(r"build(-.*)?", n))]

    shutil.copytree(ROOT, copy, symlinks=True, ignore=leave_out)
    seen = subprocess.run([git, "ls-files", "--cached", "--others", "--exclude-standard"], cwd=copy,
                          capture_output=True, text=True, env=env, timeout=60)
    assert "README.md" not in seen.stdout.split(), "the outer repository does not ignore the copy"
    env["FERRYTEST_DOCS_IN_COPY"] = "1"
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "tests/python/test_docs.py"],
                         cwd=copy, capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, f"test_docs.py fails in {copy}:\n{run.stdout[-6000:]}{run.stderr[-2000:]}"
