"""`ferry bench sanity` on this machine: no check fails; GPU checks are Waived
(with the reason) where there is no device, Passed where there is one."""

import ferry
from ferry.bench import sanity


def test_no_check_fails_and_waivers_say_why():
    results = sanity.run(verbose=True)
    failed = {n: why for n, (state, why) in results.items() if state == "Failed"}
    assert not failed, failed
    for name, (state, why) in results.items():
        if state == "Waived":
            assert why, name
    have_gpu = bool(ferry.cuda_info() and ferry.cuda_info().get("devices"))
    assert (results["copy_staged"][0] == "Passed") == have_gpu
    assert results["pool_recycles_exact_sizes"][0] == "Passed"
