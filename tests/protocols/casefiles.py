"""Loader for the data-driven protocol cases under `cases/<protocol>/{valid,invalid}/NNN.txt`.

A case file is gunicorn's raw-request-plus-expected-parse idea in one file:

    # title
    in: <bytes, Python escapes: \\r \\n \\xNN \\\\>     (several `in:` lines are concatenated)
    out: <Python expression for one expected command>   (in order; none = nothing yet)

`out:` expressions are evaluated with the protocol module's names plus `Err(keyword,
close)`, which matches any ProtocolError whose reply is that keyword, optionally followed by
` <reason>`, ending the line; the reason text itself is free (deviation 1).  The thrift cases
(binary frames written by the `thrift` package, see cases/thrift/generate.py) use their own
matchers, `Stop()` and `Bad(method, seqid, type)` (test_cases.py).
"""
from __future__ import annotations

import codecs
import random
from dataclasses import dataclass
from pathlib import Path

CASES = Path(__file__).parent / "cases"


@dataclass
class Case:
    path: Path
    title: str
    data: bytes
    expected: list


class Err:
    """Matches a ProtocolError by keyword and close flag, not by reason text."""

    def __init__(self, keyword: bytes, close: bool) -> None:
        self.keyword = keyword
        self.close = close

    def __eq__(self, other) -> bool:
        reply = getattr(other, "reply", None)
        if type(other).__name__ != "ProtocolError" or other.close != self.close:
            return False
        eol = b"\r\n" if self.keyword != b"-" else b"\n"
        if not reply.endswith(eol) or b"\n" in reply[:-1]:
            return False
        body = reply[:-len(eol)]
        if self.keyword == b"-":
            return body.startswith(b"-") and len(body) > 1
        return body == self.keyword or body.startswith(self.keyword + b" ")

    def __repr__(self) -> str:
        return f"Err({self.keyword!r}, close={self.close})"


def load(protocol: str, kind: str, namespace: dict) -> list[Case]:
    cases = []
    for path in sorted((CASES / protocol / kind).glob("*.txt")):
        title, data, outs = "", b"", []
        for line in path.read_text(encoding="latin-1").splitlines():
            if line.startswith("# "):
                title = line[2:]
            elif line.startswith("in: "):
                data += codecs.escape_decode(line[4:].encode("latin-1"))[0]
            elif line.startswith("out: "):
                outs.append(eval(line[5:], {**namespace, "Err": Err}))  # test data, written by us
            elif line.strip():
                raise ValueError(f"{path}: unrecognised line {line!r}")
        if not data:
            raise ValueError(f"{path}: no input")
        cases.append(Case(path, title, data, outs))
    return cases


def case_id(case: Case) -> str:
    return f"{case.path.parent.name}/{case.path.name}"


def chunkings(data: bytes, seed: int):
    """(name, list of chunks): all at once, byte by byte, and seeded random splits."""
    yield "whole", [data]
    yield "bytewise", [data[i:i + 1] for i in range(len(data))]
    rnd = random.Random(seed)
    for k in range(3):
        chunks, i = [], 0
        while i < len(data):
            n = rnd.randint(1, 7)
            chunks.append(data[i:i + n])
            i += n
        yield f"random{k}", chunks


def run(parser, chunks, eager: bool) -> list:
    """Feed chunks; with `eager`, drain commands after every chunk (as a front does)."""
    out = []
    for c in chunks:
        parser.feed(c)
        if eager:
            out.extend(parser.commands())
    out.extend(parser.commands())
    return out
