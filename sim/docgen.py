"""Generate the byte-by-byte tables of docs/formats.md from the layouts in hw/formats.py,
and its MMIO register map from ``hw.regmap.register_map``.

``python -m sim.docgen`` rewrites the generated parts of docs/formats.md (between the
``<!-- generated... -->`` markers); a test checks that the file is current, so the document
cannot drift from the RTL's layouts and windows.
"""

import pathlib
import sys

from amaranth.hdl import Shape

from hw import formats, regmap

DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "formats.md"
BEGIN, END = "<!-- generated: begin -->", "<!-- generated: end -->"
MAP_BEGIN, MAP_END = "<!-- generated register map: begin -->", "<!-- generated register map: end -->"
#: the register map is shown for the doorbell count of the connectx6 preset (16)
MAP_DOORBELLS = 16

TABLES = [
    ("Send WQE (64 bytes, host send queue)", formats.WQE),
    ("Receive WQE (32 bytes, host receive queue)", formats.RECV_WQE),
    ("CQE (32 bytes, host completion queue)", formats.CQE),
    ("Doorbell word (64-bit MMIO write)", formats.DOORBELL),
    ("Memory-region entry (command SET_MR arguments)", formats.MR_ENTRY),
    ("QP context (command SET_QP arguments)", regmap.QP_CTX),
    ("CQ context (command SET_CQ arguments)", regmap.CQ_CTX),
    ("Down TLP header (NIC to host: MRd, MWr; the model's header, not PCIe's wire format: "
     "docs/host-interface.md)", formats.TLP_DOWN_HDR),
    ("Up TLP header (host to NIC: completions, write responses; the model's header)",
     formats.TLP_UP_HDR),
    ("Write response beside an up completion beat (each up beat's ``wrsp`` field; valid only "
     "on a completion's beats)", formats.WRSP_SIDE),
]


def _span(offset, width):
    if width % 8 == 0 and offset % 8 == 0:
        first, last = offset // 8, (offset + width) // 8 - 1
        return f"{first}" if first == last else f"{first}-{last}"
    bo, bi = divmod(offset, 8)
    eo, ei = divmod(offset + width - 1, 8)
    return f"{bo}.{bi}" if (bo, bi) == (eo, ei) else f"{bo}.{bi} - {eo}.{ei}"


def table(title, layout):
    lines = [f"### {title}", "", "| bytes (byte.bit) | bits | field |", "| --- | --- | --- |"]
    for name, f in layout:
        lines.append(f"| {_span(f.offset, Shape.cast(f.shape).width)} | {Shape.cast(f.shape).width} | `{name}` |")
    lines.append("")
    return "\n".join(lines)


def generated():
    parts = ["Multi-byte fields are little-endian in host memory; `byte.bit` marks fields that "
             "do not start or end on a byte boundary.", ""]
    parts += [table(t, l) for t, l in TABLES]
    return "\n".join(parts)


def register_map_table():
    return (f"With `n_doorbells` = {MAP_DOORBELLS} (the `doorbells` and `blueflame` windows "
            f"grow with it: 8 and 64 bytes per register):\n\n"
            + regmap.register_map(MAP_DOORBELLS).table())


def _replace(text, begin, end, body):
    head, _, rest = text.partition(begin)
    _, _, tail = rest.partition(end)
    return f"{head}{begin}\n{body}\n{end}{tail}"


def render(text):
    text = _replace(text, BEGIN, END, generated())
    return _replace(text, MAP_BEGIN, MAP_END, register_map_table())


def main():
    text = DOC.read_text()
    new = render(text)
    if "--check" in sys.argv:
        if new != text:
            print("docs/formats.md is out of date: run python -m sim.docgen")
            return 1
        return 0
    DOC.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
