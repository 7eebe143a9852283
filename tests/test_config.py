import pytest

from hw.config import NicConfig, LinkConfig, HostConfig, preset, PRESETS


def test_presets_exist():
    assert {"connectx6", "small"} <= set(PRESETS)
    cx6 = preset("connectx6")
    assert cx6.nic.cycles(1000) == 250


@pytest.mark.parametrize("kw, msg", [
    ({"data_bytes": 12}, r"data_bytes must be a power of two in \[8, 64\], not 12"),
    ({"n_qps": 0}, r"n_qps must be an integer in \[2, 1024\], not 0"),
    ({"n_doorbells": 513}, r"n_doorbells must be an integer in \[1, 512\], not 513"),
    ({"mtu": 1500}, r"mtu must be one of 256, 512, 1024, 2048, 4096, not 1500"),
    ({"max_rd_atomic": 17}, r"max_rd_atomic must be an integer in \[1, 16\], not 17"),
    ({"clock_mhz": 0}, r"clock_mhz must be a number in \[1.0, 1000.0\], not 0"),
])
def test_bad_nic_parameters(kw, msg):
    with pytest.raises(ValueError, match=msg):
        NicConfig(**kw)


def test_bad_link_and_host_parameters():
    with pytest.raises(ValueError, match=r"gbps must be a number in \[0.1, 1600.0\], not -1"):
        LinkConfig(gbps=-1)
    with pytest.raises(ValueError, match=r"dma_read_ns must be a number"):
        HostConfig(dma_read_ns="fast")


def test_unknown_preset():
    with pytest.raises(ValueError, match=r"preset must be one of \['connectx6', 'small'\], not 'cx7'"):
        preset("cx7")


def test_replace_dotted():
    c = preset("small").replace(nic__n_qps=32, link__latency_ns=10.0)
    assert c.nic.n_qps == 32 and c.link.latency_ns == 10.0
    with pytest.raises(ValueError, match="n_qps must be"):
        preset("small").replace(nic__n_qps=3)
