"""scripts/ctest-skips: each test CTest skipped, with the reason it gave (issue 38,
item 17: CTest printed "***Skipped" alone), from ctest --output-junit's report."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]

GTEST_SKIP = """[ RUN      ] Smaps.Hugetlb
/home/ci/ferry/tests/core/smaps_test.cpp:168: Skipped
0 free 2 MiB hugetlb pages (need 2): reserve some with
echo 2 > /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages
[  SKIPPED ] Smaps.Hugetlb (0 ms)
"""
GPU_SKIP = "SKIPPED: the GPU tests need a CUDA device: no CUDA driver/device on this machine\n"
SILENT_SKIP = """[ RUN      ] A.Quiet
/x/tests/core/a_test.cpp:9: Skipped

[  SKIPPED ] A.Quiet (0 ms)
"""


def report(tmp_path, cases) -> pathlib.Path:
    """A JUnit report as ctest 3.25 writes it; cases: (name, status, skip message, output)."""
    body = []
    for name, status, message, out in cases:
        skip = f'<skipped message="{message}"/>' if message else ""
        body.append(f'<testcase name="{name}" classname="{name}" time="0" status="{status}">{skip}'
                    f"<system-out>{out.replace('&', '&amp;').replace('<', '&lt;').replace('>', '&gt;')}"
                    "</system-out></testcase>")
    path = tmp_path / "junit.xml"
    path.write_text(f'<?xml version="1.0" encoding="UTF-8"?><testsuite name="x" tests="{len(cases)}">'
                    + "".join(body) + "</testsuite>")
    return path


def run(path):
    return subprocess.run([sys.executable, str(ROOT / "scripts/ctest-skips"), str(path)],
                          capture_output=True, text=True, timeout=60)


def test_each_skip_is_listed_with_its_reason(tmp_path):
    r = run(report(tmp_path, [
        ("Smaps.Hugetlb", "notrun", "SKIP_REGULAR_EXPRESSION_MATCHED", GTEST_SKIP),
        ("ferry_gpu_tests", "notrun", "SKIP_RETURN_CODE=77", GPU_SKIP),
        ("Old.Case", "disabled", "Disabled", ""),
        ("Pool.Works", "run", "", "[       OK ] Pool.Works\n"),
    ]))
    assert r.returncode == 0, r.stderr
    assert "Skipped: 3 test(s)" in r.stdout
    assert ("  Smaps.Hugetlb: 0 free 2 MiB hugetlb pages (need 2): reserve some with echo 2 > "
            "/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages (tests/core/smaps_test.cpp:168)") in r.stdout
    assert ("  ferry_gpu_tests: the GPU tests need a CUDA device: no CUDA driver/device on this machine"
            in r.stdout)
    assert "  Old.Case: CTest: Disabled" in r.stdout
    assert "Pool.Works" not in r.stdout


def test_a_skip_without_a_reason_fails(tmp_path):
    r = run(report(tmp_path, [("A.Quiet", "notrun", "SKIP_REGULAR_EXPRESSION_MATCHED", SILENT_SKIP)]))
    assert r.returncode == 1
    assert "A.Quiet: NO REASON GIVEN" in r.stdout
    assert "gave no reason" in r.stderr and "A.Quiet" in r.stderr


def test_no_skips_and_unreadable_reports(tmp_path):
    r = run(report(tmp_path, [("Pool.Works", "run", "", "")]))
    assert (r.returncode, r.stdout.strip()) == (0, "ctest-skips: no test skipped")
    bad = tmp_path / "bad.xml"
    bad.write_text("<testsuite")
    assert run(bad).returncode == 2
    assert run(tmp_path / "missing.xml").returncode == 2
