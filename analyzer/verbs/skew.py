"""Clock-offset assumptions given on the command line (``--assume-offset DOMAIN=MS``).

The skew rules and offset bounds themselves are SQL (``queries/skew_rules.sql``,
``queries/skew_offsets.sql``); this module only parses the one correction a user may ask
for and words the note every output that used it must carry. ``DOMAIN=MS`` says DOMAIN's
clock runs MS milliseconds ahead of the client (reference) clock, so DOMAIN's timestamps are
shifted by -MS before any cross-domain figure. DOMAIN is a full clock domain
(``service.name|service.instance.id|host.name``) or a service name.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from analyzer.errors import OffsetSyntaxError

__all__ = ["AssumedOffsets", "parse_assume_offsets"]

_DOMAIN_RE = re.compile(r"^[^=\s][^=]*$")


@dataclass(frozen=True)
class AssumedOffsets:
    """Domains and their assumed offsets (ms ahead of the client clock), in the order given."""

    domains: tuple[str, ...] = ()
    offsets_ms: tuple[float, ...] = ()

    def params(self) -> dict[str, list | None]:
        """The ``$offset_domains`` / ``$offset_ms`` parameters of phases.sql and skew_offsets.sql."""
        if not self.domains:
            return {"offset_domains": None, "offset_ms": None}
        return {"offset_domains": list(self.domains), "offset_ms": list(self.offsets_ms)}

    def notes(self) -> list[str]:
        """One line per assumption, for every output that used it."""
        return [
            f"assumed offset: clock of {d!r} runs {ms:g} ms ahead of the client clock; its timestamps are "
            f"shifted by {-ms:g} ms in cross-domain figures (spans themselves are not edited)"
            for d, ms in zip(self.domains, self.offsets_ms)
        ]


def parse_assume_offsets(values: Sequence[str]) -> AssumedOffsets:
    """``["server=12.5", ...]`` -> :class:`AssumedOffsets`; OffsetSyntaxError on a bad value or a repeated domain."""
    domains: list[str] = []
    offsets: list[float] = []
    for raw in values:
        domain, sep, ms_text = raw.rpartition("=")
        domain = domain.strip()
        if not sep or not domain or not _DOMAIN_RE.match(domain):
            raise OffsetSyntaxError(f"--assume-offset {raw!r}: expected DOMAIN=MS, e.g. server=-35")
        try:
            ms = float(ms_text)
        except ValueError:
            raise OffsetSyntaxError(f"--assume-offset {raw!r}: {ms_text!r} is not a number of milliseconds") from None
        if not math.isfinite(ms):
            raise OffsetSyntaxError(f"--assume-offset {raw!r}: the offset must be a finite number of milliseconds")
        if domain in domains:
            raise OffsetSyntaxError(f"--assume-offset: domain {domain!r} given twice")
        domains.append(domain)
        offsets.append(ms)
    return AssumedOffsets(tuple(domains), tuple(offsets))
