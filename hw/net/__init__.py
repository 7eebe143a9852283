"""The network side of a node: RoCEv2 framing (packetizer, depacketizer, ICRC), the link
and the fault injectors on it."""
