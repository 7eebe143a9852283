"""cocotb test benches (run through tests/test_*_cocotb.py) and their small RTL test designs."""
