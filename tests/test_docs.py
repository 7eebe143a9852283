"""The generated format tables in docs/formats.md match the layouts in hw/."""

from hw.formats import WQE, CQE, pack, unpack
from sim import docgen


def test_formats_doc_is_current():
    text = docgen.DOC.read_text()
    assert docgen.render(text) == text, "docs/formats.md is out of date: run python -m sim.docgen"


def test_every_wqe_field_is_documented():
    text = docgen.DOC.read_text()
    for layout in (WQE, CQE):
        for name, _ in layout:
            assert f"`{name}`" in text


def test_pack_unpack_roundtrip():
    raw = pack(WQE, opcode=4, wr_id=0x1122334455667788, remote_addr=0xABCDEF, rkey=0x305)
    assert len(raw) == 64
    assert raw[8:16] == bytes.fromhex("8877665544332211")
    fields = unpack(WQE, raw)
    assert fields["opcode"] == 4 and fields["rkey"] == 0x305 and fields["remote_addr"] == 0xABCDEF
