import pytest

from hw.config import NicConfig, LinkConfig, HostConfig, preset, PRESETS


def test_presets_exist():
    assert {"connectx6", "small"} <= set(PRESETS)
    cx6 = preset("connectx6")
    assert cx6.nic.cycles(1000) == 250


@pytest.mark.parametrize("kw, msg", [
    ({"data_bytes": 12}, r"data_bytes must be a power of two in \[8, 64\], not 12"),
    ({"n_qps": 0}, r"n_qps must be a power of two in \[2, 16384\], not 0"),
    ({"n_doorbells": 513}, r"n_doorbells must be an integer in \[1, 512\], not 513"),
    ({"mtu": 1500}, r"mtu must be one of 256, 512, 1024, 2048, 4096, not 1500"),
    ({"max_rd_atomic": 17}, r"max_rd_atomic must be an integer in \[1, 16\], not 17"),
    ({"clock_mhz": 0}, r"clock_mhz must be a number in \[1.0, 1000.0\], not 0"),
    ({"dma_tags": 0}, r"dma_tags must be an integer in \[1, 256\], not 0"),
    ({"max_read_request": 100}, r"max_read_request must be a power of two in \[128, 4096\], not 100"),
    ({"max_payload": 8192}, r"max_payload must be a power of two in \[128, 4096\], not 8192"),
    ({"tlp_overhead": 300}, r"tlp_overhead must be an integer in \[0, 256\], not 300"),
    ({"wqe_batch": 8}, r"wqe_batch must be a power of two in \[1, 4\], not 8"),
    ({"fetch_depth": 0}, r"fetch_depth must be an integer in \[1, 16\], not 0"),
    ({"desc_depth": 6}, r"desc_depth must be a power of two in \[2, 64\], not 6"),
    ({"pu_rx_headers": 3}, r"pu_rx_headers must be a power of two in \[2, 256\], not 3"),
    ({"pu_rx_beats": 2048}, r"pu_rx_beats must be a power of two in \[2, 1024\], not 2048"),
    ({"bf_entries": 17}, r"bf_entries must be an integer in \[1, 16\], not 17"),
    ({"read_buffers": 1}, r"read_buffers must be a power of two in \[2, 16\], not 1"),
    ({"pay_buffers": 0}, r"pay_buffers must be an integer in \[1, 16\], not 0"),
    ({"gate_depth": 48}, r"gate_depth must be a power of two in \[2, 1024\], not 48"),
    ({"replay_slots": 32}, r"replay_slots must be 16 \(the responder's replay pointer is 4 bits\), not 32"),
    ({"doorbell_fifo_depth": 3}, r"doorbell_fifo_depth must be a power of two in \[2, 256\], not 3"),
    ({"cq_lookups": 5}, r"cq_lookups must be an integer in \[1, 4\], not 5"),
    ({"rsp_lookahead": 0}, r"rsp_lookahead must be an integer in \[1, 4\], not 0"),
    ({"atomic_inflight": 0}, r"atomic_inflight must be an integer in \[1, 16\], not 0"),
    ({"atomic_inflight": 17}, r"atomic_inflight must be an integer in \[1, 16\], not 17"),
    ({"rq_prefetch": 0}, r"rq_prefetch must be an integer in \[1, 16\], not 0"),
    ({"mr_cache_sets": 32}, r"mr_cache_sets must be a power of two in \[1, 16\], not 32"),
    ({"mr_cache_ways": 17}, r"mr_cache_ways must be an integer in \[1, 16\], not 17"),
    ({"mr_cache_policy": "plru", "mr_cache_ways": 3},
     r"mr_cache_ways must be a power of two in \[1, 16\], not 3"),
    ({"mr_cache_policy": "fifo"}, r"mr_cache_policy must be one of \('lru', 'plru'\), not 'fifo'"),
    ({"wqe_cache_sets": 3}, r"wqe_cache_sets must be a power of two in \[1, 65536\], not 3"),
    ({"wqe_cache_mshrs": 0}, r"wqe_cache_mshrs must be an integer in \[1, 16\], not 0"),
    ({"n_pus": 3}, r"n_pus must be a power of two in \[1, 8\], not 3"),
    ({"n_pus": 16}, r"n_pus must be a power of two in \[1, 8\], not 16"),
    # at most n_qps / 2 (each unit holds at least two QPs) and wqe_cache_sets (a set each)
    ({"n_pus": 4, "n_qps": 4}, r"n_pus must be a power of two in \[1, 2\], not 4"),
    ({"n_pus": 4, "wqe_cache_sets": 2}, r"n_pus must be a power of two in \[1, 2\], not 4"),
])
def test_bad_nic_parameters(kw, msg):
    with pytest.raises(ValueError, match=msg):
        NicConfig(**kw)


def test_bad_link_and_host_parameters():
    with pytest.raises(ValueError, match=r"gbps must be a number in \[0.1, 1600.0\], not -1"):
        LinkConfig(gbps=-1)
    with pytest.raises(ValueError, match=r"pcie_ns must be a number"):
        HostConfig(pcie_ns="fast")
    with pytest.raises(ValueError, match=r"kind must be one of \['python', 'rtl'\], not 'fpga'"):
        HostConfig(kind="fpga")
    with pytest.raises(ValueError, match=r"cpl_bytes must be a power of two in \[64, 4096\], not 32"):
        HostConfig(cpl_bytes=32)
    with pytest.raises(ValueError, match=r"rtl_mem_base must be a non-negative multiple"):
        HostConfig(rtl_mem_bytes=1 << 20, rtl_mem_base=0x1234)
    with pytest.raises(ValueError, match=r"host.cpl_bytes must be at most nic.max_payload \(128\)"):
        preset("small").replace(nic__max_payload=128, host__cpl_bytes=256)


def test_host_latencies():
    """A DMA read's round trip is the link both ways plus the host's memory time."""
    h = HostConfig(pcie_ns=150.0, host_mem_ns=100.0)
    assert h.dma_read_ns == 400.0 and h.dma_write_ns == 150.0


def test_unknown_preset():
    with pytest.raises(ValueError, match=r"preset must be one of \['connectx6', 'small'\], not 'cx7'"):
        preset("cx7")


def test_replace_dotted():
    c = preset("small").replace(nic__n_qps=32, link__latency_ns=10.0)
    assert c.nic.n_qps == 32 and c.link.latency_ns == 10.0
    with pytest.raises(ValueError, match="n_qps must be"):
        preset("small").replace(nic__n_qps=3)
