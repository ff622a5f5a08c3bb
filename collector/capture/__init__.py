"""Capture sources (pcap/pcapng files, live AF_PACKET) and the frame decoder."""
