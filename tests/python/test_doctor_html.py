"""`ferry doctor --html FILE` (python/ferry/doctor/html_report.py): the command writes one
self-contained page that parses, names every finding and embeds its plots as PNGs; a
headless browser opens it (skipped, saying so, where none is installed: .ci/run
installs chromium); the builder on a synthetic two-GPU report (the GPU plots run
here too), with hostile strings escaped and without matplotlib."""

import base64
import errno
import html.parser
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time

import pytest

from ferry.doctor import html_report

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
DATA_PNG = re.compile(r'src="data:image/png;base64,([A-Za-z0-9+/=]*)"')
FINDING_LINE = re.compile(r"^\[(critical|warning|info)\] ([a-z0-9-]+): ", re.M)
HOSTILE = '<script>alert("x")</script>'
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def have_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


class Page(html.parser.HTMLParser):
    """Parses a page and checks that every element it opens is closed in order."""

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.stack, self.errors, self.urls, self.tags, self.title, self.ids = [], [], [], [], "", []
        self.text_parts = []
        self.feed(text)
        self.close()
        if self.stack:
            self.errors.append(f"never closed: {self.stack}")

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        for name, value in attrs:
            if name in ("src", "href"):
                self.urls.append(value or "")
            if name == "id":
                self.ids.append(value)
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()

    def handle_data(self, data):
        if self.stack and self.stack[-1] == "title":
            self.title += data
        self.text_parts.append(data)

    @property
    def text(self) -> str:
        return "".join(self.text_parts)


def check_page(text: str) -> Page:
    """The page parses, balances, and loads nothing from elsewhere."""
    page = Page(text)
    assert not page.errors, page.errors[:5]
    assert page.title == html_report.TITLE
    assert "script" not in page.tags and "link" not in page.tags and "iframe" not in page.tags
    for url in page.urls:
        assert url.startswith(("data:image/png;base64,", "#")), url[:80]
    assert len(page.ids) == len(set(page.ids)), "duplicate ids"
    return page


def png_images(text: str) -> list[bytes]:
    images = [base64.b64decode(b64, validate=True) for b64 in DATA_PNG.findall(text)]
    for data in images:
        assert data.startswith(PNG_MAGIC) and len(data) > 1000
    return images


# ---- the command ---------------------------------------------------------------


@pytest.fixture(scope="module")
def doctor_page(tmp_path_factory):
    out = tmp_path_factory.mktemp("doctor-html") / "doctor.html"
    r = subprocess.run([sys.executable, "-m", "ferry", "doctor", "--quick", "--html", str(out)],
                       capture_output=True, text=True, timeout=300)
    return r, out


def test_doctor_html_writes_a_page_with_every_finding(doctor_page):
    r, out = doctor_page
    assert r.returncode == 0, r.stderr
    assert f"ferry doctor: HTML report written to {out}" in r.stderr
    assert "Measurements" in r.stdout  # the text report still goes to stdout
    assert os.listdir(out.parent) == [out.name]  # no temporary file left beside it
    text = out.read_text(encoding="utf-8")
    page = check_page(text)
    assert "Measurements" in page.text and "Facts" in page.text and "Skipped measurements" in page.text
    ids = [m.group(2) for m in FINDING_LINE.finditer(r.stdout)]
    if ids:
        for finding_id in ids:
            assert f"<code>{finding_id}</code>" in text, finding_id
    else:
        assert "No findings" in page.text
    assert "first touch" in page.text and "GB/s" in page.text


def test_doctor_html_embeds_png_plots(doctor_page):
    if not have_matplotlib():
        pytest.skip("matplotlib is not installed (pip install '.[test]' installs it)")
    r, out = doctor_page
    assert r.returncode == 0, r.stderr
    text = out.read_text(encoding="utf-8")
    assert "data:image/png;base64," in text
    assert len(png_images(text)) >= 2  # host memcpy by threads, first touch: measured everywhere
    assert "could not be drawn" not in text and html_report.NEED_MATPLOTLIB not in text


def test_doctor_html_without_matplotlib_still_writes_the_page(tmp_path):
    out = tmp_path / "page.html"
    code = ("import sys; sys.modules['matplotlib'] = None; from ferry.cli import main; "
            f"sys.exit(main(['doctor', '--quick', '--html', {str(out)!r}]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    text = out.read_text(encoding="utf-8")
    check_page(text)
    assert html_report.NEED_MATPLOTLIB in text and "data:image" not in text


def test_doctor_html_into_a_missing_folder_fails_before_measuring(tmp_path):
    out = tmp_path / "no such folder" / "page.html"
    r = subprocess.run([sys.executable, "-m", "ferry", "doctor", "--quick", "--html", str(out)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "cannot write the HTML report" in r.stderr and "[2/" not in r.stderr
    assert not out.parent.exists()


# ---- a headless browser opens it ----------------------------------------------------


def find_browser():
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


def browse(browser: str, tmp_path, *args: str) -> subprocess.CompletedProcess:
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           "--no-first-run", "--hide-scrollbars", f"--user-data-dir={tmp_path / 'profile'}", *args]
    env = dict(os.environ, HOME=str(tmp_path))
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("which", ["doctor", "synthetic"])
def test_a_headless_browser_renders_the_page(which, doctor_page, tmp_path):
    browser = find_browser()
    if browser is None:
        pytest.skip(f"no headless browser installed (looked for {', '.join(BROWSERS)}; "
                    ".ci/run installs Debian's chromium)")
    if which == "doctor":
        r, page = doctor_page
        assert r.returncode == 0, r.stderr
    else:
        page = tmp_path / "synthetic.html"
        html_report.write(synthetic_report(), page)
    url = page.resolve().as_uri()
    shot = tmp_path / f"{which}.png"
    r = browse(browser, tmp_path, "--window-size=1200,2400", f"--screenshot={shot}", url)
    assert shot.exists(), f"no screenshot: {r.stderr[-2000:]}"
    data = shot.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10 * 1024, len(data)
    r = browse(browser, tmp_path, "--dump-dom", url)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"<title>{html_report.TITLE}</title>" in r.stdout
    assert "Measurements" in r.stdout and "Findings" in r.stdout


# ---- the builder, on a synthetic report ----------------------------------------------


def synthetic_report(hostile: str = "") -> dict:
    gpu = {"name": "NVIDIA H200" + hostile, "compute_capability": "9.0", "memory_bytes": 150 << 30,
           "pci_bus_id": "0000:1a:00.0", "link_gbps": 63.0, "max_link_gbps": 63.0,
           "pcie": {"gen": 5, "width": 16, "max_gen": 5, "max_width": 16, "source": "sysfs"},
           "bar1_bytes": 256 << 30, "numa_node": 0, "cpu_affinity": "0-47", "notes": []}
    rows = [{"nbytes": size, "pinned_h2d_gbps": p, "pinned_d2h_gbps": p - 1,
             "pageable_h2d_gbps_ferry": p * 0.7, "pageable_d2h_gbps_ferry": p * 0.75,
             "pageable_h2d_gbps_cuda": p * 0.2, "pageable_d2h_gbps_cuda": p * 0.3}
            for size, p in ((4 << 20, 38.0), (64 << 20, 50.0), (256 << 20, 54.0), (1 << 30, 55.4), (4 << 30, 55.6))]
    return {
        "facts_version": 1,
        "host": {"kernel": "6.8.0" + hostile, "os": "Ubuntu 24.04",
                 "virtualization": {"kind": "kvm", "hypervisor": "KVM", "evidence": ["cpuinfo flags" + hostile]},
                 "cpu": {"model": "Xeon", "logical_cpus": 96, "online": "0-95"},
                 "memory": {"total_bytes": 1 << 40, "available_bytes": 900 << 30},
                 "numa_nodes": [{"id": 0, "cpus": "0-47", "mem_total_bytes": 512 << 30},
                                {"id": 1, "cpus": "48-95", "mem_total_bytes": 512 << 30}],
                 "thp": {"enabled": "always", "defrag": "madvise", "shmem_enabled": "never",
                         "pmd_size_bytes": 2 << 20},
                 "hugetlb": [{"page_size_bytes": 2 << 20, "total": 0, "free": 0, "reserved": 0, "surplus": 0}],
                 "memlock_bytes": None, "iommu": {"present": True, "mode": "passthrough", "groups": 120},
                 "process": {"cpus_allowed": "0-95", "mems_allowed": "0-1"},
                 "kernel_modules": {"loadable": True}, "gdrcopy": {"available": False, "reason": "no /dev/gdrdrv"},
                 "notes": ["a note" + hostile]},
        "cuda": {"driver_version": "13.0", "runtime_version": "13.0" + hostile, "device_count": 2},
        "gpus": [dict(gpu, index=0), dict(gpu, index=1, link_gbps=4.0)],  # GPU 1's link idles at Gen1
        "notes": [],
        "ferry": {"library": "0.1.0"},
        "mode": "full",
        "elapsed_seconds": 71.2,
        "measurements": {
            "copy_bytes": 1 << 30,
            "pinned_h2d_gbps": {"0": 55.4, "1": 54.9}, "pinned_d2h_gbps": {"0": 55.0, "1": 53.1},
            "pageable_h2d_gbps_ferry": {"0": 41.2, "1": 40.0}, "pageable_h2d_gbps_cuda": {"0": 6.9, "1": 7.1},
            "pageable_d2h_gbps_ferry": {"0": 40.9, "1": 39.5}, "pageable_d2h_gbps_cuda": {"0": 15.6, "1": 15.0},
            "pinned_alloc_seconds_ferry": 0.034, "pinned_alloc_seconds_cuda": 0.495, "pinned_alloc_bytes": 1 << 30,
            "small_copy_us_channel_h2d": 1.9, "small_copy_us_cuda_h2d": 9.8,
            "small_copy_us_channel_d2h": 2.4, "small_copy_us_cuda_d2h": 9.5,
            "register_gbps_4k": 2.0, "register_gbps_thp": 3.8, "register_bytes": 1 << 30,
            "memcpy_gbps_by_threads": {"16": 40.1, "1": 10.2, "2": 19.5, "4": 30.0, "8": 37.7},
            "memcpy_bytes": 256 << 20,
            "first_touch_4k_1thread_gbps": 1.1, "first_touch_4k_gbps": 8.4, "first_touch_thp_gbps": 20.1,
            "first_touch_bytes": 1 << 30,
            "bandwidth_by_size": {"0": rows, "1": rows[:3]},
        },
        "skipped": [{"what": "registration rate, hugetlb pages, GPU 0 (1 GiB)", "keys": ["register_gbps_hugetlb"],
                     "why": "0 free 2 MiB hugetlb pages, 512 needed" + hostile}],
        "findings": [
            {"id": "hugetlb-not-reserved", "severity": "info", "title": "No hugetlb pages are reserved",
             "evidence": ["2 MiB pages: 0 reserved"], "fix": "`echo 512 | sudo tee /sys/.../nr_hugepages`"},
            {"id": "pcie-link-degraded", "severity": "critical", "title": "PCIe link below its max" + hostile,
             "evidence": ["gen 1 x16 < gen 5 x16" + hostile], "fix": "reseat the card" + hostile},
            {"id": "vm-first-touch-costly", "severity": "warning", "title": "First touch is costly",
             "evidence": ["1.1 GB/s"], "fix": "create one ferry.PinnedPool at start-up"},
        ],
        "pool": {"allocations": 1, "huge": {"reserved": {"peak": 1 << 30}}},
    }


def test_builder_shows_gpu_measurements_with_their_ratios():
    text = html_report.build(synthetic_report())
    page = check_page(text)
    t = page.text
    assert "GPU 0 (NVIDIA H200), link 63.0 GB/s per direction" in t
    assert "55.4 GB/s, 88% of the 63.0 GB/s link" in t
    assert "GPU 1 (NVIDIA H200), link 63.0 GB/s per direction" in t  # max link: a copy beat the idle link
    assert "ferry 41.2 GB/s vs CUDA 6.9 GB/s (6.0x), 65% of the 63.0 GB/s link" in t
    assert "ferry pool 34 ms vs cudaHostAlloc 495 ms (14.6x)" in t
    assert "channel 1.9 us vs cudaMemcpy 9.8 us (5.2x)" in t
    assert "4 KiB pages 2.0 GB/s, THP 3.8 GB/s (1.9x)" in t
    assert "host memcpy (256 MiB)" in t and "16 threads 40.1 GB/s" in t
    assert "first touch (1 GiB)" in t and "THP all threads 20.1 GB/s" in t
    assert "Bandwidth by size, GPU 1 (GB/s)" in t and "<th>4 GiB</th>" in text
    assert "0 free 2 MiB hugetlb pages, 512 needed" in t
    assert "NUMA node 1" in t and "gen 5 x16, 63.0 GB/s per direction (source: sysfs)" in t


def test_builder_opens_with_the_findings_then_measurements_then_facts():
    text = html_report.build(synthetic_report())
    order = [text.index(f'<h2 id="{i}">') for i in ("findings", "measurements", "skipped", "plots", "facts")]
    assert order == sorted(order)


def test_builder_sorts_findings_by_severity_with_fix_in_code():
    text = html_report.build(synthetic_report())
    details = text[text.index('<h2 id="findings">'):]
    order = [details.index(f'id="finding-{i}"') for i in ("pcie-link-degraded", "vm-first-touch-costly",
                                                         "hugetlb-not-reserved")]
    assert order == sorted(order)
    assert "<code>`echo 512 | sudo tee /sys/.../nr_hugepages`</code>" in text
    assert "<li>2 MiB pages: 0 reserved</li>" in text
    assert "3 findings: 1 critical, 1 warning, 1 info" in Page(text).text


def test_builder_draws_every_gpu_plot():
    if not have_matplotlib():
        pytest.skip("matplotlib is not installed (pip install '.[test]' installs it)")
    text = html_report.build(synthetic_report())
    assert [title for title, _ in html_report.plans(synthetic_report())] == [
        "Bandwidth by path", "Bandwidth by size", "Host memcpy by threads", "First-touch rates"]
    assert len(png_images(text)) == 4
    assert "could not be drawn" not in text


def test_builder_escapes_hostile_strings():
    report = synthetic_report(hostile=HOSTILE + "$x$ & \"'")
    report["measurements"]["memcpy_gbps_by_threads"][HOSTILE] = 1.0  # not a thread count: ignored
    report["pool"][HOSTILE] = HOSTILE
    report["findings"].append(dict(report["findings"][0], id="x" + HOSTILE, severity=HOSTILE))
    report["findings"].append(dict(report["findings"][0]))  # the same id twice: anchors stay unique
    text = html_report.build(report)
    check_page(text)
    assert "<script" not in text.lower()
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in text
    assert "could not be" not in text  # a '$' in a GPU name does not break the plots' mathtext


def test_builder_without_matplotlib_says_so(monkeypatch):
    for name in [n for n in sys.modules if n == "matplotlib" or n.startswith("matplotlib.")] + ["matplotlib"]:
        monkeypatch.setitem(sys.modules, name, None)
    text = html_report.build(synthetic_report())
    check_page(text)
    assert html_report.NEED_MATPLOTLIB in text and "data:image" not in text
    assert "ferry 41.2 GB/s vs CUDA 6.9 GB/s (6.0x)" in text


def test_a_plot_that_fails_is_replaced_by_a_note(monkeypatch):
    if not have_matplotlib():
        pytest.skip("matplotlib is not installed (pip install '.[test]' installs it)")

    def broken(report, figure):
        raise ValueError("no axes")

    monkeypatch.setattr(html_report, "_plot_memcpy", broken)
    text = html_report.build(synthetic_report())
    check_page(text)
    assert 'plot "Host memcpy by threads" could not be drawn: ValueError: no axes' in text
    assert len(png_images(text)) == 3


def test_builder_on_a_partial_report():
    page = check_page(html_report.build({}))
    assert "no CUDA driver found" in page.text and "(none)" in page.text and "No findings" in page.text
    page = check_page(html_report.build({"measurements": {"pinned_h2d_gbps": "fast"}, "gpus": "?", "findings": [{}]}))
    assert "Findings" in page.text


def test_write_is_atomic_and_keeps_the_mode(tmp_path):
    out = tmp_path / "r.html"
    out.write_text("old")
    out.chmod(0o640)
    assert html_report.write(synthetic_report(), out) == str(out)
    assert out.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert (out.stat().st_mode & 0o777) == 0o640
    assert os.listdir(tmp_path) == ["r.html"]
    with pytest.raises(OSError):
        html_report.write(synthetic_report(), tmp_path / "missing" / "r.html")
    assert html_report.unwritable(tmp_path / "missing" / "r.html")
    assert html_report.unwritable(tmp_path) and html_report.unwritable(out) is None


# ---- what is at the path: regular files are replaced, nothing else is (issue 21) ----


def test_write_into_a_private_character_device_keeps_the_node(tmp_path):
    # A private node in a temporary folder (never a path under /dev: as root, a bug
    # here would replace the system's device). 1:3 is the null device.
    node = tmp_path / "null"
    try:
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("mknod needs CAP_MKNOD")
    try:
        written = html_report.write(synthetic_report(), node)
    except OSError as e:  # a folder mounted nodev cannot open the node: refused, never replaced
        assert "null" in str(e) or e.errno in (errno.EACCES, errno.EPERM)
    else:
        assert written == str(node)
    assert stat.S_ISCHR(os.lstat(node).st_mode) and os.lstat(node).st_rdev == os.makedev(1, 3)
    assert os.listdir(tmp_path) == ["null"]


def test_write_into_a_fifo_with_a_reader_keeps_the_fifo(tmp_path):
    fifo = tmp_path / "page.fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()), daemon=True)
    reader.start()
    deadline = time.monotonic() + 10
    while True:  # the reader's open() is under way once the FIFO has a reader
        try:
            html_report.write(synthetic_report(), fifo)
            break
        except OSError as e:
            assert "no reader" in str(e) and time.monotonic() < deadline
            time.sleep(0.01)
    reader.join(10)
    assert got and got[0].startswith(b"<!DOCTYPE html>")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and os.listdir(tmp_path) == ["page.fifo"]


def test_write_into_a_fifo_without_a_reader_fails_at_once(tmp_path):
    fifo = tmp_path / "page.fifo"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="FIFO with no reader"):
        html_report.write(synthetic_report(), fifo)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_write_refuses_an_empty_path_a_directory_and_a_socket(tmp_path):
    sock_path = tmp_path / "s.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock_path))
    try:
        for bad, why in (("", "empty"), (tmp_path, "directory"), (sock_path, "socket")):
            assert why in html_report.unwritable(bad)
            with pytest.raises(OSError, match=why):
                html_report.write(synthetic_report(), bad)
        assert stat.S_ISSOCK(os.lstat(sock_path).st_mode)
    finally:
        s.close()


def test_write_through_a_symlink_replaces_the_file_and_keeps_the_link(tmp_path):
    target = tmp_path / "real.html"
    target.write_text("old")
    link = tmp_path / "link.html"
    link.symlink_to(target)
    assert html_report.write(synthetic_report(), link) == str(target)
    assert link.is_symlink() and target.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")


@pytest.mark.parametrize("kind", ["empty", "fifo"])
def test_doctor_refuses_before_measuring(kind, tmp_path):
    # "" was ignored silently; a FIFO without a reader is refused without a hang.
    target = ""
    if kind == "fifo":
        target = str(tmp_path / "p.fifo")
        os.mkfifo(target)
    r = subprocess.run([sys.executable, "-m", "ferry", "doctor", "--quick", "--html", target],
                       capture_output=True, text=True, timeout=120)
    if kind == "empty":
        assert r.returncode == 2 and "empty" in r.stderr and "[2/" not in r.stderr
    else:
        assert r.returncode == 1 and "no reader" in r.stderr
        assert stat.S_ISFIFO(os.lstat(target).st_mode)
