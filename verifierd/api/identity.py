"""Who is calling: the client certificate's subject, and whether it holds the admin role.

gRPC reports the verified peer certificate in the call's auth context
(``x509_subject`` in RFC 4514 form, e.g. ``CN=ops-admin,O=veritap``, and
``x509_common_name``). The admin role is bound to certificate subjects listed in
verifierd's configuration: an entry containing ``=`` must equal the whole subject,
any other entry must equal the common name. A caller without a client certificate
(plaintext on loopback, or TLS without a client CA) is never admin.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Principal:
    #: RFC 4514 subject of the verified client certificate ("" without one).
    subject: str
    common_name: str

    @property
    def name(self) -> str:
        """How the audit log names this caller."""
        return self.subject or (f"CN={self.common_name}" if self.common_name else "anonymous")


ANONYMOUS = Principal("", "")


def _first(auth: Mapping[str, Iterable[bytes]], key: str) -> str:
    return next(iter(auth.get(key) or ()), b"").decode("utf-8", "replace")


def principal_of(auth_context: Mapping[str, Iterable[bytes]]) -> Principal:
    """The caller named by a gRPC auth context (ANONYMOUS without a verified certificate)."""
    if _first(auth_context, "transport_security_type") != "ssl":
        return ANONYMOUS
    return Principal(
        subject=_first(auth_context, "x509_subject"),
        common_name=_first(auth_context, "x509_common_name"),
    )


@dataclass(frozen=True)
class AdminPolicy:
    """The certificate subjects (or common names) that hold the admin role."""

    subjects: frozenset[str]

    @classmethod
    def of(cls, entries: Iterable[str]) -> AdminPolicy:
        return cls(frozenset(e.strip() for e in entries if e.strip()))

    def allows(self, principal: Principal) -> bool:
        if principal == ANONYMOUS:
            return False
        for entry in self.subjects:
            if "=" in entry:
                if principal.subject and principal.subject == entry:
                    return True
            elif principal.common_name and principal.common_name == entry:
                return True
        return False
