"""`lanner cmdlog check DIR` and `lanner cmdlog dump DIR [--json]`: look inside a
workq command-log directory (a Lanner partition directory or workq's own
`-cmdlog-path`) without starting anything.  Read-only: no lock is taken and
nothing is repaired, so a torn tail that `lanner serve` would truncate is
reported here as a problem.

check  exit 0 and one summary line for a valid log; otherwise exit 1 and ONE
       line on stderr naming the file and byte offset of the first problem
       (framing, CRC, header, payload decoding, or a replay that workq's rules
       refuse, such as a duplicate live job; `--now` fixes the replay clock).
dump   one line per record; with --json one JSON object per line whose keys
       follow the fixtures' expected decode (index, segment, offset, length,
       time_hex, time_unix_sec, time_nsec, time_offset_min, time_rfc3339, size,
       payload_hex, crc_hex, command{cmd, id, ...}); byte strings appear as
       {"hex", "text" (ISO-8859-1), "base64"}.  A record Lanner wrote for an
       item that never expires also carries "lanner_no_expiry": true.
       A problem stops the dump: exit 1 with the one-line error on stderr.

A directory with no segment at all is not a log: both exit 1 saying so, and
point at the partition directories when DIR is a queue path or its `cmdlog/`.

Progress goes to stderr (tqdm) when stderr is a terminal.
"""
from __future__ import annotations

import argparse
import base64
import datetime as dt
import json
import os
import sys
from typing import Iterator

from tqdm import tqdm

from lanner.clock import SystemClock
from lanner.server.dirlock import refuse_live
from lanner.storage.cmdlog.replay import Replayer, job_uuid
from lanner.storage.cmdlog.segment import (COMMAND_NAMES, NS, ZERO_TIME_NS, CmdlogError, JobCommand, ResultCommand,
                      list_segments, never_expires, segment_records, time_fields)

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
ZERO_TEXT = "ZERO (0001-01-01T00:00:00Z, Go time.Time{})"


def format_time(ns: int) -> str:
    """RFC 3339 in UTC with all nine fractional digits (Go's zero time spelt out)."""
    if ns == ZERO_TIME_NS:
        return ZERO_TEXT
    return _rfc3339(*divmod(ns, NS))


def _rfc3339(sec: int, nsec: int) -> str:
    try:
        t = _EPOCH + dt.timedelta(seconds=sec)
    except OverflowError:
        return f"unix:{sec}.{nsec:09d}"
    return (f"{t.year:04d}-{t.month:02d}-{t.day:02d}T{t.hour:02d}:{t.minute:02d}:{t.second:02d}"
            f".{nsec:09d}Z")


def _blob(data: bytes) -> dict:
    return {"hex": data.hex(), "text": data.decode("latin-1"),
            "base64": base64.b64encode(data).decode("ascii")}


def command_json(cmd) -> dict:
    out: dict = {"cmd": COMMAND_NAMES[cmd.type], "id": job_uuid(cmd.id)}
    if isinstance(cmd, JobCommand):
        out.update(name=cmd.name.decode("utf-8", "surrogateescape"), ttr_ms=cmd.ttr, ttl_ms=cmd.ttl,
                   priority=cmd.priority, max_attempts=cmd.max_attempts, max_fails=cmd.max_fails,
                   payload=_blob(cmd.payload), time=format_time(cmd.time_ns),
                   created=format_time(cmd.created_ns))
        if never_expires(cmd):
            out["lanner_no_expiry"] = True
    elif isinstance(cmd, ResultCommand):
        out["result"] = _blob(cmd.result)
    return out


def iter_records(directory: str, progress=None) -> Iterator[tuple[str, int, object, int, int, int, object]]:
    """(segment name, offset, buf, payload_start, payload_end, record_end, command)
    for every record in log order; CmdlogError at the first problem."""
    for _seq, name in list_segments(directory):
        path = os.path.join(directory, name)
        for buf, off, ps, pe, end, cmd in segment_records(path):
            yield name, off, buf, ps, pe, end, cmd
        if progress is not None:
            progress(os.path.getsize(path))


def record_json(index: int, name: str, off: int, buf, ps: int, pe: int, end: int, cmd) -> dict:
    raw_time = bytes(buf[off:off + 15])
    sec, nsec, offset = time_fields(raw_time)
    return {"index": index, "segment": name, "offset": off, "length": end - off,
            "time_hex": raw_time.hex(), "time_unix_sec": sec, "time_nsec": nsec,
            "time_offset_min": offset, "time_rfc3339": _rfc3339(sec, nsec), "size": pe - ps,
            "payload_hex": bytes(buf[ps:pe]).hex(), "crc_hex": bytes(buf[pe:end]).hex(),
            "command": command_json(cmd)}


def record_text(name: str, off: int, buf, cmd) -> str:
    sec, nsec, _ = time_fields(bytes(buf[off:off + 15]))
    parts = [f"{name}@{off}", _rfc3339(sec, nsec), COMMAND_NAMES[cmd.type], job_uuid(cmd.id)]
    if isinstance(cmd, JobCommand):
        parts += [f"name={cmd.name.decode('utf-8', 'surrogateescape')}", f"ttr={cmd.ttr}", f"ttl={cmd.ttl}",
                  f"priority={cmd.priority}", f"max_attempts={cmd.max_attempts}",
                  f"max_fails={cmd.max_fails}",
                  f"time={'ZERO' if cmd.time_ns == ZERO_TIME_NS else format_time(cmd.time_ns)}",
                  f"created={format_time(cmd.created_ns)}", f"payload={_short(cmd.payload)}"]
        if never_expires(cmd):
            parts.append("(lanner: no expiry)")
    elif isinstance(cmd, ResultCommand):
        parts.append(f"result={_short(cmd.result)}")
    return " ".join(parts)


def _short(data: bytes, limit: int = 48) -> str:
    shown = repr(data[:limit])
    return f"{len(data)}:{shown}{'...' if len(data) > limit else ''}"


def _progress(directory: str):
    """A tqdm byte counter on stderr when it is a terminal, else None."""
    if not sys.stderr.isatty():
        return None, None
    total = sum(os.path.getsize(os.path.join(directory, n)) for _s, n in list_segments(directory))
    bar = tqdm(total=total, unit="B", unit_scale=True, file=sys.stderr, leave=False)
    return bar, bar.update


def _check(directory: str, now_ns: int, out) -> int:
    bar, progress = _progress(directory)
    replayer = Replayer(now_ns)
    records = 0
    try:
        for name, off, _buf, _ps, _pe, _end, cmd in iter_records(directory, progress):
            replayer.apply(cmd, os.path.join(directory, name), off)
            records += 1
    finally:
        if bar is not None:
            bar.close()
    segs = list_segments(directory)
    size = sum(os.path.getsize(os.path.join(directory, n)) for _s, n in segs)
    print(f"ok: {directory}: {len(segs)} segments, {records} records, {size} bytes, "
          f"{len(replayer.jobs)} live jobs", file=out)
    return 0


def _dump(directory: str, as_json: bool, out) -> int:
    bar, progress = _progress(directory)
    try:
        for index, (name, off, buf, ps, pe, end, cmd) in enumerate(iter_records(directory, progress), 1):
            if as_json:
                out.write(json.dumps(record_json(index, name, off, buf, ps, pe, end, cmd)) + "\n")
            else:
                out.write(record_text(name, off, buf, cmd) + "\n")
    finally:
        if bar is not None:
            bar.close()
    return 0


def _partitions_hint(directory: str) -> str:
    """Where the segments are, if `directory` is a queue path or a `cmdlog/` directory."""
    root = os.path.join(directory, "cmdlog")
    if not os.path.isdir(root):
        root = directory
    parts = sorted((int(n) for n in os.listdir(root) if n.isdigit() and os.path.isdir(os.path.join(root, n))))
    parts = [p for p in parts if list_segments(os.path.join(root, str(p)))]
    if not parts:
        return ""
    return (f"; the logs are one per partition: {', '.join(os.path.join(root, str(p)) for p in parts[:3])}"
            + (f" and {len(parts) - 3} more" if len(parts) > 3 else ""))


def _parse_now(text: str) -> int:
    t = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.timezone.utc)
    delta = t - _EPOCH
    return (delta.days * 86400 + delta.seconds) * NS + delta.microseconds * 1000


def cmdlog_main(argv: list[str], out=None, err=None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    parser = argparse.ArgumentParser(prog="lanner cmdlog", description="inspect a workq command-log directory")
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("check", help="verify every segment; one line naming file and offset on failure")
    p.add_argument("dir")
    p.add_argument("--now", help="replay clock for the check, RFC 3339 (default: the system clock)")
    p.add_argument("--ignore-lock", action="store_true", help="read a directory a running server holds")
    p = sub.add_parser("dump", help="print every record")
    p.add_argument("dir")
    p.add_argument("--json", action="store_true", help="one JSON object per record")
    p.add_argument("--ignore-lock", action="store_true", help="read a directory a running server holds")
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    if not os.path.isdir(args.dir):
        print(f"{args.dir}: not a directory", file=err)
        return 2
    refusal = refuse_live([args.dir], args.ignore_lock)
    if refusal:
        print(f"lanner cmdlog: {refusal}", file=err)
        return 1
    try:
        now_ns = _parse_now(args.now) if getattr(args, "now", None) else SystemClock().now_ms() * 1_000_000
    except ValueError as e:
        print(f"--now {args.now}: {e}", file=err)
        return 2
    try:
        if not list_segments(args.dir):
            print(f"{args.dir}: no command-log segments (NNNNNNNNN.log) here{_partitions_hint(args.dir)}",
                  file=err)
            return 1
    except OSError as e:
        print(f"{args.dir}: {e.strerror or e}", file=err)
        return 1
    try:
        if args.what == "check":
            return _check(args.dir, now_ns, out)
        return _dump(args.dir, args.json, out)
    except CmdlogError as e:
        print(str(e), file=err)
        return 1
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except ValueError as e:
        print(f"{args.dir}: {e}", file=err)
        return 2
    except OSError as e:
        print(f"{e.filename or args.dir}: {e.strerror or e}", file=err)
        return 1


def main() -> None:
    sys.exit(cmdlog_main(sys.argv[1:]))


if __name__ == "__main__":
    main()
