"""The rules' checks of the GPUs and their links: link speed, pinned and pageable
bandwidth, peers, BAR1, the driver, GDRCopy."""

from __future__ import annotations

from typing import Optional

from ..units import fmt_bytes as _fmt_bytes
from ..units import fmt_gbps as _gbps
from ..units import percent as _pct

from .inputs import _dict, _gpu_label, _gpus, _host, _link, _num, _per_gpu, _str
from .model import Verdict
from .thresholds import PAGEABLE_MIN_SHARE, PINNED_MIN_SHARE


def check_pcie_link_degraded(facts: dict, m: dict) -> Optional[Verdict]:
    evidence, idle_gen_only = [], True
    for key, gpu in _gpus(facts):
        pcie = _dict(gpu.get("pcie"), f"gpus[{key}].pcie")
        gen = _num(pcie.get("gen"), f"gpus[{key}].pcie.gen")
        width = _num(pcie.get("width"), f"gpus[{key}].pcie.width")
        max_gen = _num(pcie.get("max_gen"), f"gpus[{key}].pcie.max_gen")
        max_width = _num(pcie.get("max_width"), f"gpus[{key}].pcie.max_width")
        gen_low = gen is not None and max_gen is not None and gen < max_gen
        width_low = width is not None and max_width is not None and width < max_width
        if not (gen_low or width_low):
            continue
        # An idle GPU lowers its link generation to save power. If a pinned copy
        # reached full speed, the link trains up under load: nothing to report.
        max_link = _num(gpu.get("max_link_gbps"), f"gpus[{key}].max_link_gbps")
        pinned = [
            x
            for x in (_per_gpu(m, "pinned_h2d_gbps", key), _per_gpu(m, "pinned_d2h_gbps", key))
            if x is not None
        ]
        if gen_low and not width_low and max_link and pinned:
            if max(pinned) >= PINNED_MIN_SHARE * max_link:
                continue
        idle_gen_only &= gen_low and not width_low
        cur = f"Gen{gen if gen is None else int(gen)} x{width if width is None else int(width)}"
        top = f"Gen{max_gen if max_gen is None else int(max_gen)} x{max_width if max_width is None else int(max_width)}"
        line = f"{_gpu_label(key, gpu)}: PCIe link runs at {cur}, the GPU and slot allow {top}"
        link = _num(gpu.get("link_gbps"), f"gpus[{key}].link_gbps")
        if link is not None and max_link and link < max_link:
            line += f" ({_gbps(link)} of {_gbps(max_link)} per direction)"
        evidence.append(line)
        if pinned and max_link:
            evidence.append(
                f"{_gpu_label(key, gpu)}: best pinned copy {_gbps(max(pinned))} = "
                f"{_pct(max(pinned), max_link)} of the full link's {_gbps(max_link)}"
            )
    if not evidence:
        return None
    if idle_gen_only:
        evidence.append(
            "only the generation is lower: an idle GPU drops its link generation to save "
            "power, so re-read it while a copy runs before touching hardware"
        )
    return Verdict(
        evidence,
        "read the link under load (`nvidia-smi -q -d PCIE` while `ferry bench` runs); if it "
        "stays low, check the slot's speed setting in the BIOS, reseat the card or its riser, "
        "and move the GPU to a CPU-attached x16 slot (`nvidia-smi topo -m`, `lspci -vv`: LnkSta vs LnkCap)",
    )


def check_pinned_bandwidth_low(facts: dict, m: dict) -> Optional[Verdict]:
    evidence, nodes = [], set()
    for key, gpu in _gpus(facts):
        link, link_name = _link(gpu, key, m)
        if link is None:
            continue
        for name, direction in (("pinned_h2d_gbps", "host->device"), ("pinned_d2h_gbps", "device->host")):
            rate = _per_gpu(m, name, key)
            if rate is None or rate >= PINNED_MIN_SHARE * link:
                continue
            evidence.append(
                f"{_gpu_label(key, gpu)}: pinned {direction} {_gbps(rate)} = {_pct(rate, link)} "
                f"of the {link_name}'s {_gbps(link)} (expected at least {PINNED_MIN_SHARE:.0%})"
            )
            node = gpu.get("numa_node")
            if node is not None and not (isinstance(node, int) and node < 0):
                nodes.add(node)
    if not evidence:
        return None
    node = sorted(nodes)[0] if len(nodes) == 1 else "N"
    return Verdict(
        evidence,
        "find what shares the path: `nvidia-smi topo -m` (PCIe switch or another device on the "
        "root port), `nvidia-smi -q -d PCIE` (link under load), other copies running at the same "
        f"time; keep host memory on the GPU's NUMA node (`numactl --cpunodebind={node} "
        f"--membind={node} <command>`); in a VM pass the GPU through without an emulated bridge",
    )


GPU_PEER_MIN_SHARE = 0.85  # a GPU below this share of its best peer is flagged


def check_gpu_below_peers(facts: dict, m: dict) -> Optional[Verdict]:
    gpus = list(_gpus(facts))
    if len(gpus) < 2:
        return None
    evidence = []
    links = {key: gpu.get("link_gbps") for key, gpu in gpus if isinstance(gpu.get("link_gbps"), (int, float))}
    if len(links) >= 2:
        best = max(links.values())
        for key, gpu in gpus:
            if key in links and links[key] < GPU_PEER_MIN_SHARE * best:
                evidence.append(f"{_gpu_label(key, gpu)}: link {_gbps(links[key])} per direction, "
                                f"the best GPU's {_gbps(best)}")
    for name, direction in (("pinned_h2d_gbps", "host->device"), ("pinned_d2h_gbps", "device->host")):
        rates = {key: _per_gpu(m, name, key) for key, _ in gpus}
        rates = {k: v for k, v in rates.items() if v is not None}
        if len(rates) < 2:
            continue
        best = max(rates.values())
        for key, gpu in gpus:
            if key in rates and rates[key] < GPU_PEER_MIN_SHARE * best:
                evidence.append(f"{_gpu_label(key, gpu)}: pinned {direction} {_gbps(rates[key])} = "
                                f"{_pct(rates[key], best)} of the best GPU's {_gbps(best)}")
    if not evidence:
        return None
    return Verdict(
        evidence,
        "compare the slots and links (`nvidia-smi topo -m`, `nvidia-smi -q -d PCIE`): a GPU behind a switch, "
        "on a narrower or slower link, or on the far NUMA node gets less; spread heavy transfers over the "
        "faster GPUs or move the slow one to a CPU-attached x16 slot",
    )


def check_bar1_small(facts: dict, m: dict) -> Optional[Verdict]:
    evidence = []
    for key, gpu in _gpus(facts):
        bar1 = _num(gpu.get("bar1_bytes"), f"gpus[{key}].bar1_bytes")
        mem = _num(gpu.get("memory_bytes"), f"gpus[{key}].memory_bytes")
        if bar1 is None or mem is None or bar1 >= mem:
            continue
        evidence.append(
            f"{_gpu_label(key, gpu)}: BAR1 {_fmt_bytes(bar1)} < {_fmt_bytes(mem)} of device "
            "memory: at most that much can be mapped for the CPU (GDRCopy) or for peers (RDMA)"
        )
    if not evidence:
        return None
    return Verdict(
        evidence,
        "enable 'Above 4G Decoding' and 'Resizable BAR' in the BIOS; in a VM give the guest a "
        "64-bit MMIO window as large as the BAR (QEMU: `-global q35-pcihost.pci-hole64-size=512G`); "
        "check with `nvidia-smi -q -d MEMORY` (BAR1 Memory Usage)",
    )


def check_gdrdrv_absent(facts: dict, m: dict) -> Optional[Verdict]:
    gdr = _dict(_host(facts).get("gdrcopy"), "host.gdrcopy")
    if gdr.get("available") is not False:
        return None
    evidence = []
    reason = _str(gdr.get("reason"), "host.gdrcopy.reason")
    if reason:
        evidence.append(f"GDRCopy unavailable: {reason}")
    for key, what in (("gdrdrv", "gdrdrv kernel module (/dev/gdrdrv)"), ("libgdrapi", "libgdrapi.so")):
        if gdr.get(key) is not None:
            evidence.append(f"{what}: {'present' if gdr.get(key) else 'absent'}")
    if not evidence:
        evidence.append("GDRCopy unavailable (no reason recorded)")
    evidence.append(
        "ferry does not need it: its low-latency channel is a persistent GPU kernel polling "
        "mapped pinned memory, with no kernel module"
    )
    return Verdict(
        evidence,
        "nothing to do for ferry; to use GDRCopy as a backend, install the gdrcopy packages "
        "and load the module (`sudo modprobe gdrdrv`), and in containers pass `--device /dev/gdrdrv`",
    )


def check_no_cuda_driver(facts: dict, m: dict) -> Optional[Verdict]:
    if "cuda" not in facts or facts["cuda"] is not None:
        return None
    return Verdict(
        ["the CUDA driver could not be loaded or initialized (libcuda.so missing, or cuInit failed)"],
        "install the NVIDIA driver and check that `nvidia-smi` lists the GPU; in docker run with "
        "`--gpus all` (NVIDIA Container Toolkit); under gVisor run `runsc --nvproxy`",
    )


def check_no_gpu_visible(facts: dict, m: dict) -> Optional[Verdict]:
    cuda = _dict(facts.get("cuda"), "cuda")
    count = _num(cuda.get("device_count"), "cuda.device_count")
    if count is None or count > 0:
        return None
    driver = cuda.get("driver_version")
    return Verdict(
        [f"CUDA driver {driver or '(version unknown)'}: device_count = 0"],
        "check `nvidia-smi -L` and that CUDA_VISIBLE_DEVICES is unset or names a GPU "
        "(`env | grep CUDA_VISIBLE_DEVICES`); in docker pass `--gpus all`",
    )


def _thread_order(item: tuple) -> tuple:
    key = str(item[0])
    return (not key.isdigit(), int(key) if key.isdigit() else 0, key)


def check_pageable_path_slow(facts: dict, m: dict) -> Optional[Verdict]:
    evidence = []
    for key, gpu in _gpus(facts):
        link, link_name = _link(gpu, key, m)
        if link is None:
            continue
        for d, direction in (("h2d", "host->device"), ("d2h", "device->host")):
            cuda = _per_gpu(m, f"pageable_{d}_gbps_cuda", key)
            if cuda is None or cuda >= PAGEABLE_MIN_SHARE * link:
                continue
            line = (
                f"{_gpu_label(key, gpu)}: CUDA pageable {direction} {_gbps(cuda)} = "
                f"{_pct(cuda, link)} of the {link_name}'s {_gbps(link)}"
            )
            ferry = _per_gpu(m, f"pageable_{d}_gbps_ferry", key)
            if ferry is not None and cuda > 0:
                line += f"; ferry staged copy {_gbps(ferry)} ({ferry / cuda:.1f}x)"
            evidence.append(line)
    if not evidence:
        return None
    by_threads = _dict(m.get("memcpy_gbps_by_threads"), "memcpy_gbps_by_threads")
    rates = []
    for threads, rate in sorted(by_threads.items(), key=_thread_order):
        rate = _num(rate, f"memcpy_gbps_by_threads[{threads}]")
        if rate is not None:
            rates.append(f"{threads} thread{'' if str(threads) == '1' else 's'} {_gbps(rate)}")
    if rates:
        evidence.append("host memcpy (bounds a staged copy): " + ", ".join(rates))
    return Verdict(
        evidence,
        "copy pageable buffers with ferry (ferry.copy, or ferry.torch's tensor copies), which "
        "stage through pinned pool chunks on several threads; better, allocate the buffers "
        "that move often from a ferry.PinnedPool (pinned memory goes straight to the DMA engine)",
    )
