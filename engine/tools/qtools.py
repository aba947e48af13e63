"""`lanner qdump` and `lanner qpack`: Kestrel's journal tools (reference §6.7).

The output is Kestrel's (tools/QDumper.scala, tools/QPacker.scala) line for
line, with three differences: item data is written as the raw bytes stored
(Kestrel decoded them as ISO-8859-1 and re-encoded them for the terminal), the
`\\rReading journal:` / `\\rPacking:` progress lines are replaced by a tqdm bar
on stderr shown only when stderr is a terminal and the input is big, and a
corrupt record is reported as `Exception reading journal file: <file>` plus
the reason and offset (no stack trace), with a non-zero exit status.  Replay
quirks are Kestrel's: each file given to qdump is described on its own, and
a legacy REMOVE_TENTATIVE is shown under the next free xid.
"""
from __future__ import annotations

import os
import sys
from collections import deque

from lanner.clock import SYSTEM_CLOCK
from lanner.server.dirlock import refuse_live
from lanner.storage.journal.journal import JournalCorrupt, read_records
from lanner.storage.journal.packer import pack_files

PROGRESS_MIN_BYTES = 4 << 20

QDUMP_USAGE = """
usage: lanner qdump [options] <journal-files...>
    describe the contents of a kestrel journal file

options:
    -q      quiet: don't describe every line, just the summary
    -d      dump contents of added items
    -A      dump only the raw contents of added items
    -Q      dump only the raw queue state (data for items actually in the queue)
    --ignore-lock   read journals of a directory a running server holds

"""

QPACK_USAGE = """
usage: lanner qpack <journal-files...>
    pack one or more kestrel journal file into a single new one

options:
    -f filename     new packed journal file
    --ignore-lock   pack journals of a directory a running server holds

"""

_UNITS = ((86_400_000, "days"), (3_600_000, "hours"), (60_000, "minutes"), (1000, "seconds"),
          (1, "milliseconds"))


def duration_str(ms: int) -> str:
    """com.twitter.util.Duration.toString at millisecond precision: `9.seconds+999.milliseconds`."""
    if ms == 0:
        return "0.seconds"
    parts = []
    for unit, name in _UNITS:
        v = int(ms / unit)
        if v:
            ms -= v * unit
            parts.append(f"{v}.{name}")
    return "+".join(parts)


def _progress_bar(stderr, total: int, desc: str, enabled: bool):
    if not enabled or total < PROGRESS_MIN_BYTES or not getattr(stderr, "isatty", lambda: False)():
        return None
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, file=stderr, leave=False)


def _expiry_text(expiry: int, now: int) -> str:
    if not expiry:
        return ""
    left = expiry - now
    return " expired" if left < 0 else f" exp={duration_str(left)}"


def _dump_file(path: str, quiet: bool, dump: bool, raw: bool, dump_queue: bool, now: int, out, err) -> bool:
    try:
        size = os.path.getsize(path)
    except OSError:
        err.write(f"Can't open journal file: {path}\n")
        return False
    queue: deque[tuple[int, bytes | None]] = deque()   # (size, data when -Q needs it)
    opened: dict[int, tuple[int, bytes | None]] = {}
    offset = operations = current_xid = 0
    bar = _progress_bar(err, size, "Reading journal", quiet and not raw)
    w = out.write
    ok = True
    try:
        for offset, rec in read_records(path, now_ms=now):
            operations += 1
            op, item, xid = rec
            head = b"" if quiet else b"%08x  " % (offset & 0xFFFFFFFF)
            if item is not None:
                n = len(item.data)
                if not quiet:
                    line = ("CON %-6d" if op == 8 else "ADD %-6d") % n
                    if op == 7 and xid > 0:
                        line += f" xid={xid}"
                    w(head + (line + _expiry_text(item.expiry, now) + "\n").encode())
                if dump:
                    w(b"    " + item.data + b"\n")
                elif raw:
                    w(item.data)
                if op == 8:
                    opened.pop(xid, None)
                queue.append((n, item.data if dump_queue else None))
            elif op == 1:
                if not quiet:
                    w(head + b"REM\n")
                if queue:
                    queue.popleft()
            elif op == 9 or op == 3:
                if op == 3:
                    current_xid += 1
                    while current_xid == 0 or current_xid in opened:
                        current_xid += 1
                    xid = current_xid
                if queue:
                    opened[xid] = queue.popleft()
                if not quiet:
                    w(head + b"RSV %d\n" % xid)
            elif op == 4:
                if not quiet:
                    w(head + b"XID %d\n" % xid)
                current_xid = xid
            elif op == 5:
                back = opened.pop(xid, None)
                if back is not None:
                    queue.appendleft(back)
                if not quiet:
                    w(head + b"CAN %d\n" % xid)
            elif op == 6:
                if not quiet:
                    w(head + b"ACK %d\n" % xid)
                opened.pop(xid, None)
            if bar is not None and offset - bar.n >= 1 << 20:
                bar.update(offset - bar.n)
        offset = size
    except JournalCorrupt as e:
        out.flush()
        err.write(f"Exception reading journal file: {path}\n{e}\n")
        ok = False
    except OSError as e:
        out.flush()
        err.write(f"Exception reading journal file: {path}\n{e}\n")
        ok = False
    finally:
        if bar is not None:
            bar.close()
    if not ok:
        return False
    if not raw:
        w(b"\r" + b" " * 30 + b"\n")
        total_items = len(queue) + len(opened)
        total_bytes = sum(s for s, _ in queue) + sum(s for s, _ in opened.values())
        w(b"Journal size: %d bytes, with %d operations.\n" % (offset, operations))
        w(b"%d items totalling %d bytes.\n" % (total_items, total_bytes))
    if dump_queue:
        for _, data in queue:
            w(data + b"\n")
    return True


def qdump_main(argv: list[str], *, clock=None, stdout=None, stderr=None) -> int:
    """`lanner qdump [-q] [-d] [-A] [-Q] FILE...`; stdout is a binary stream."""
    out = stdout if stdout is not None else sys.stdout.buffer
    err = stderr if stderr is not None else sys.stderr
    quiet = dump = raw = dump_queue = ignore_lock = False
    files = []
    for arg in argv:
        if arg == "--help":
            out.write(QDUMP_USAGE.encode())
            return 0
        if arg == "--ignore-lock":
            ignore_lock = True
        elif arg == "-q":
            quiet = True
        elif arg == "-d":
            dump = True
        elif arg == "-A":
            raw = quiet = True
        elif arg == "-Q":
            dump_queue = quiet = True
        else:
            files.append(arg)
    if not files:
        out.write(QDUMP_USAGE.encode())
        return 0
    refusal = refuse_live(files, ignore_lock)
    if refusal:
        err.write(f"lanner qdump: {refusal}\n")
        return 1
    now = (clock or SYSTEM_CLOCK).now_ms()
    status = 0
    for path in files:
        if not quiet:
            out.write(f"Queue: {path}\n".encode())
        if not _dump_file(path, quiet, dump, raw, dump_queue, now, out, err):
            status = 1
    out.flush()
    return status


def qpack_main(argv: list[str], *, clock=None, stdout=None, stderr=None) -> int:
    """`lanner qpack -f NEWFILE FILE...`: replay the files in the order given into one journal."""
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    files: list[str] = []
    new_file = None
    quiet = ignore_lock = False
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg == "--help":
            out.write(QPACK_USAGE)
            return 0
        if arg == "--ignore-lock":
            ignore_lock = True
        elif arg == "-q":
            quiet = True
        elif arg == "-f" and args:
            new_file = args.pop(0)
        else:
            files.append(arg)
    if not files or new_file is None:
        out.write(QPACK_USAGE)
        return 0
    for path in files:
        if not os.path.isfile(path):
            err.write(f"Can't open journal file: {path}\n")
            return 1
    refusal = refuse_live(files + [new_file], ignore_lock)
    if refusal:
        err.write(f"lanner qpack: {refusal}\n")
        return 1
    out.write("Packing journals...\n")
    out.flush()
    total = sum(os.path.getsize(p) for p in files)
    bar = _progress_bar(err, 2 * total, "Packing", not quiet)

    def progress(done: int, _total: int) -> None:
        bar.update(done - bar.n)
    try:
        result = pack_files(files, new_file, progress=progress if bar is not None else None,
                            now_ms=(clock or SYSTEM_CLOCK).now_ms(), legacy_xids=True)
    except OSError as e:
        err.write(f"Cannot write {new_file}: {e}\n")
        return 1
    finally:
        if bar is not None:
            bar.close()
    out.write("\rWriting new journal..." + " " * 40 + "\n")
    out.write("\r" + " " * 40 + "\n")
    out.write(f"Done. New journal size: {result.out_bytes}\n")
    out.flush()
    for file, offset, reason in result.broken:
        err.write(f"Exception reading journal file: {file}\n{file} at offset {offset}: {reason}\n")
    return 1 if result.broken else 0
