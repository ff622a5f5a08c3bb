"""pcap link-layer header types (tcpdump.org/linktypes.html) the collector decodes."""

from __future__ import annotations

DLT_NULL = 0
DLT_EN10MB = 1
DLT_RAW = 101
DLT_LOOP = 108
DLT_LINUX_SLL = 113
DLT_IPV4 = 228
DLT_IPV6 = 229
DLT_LINUX_SLL2 = 276
# Raw IP has two more numbers in old files (12 on most systems, 14 on OpenBSD).
RAW_ALIASES = frozenset({12, 14, DLT_RAW})

SUPPORTED_LINKTYPES = frozenset(
    {
        DLT_NULL,
        DLT_EN10MB,
        DLT_LOOP,
        DLT_LINUX_SLL,
        DLT_IPV4,
        DLT_IPV6,
        DLT_LINUX_SLL2,
        *RAW_ALIASES,
    }
)
