"""Secret and PII redaction with typed placeholders.

Detectors (after bigcode-dataset ``pii/``; regexes instead of the StarPII NER model, which needs a GPU and a
hub download):

- ``<EMAIL>``: addresses with a dotted domain; ``example.com``/``.org``/``.net`` and ``*.invalid``/
  ``*.test``/``*.local`` domains are kept, as are ``@``-decorators and ``user@host`` without a dot.
- ``<IP_ADDRESS>``: IPv4/IPv6 that ``ipaddress`` accepts and that are global; private, loopback,
  link-local, documentation ranges and the well-known public DNS resolvers are kept (as BigCode does). A
  dotted quad counts only near an address word (host, server, ip, url, ...; BigCode asks for dns/server)
  and not after version/section/rfc, so version and section numbers stay. IPv6 needs three groups.
- ``<AWS_ACCESS_KEY_ID>``, ``<PRIVATE_KEY>`` (PEM blocks), ``<GITHUB_TOKEN>``, ``<SLACK_TOKEN>``,
  ``<SLACK_WEBHOOK>``: by their fixed formats.
- ``<SECRET>``: a quoted value assigned to a secret-looking name (password, secret, token, api_key, ...)
  that is long enough, has high Shannon entropy and does not look like a placeholder or a template.

The batch is pre-filtered with one vectorised Polars ``str.contains`` per detector, so only candidate files
pay for the Python-side validation, and only the detectors whose pre-filter fired run on them. The two address
pre-filters, the costliest regexes, run only on the rows where a compiled scan of the bytes finds what they
need (a dotted quad of ASCII digits, three colons among hex digits). The IPv6
pre-filter asks for what a redacted address needs (three groups and a ``::``, or eight groups); e-mail
addresses, which cannot span lines, are looked for only on the lines that hold an ``@``; the IPv4 pattern
starts with its digit (the same matches as the plain form with the lookbehind first, a test holds them
equal), which lets Python's regex engine skip ahead to digits instead of trying every position.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections import Counter
from collections.abc import Callable, Iterator

import numpy as np
import polars as pl

from codemill.data.config import RedactionConfig
from codemill.data.kernels import Kernel, utf8_buffer
from codemill.data.steps import ChunkContext, Step

PLACEHOLDERS = ("EMAIL", "IP_ADDRESS", "AWS_ACCESS_KEY_ID", "PRIVATE_KEY", "GITHUB_TOKEN", "SLACK_TOKEN",
                "SLACK_WEBHOOK", "SECRET")

EMAIL = re.compile(r"(?<![\w.+-])[A-Za-z0-9][A-Za-z0-9._%+-]{0,63}@(?:[A-Za-z0-9-]{1,63}\.)+[A-Za-z]{2,24}\b")
# ``(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?![\w.]|\.\d)`` with the lookbehind moved behind the first digit:
IPV4 = re.compile(r"\d(?<![\w.]\d)\d{0,2}\.(?:\d{1,3}\.){2}\d{1,3}(?![\w.]|\.\d)")
IPV6 = re.compile(r"(?<![\w:.])(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?![\w:.])")
AWS_KEY = re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}\b")
PRIVATE_KEY = re.compile(r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----[\s\S]*?"
                         r"-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----")
GITHUB_TOKEN = re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255})\b")
SLACK_TOKEN = re.compile(r"\bxox[abposr]-(?:[A-Za-z0-9]{1,40}-){1,5}[A-Za-z0-9]{1,64}\b")
SLACK_WEBHOOK = re.compile(r"https://hooks\.slack\.com/services/T[A-Za-z0-9_]+/B[A-Za-z0-9_]+/[A-Za-z0-9_]+")
_SECRET_NAMES = (r"(?:passw(?:or)?d|passwd|secret|token|api[_-]?key|apikey|access[_-]?key|private[_-]?key"
                 r"|auth[_-]?key|client[_-]?secret|credentials?)(?:[_-]?(?:key|value|str|string|id))?")
SECRET_ASSIGN = re.compile(
    r"(?i)" + _SECRET_NAMES + r"""['"]?\s*(?::=|=>|=(?!=)|:)\s*[rbuf]?(['"])(?P<value>[^'"\s]{8,256})\1""")
ADDRESS_CONTEXT = re.compile(r"(?i)(?<![a-z])(?:ip|ips|ipv4|ipv6|host|hosts|hostname|addr|address|server|dns|"
                             r"nameserver|connect|url|uri|https?|proxy|bind|socket|inet|endpoint|remote|gateway|peer)(?![a-z])")

# Cheap, over-inclusive prefilters run by Polars (Rust regex) over the whole batch.
PREFILTERS = {
    "EMAIL": r"[A-Za-z0-9][A-Za-z0-9._%+-]{0,63}@(?:[A-Za-z0-9-]{1,63}\.)+[A-Za-z]{2,24}",
    "IPV4": r"\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}",
    # a redacted IPv6 address has >= 3 groups and parses: so it holds "::" next to 3 groups, or 8 groups
    "IPV6": r"{h}:{h}::{h}|{h}::{h}:{h}|::{h}:{h}:{h}|{h}:{h}:{h}::|{h}(?::{h}){{7}}".format(h="[0-9A-Fa-f]{1,4}"),
    "TOKENS": r"(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}|PRIVATE KEY(?: BLOCK)?-----"
              r"|gh[pousr]_[A-Za-z0-9]{36}|github_pat_|xox[abposr]-|hooks\.slack\.com/services/",
    "SECRET": r"(?i)" + _SECRET_NAMES + r"""['"]?\s*(?::=|=>|=|:)\s*[rbuf]?['"][^'"\s]{8,256}['"]""",
}
KEEP_EMAIL_DOMAINS = ("example.com", "example.org", "example.net")
KEEP_EMAIL_TLDS = (".invalid", ".test", ".local", ".localhost", ".example")
PUBLIC_DNS = frozenset({"8.8.8.8", "8.8.4.4", "1.1.1.1", "1.0.0.1", "9.9.9.9", "149.112.112.112",
                        "208.67.222.222", "208.67.220.220", "4.2.2.2", "64.6.64.6", "64.6.65.6",
                        "76.76.2.0", "76.76.10.0", "94.140.14.14", "2001:4860:4860::8888",
                        "2001:4860:4860::8844", "2606:4700:4700::1111", "2606:4700:4700::1001"})
PLACEHOLDER_WORDS = ("xxxx", "****", "your", "example", "changeme", "dummy", "sample", "placeholder", "redacted",
                     "${", "{{", "%(", "%s", "<", ">", "...")


def shannon_entropy(s: str) -> float:
    counts = Counter(s)
    n = len(s)
    return -sum(c / n * math.log2(c / n) for c in counts.values())


def _keep_email(m: re.Match[str]) -> bool:
    domain = m.group(0).rsplit("@", 1)[1].lower()
    return domain in KEEP_EMAIL_DOMAINS or domain.endswith(KEEP_EMAIL_TLDS)


def _keep_ipv4(m: re.Match[str]) -> bool:
    text, start = m.string, m.start()
    before = text[max(0, start - 24):start].lower()
    if re.search(r"(?:\b|_)(version|ver|v|release|section|sections|rfc|spec)\w*[\s=:(\"'#-]*$", before):
        return True
    around = text[max(0, start - 100):m.end() + 100]
    return not ADDRESS_CONTEXT.search(around) or not _is_public_ip(m.group(0))


def _is_public_ip(value: str) -> bool:
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        return False
    return ip.is_global and not ip.is_multicast and value not in PUBLIC_DNS


def _keep_ipv6(m: re.Match[str]) -> bool:
    v = m.group(0)
    groups = [g for g in v.split(":") if g]
    return len(groups) < 3 or not _is_public_ip(v)


def _looks_like_secret(value: str, cfg: RedactionConfig) -> bool:
    low = value.lower()
    if len(value) < cfg.min_secret_length or any(w in low for w in PLACEHOLDER_WORDS):
        return False
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", value) and not re.search(r"\d", value):
        return False  # an identifier or dotted name (os.environ key, setting name), not a value
    if re.fullmatch(r"[a-z]+(?:[-_ ][a-z]+)+", value):
        return False  # words joined by dashes: a token *type* or a label
    return shannon_entropy(value) >= cfg.min_entropy


Keep = Callable[[re.Match[str]], bool]

# Besides an ASCII letter's two cases, Python's (?i) matches it to these only: İ and ı (i), K (Kelvin, k),
# ſ (long s); İ is also the one character whose lower() is longer. A text holding none of them can match a
# secret name only where its lower-cased form holds the name's start literally (a test checks both facts).
CASE_FOLDS = "\u0130\u0131\u212a\u017f"
SECRET_NAME_STARTS = ("passw", "secret", "token", "api", "access", "private", "auth", "client", "credential")


def secret_matches(text: str) -> Iterator[re.Match[str]]:
    """The matches ``SECRET_ASSIGN.sub`` visits, in order, tried only where a name starts: the (?i) name
    alternation tried at every position costs ~100 ns a character in Python's engine; ``str.find`` does not."""
    if any(ch in text for ch in CASE_FOLDS):
        yield from SECRET_ASSIGN.finditer(text)
        return
    low = text.lower()
    starts = set()
    for name in SECRET_NAME_STARTS:
        i = low.find(name)
        while i != -1:
            starts.add(i)
            i = low.find(name, i + 1)
    end = 0
    for pos in sorted(starts):
        if pos >= end and (m := SECRET_ASSIGN.match(text, pos)):
            yield m
            end = m.end()


def _sub(text: str, pattern: re.Pattern[str], label: str, counts: Counter[str], keep: Keep | None = None,
         line_trigger: str | None = None) -> str:
    """``pattern.sub`` with placeholders. With ``line_trigger``: only on the lines that hold it, for a pattern
    whose every match holds it, lies within one line, and whose lookarounds see a line's end and the text's end
    alike (``keep`` may then only read the match itself)."""
    def repl(m: re.Match[str]) -> str:
        if keep is not None and keep(m):
            return m.group(0)
        counts[label] += 1
        return f"<{label}>"
    if line_trigger is None:
        return pattern.sub(repl, text)
    parts, last = [], 0
    pos = text.find(line_trigger)
    while pos != -1:
        start = text.rfind("\n", 0, pos) + 1
        end = text.find("\n", pos)
        end = len(text) if end == -1 else end
        parts += [text[last:start], pattern.sub(repl, text[start:end])]
        last = end
        pos = text.find(line_trigger, end)
    parts.append(text[last:])
    return "".join(parts)


def redact_text(text: str, cfg: RedactionConfig, candidates: frozenset[str] = frozenset(PREFILTERS)
                ) -> tuple[str, Counter[str]]:
    """The text with each finding replaced by ``<TYPE>``, and the count per type."""
    counts: Counter[str] = Counter()
    if cfg.secrets and "TOKENS" in candidates:
        text = _sub(text, PRIVATE_KEY, "PRIVATE_KEY", counts)
        text = _sub(text, AWS_KEY, "AWS_ACCESS_KEY_ID", counts)
        text = _sub(text, GITHUB_TOKEN, "GITHUB_TOKEN", counts)
        text = _sub(text, SLACK_WEBHOOK, "SLACK_WEBHOOK", counts)
        text = _sub(text, SLACK_TOKEN, "SLACK_TOKEN", counts)
    if cfg.secrets and "SECRET" in candidates:
        parts, last = [], 0
        for m in secret_matches(text):
            if _looks_like_secret(m.group("value"), cfg):
                counts["SECRET"] += 1
                s, e = m.span("value")
                parts += [text[last:s], "<SECRET>"]
                last = e
        if parts:
            text = "".join(parts) + text[last:]
    if cfg.emails and "EMAIL" in candidates:
        text = _sub(text, EMAIL, "EMAIL", counts, _keep_email, line_trigger="@")
    if cfg.ip_addresses and "IPV4" in candidates:
        text = _sub(text, IPV4, "IP_ADDRESS", counts, _keep_ipv4)
    if cfg.ip_addresses and "IPV6" in candidates:
        text = _sub(text, IPV6, "IP_ADDRESS", counts, _keep_ipv6)
    return text, counts


def prefilter_flags(content: pl.Series) -> np.ndarray:
    """(rows, len(PREFILTERS)) bool: which detectors' pre-filters match each row. The address pre-filters, the
    costliest regexes, run only on the rows ``_address_candidates`` lets through."""
    n = len(content)
    maybe = dict(zip(("IPV4", "IPV6"), _address_candidates(content), strict=True))
    flags = np.zeros((n, len(PREFILTERS)), dtype=np.bool_)
    for j, (name, pattern) in enumerate(PREFILTERS.items()):
        rows = np.flatnonzero(maybe[name]) if name in maybe else slice(None)
        subset = content if isinstance(rows, slice) else content.gather(rows)
        flags[rows, j] = subset.str.contains(pattern).fill_null(False).to_numpy()
    return flags


_DIGIT = np.zeros(256, dtype=np.bool_)
_DIGIT[ord("0"):ord("9") + 1] = True
_HEX = _DIGIT.copy()
_HEX[[ord(ch) for ch in "abcdefABCDEF"]] = True


def _address_candidates(content: pl.Series) -> tuple[np.ndarray, np.ndarray]:
    """Per row, whether an IPv4 and an IPv6 address the detectors would redact can be in it (two regex passes
    over every text cost more than the rest of the redaction). IPv4: ASCII digits, a dot, 1 to 3 digits, a
    dot, 1 to 3 digits, a dot, a digit (``ipaddress`` rejects other digits, so a text that only Unicode's \\d
    matches is never redacted). IPv6: three colons with at most 4 hex digits between each (every alternative
    of the IPv6 pre-filter holds that)."""
    data, off = utf8_buffer(content)
    ipv4, ipv6 = np.empty(len(off) - 1, np.bool_), np.empty(len(off) - 1, np.bool_)
    _addresses(data, off, _DIGIT, _HEX, ipv4, ipv6)
    return ipv4, ipv6


@Kernel
def _addresses(data: np.ndarray, off: np.ndarray, digit: np.ndarray, hexd: np.ndarray, ipv4: np.ndarray,
               ipv6: np.ndarray) -> None:  # pragma: no cover - compiled; tests hold it to the regexes
    """At each dot after a digit and at each colon (a few % of the bytes), the pattern is checked forward."""
    for d in range(len(off) - 1):
        lo, hi = off[d], off[d + 1]
        v4, v6 = False, False
        for i in range(lo, hi):
            c = data[i]
            if c == 46 and not v4 and i > lo and digit[data[i - 1]]:
                j, dots = i + 1, 1
                while dots < 4:
                    k = j
                    while k < hi and k - j < 3 and digit[data[k]]:
                        k += 1
                    if k == j:
                        break
                    if dots == 3:
                        v4 = True
                        break
                    if k == hi or data[k] != 46:
                        break
                    j, dots = k + 1, dots + 1
            elif c == 58 and not v6:
                j, colons = i + 1, 1
                while colons < 3:
                    k = j
                    while k < hi and k - j < 4 and hexd[data[k]]:
                        k += 1
                    if k == hi or data[k] != 58:
                        break
                    j, colons = k + 1, colons + 1
                v6 = colons == 3
        ipv4[d], ipv6[d] = v4, v6


def redact_column(content: pl.Series, cfg: RedactionConfig) -> tuple[pl.Series, list[dict[str, int]]]:
    """Redacted contents and per-row counts by type; rows no prefilter matches are passed through as is (and
    never leave Polars: only flagged rows become Python strings, and only changed ones go back)."""
    n = len(content)
    if not cfg.enabled or n == 0:
        return content, [{} for _ in range(n)]
    names = list(PREFILTERS)
    flag_rows = prefilter_flags(content)
    rows = np.flatnonzero(flag_rows.any(axis=1))
    per_row: list[dict[str, int]] = [{} for _ in range(n)]
    changed, values = [], []
    for i, text in zip(rows.tolist(), content.gather(rows).to_list(), strict=True):
        cands = frozenset(names[j] for j in flag_rows[i].nonzero()[0])
        red, counts = redact_text(text, cfg, cands)
        if counts:
            changed.append(i)
            values.append(red)
            per_row[i] = dict(counts)
    out = content.clone()
    if changed:
        out.scatter(changed, pl.Series(values, dtype=pl.String))
    return out, per_row


def _redaction_step(live: pl.DataFrame, ctx: ChunkContext) -> pl.DataFrame:
    """Redacted content and a ``redact_<TYPE>`` count column per placeholder; rejects nothing."""
    content, per_row = redact_column(live["content"], ctx.proc.cfg.redaction)
    counts = {f"redact_{p}": pl.Series([r.get(p, 0) for r in per_row], dtype=pl.Int32) for p in PLACEHOLDERS}
    return live.with_columns(content.alias("content"), **counts)


REDACTION = Step("redaction", (), _redaction_step)
