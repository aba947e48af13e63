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

Telling the truth (issue 11, defect 10): anything that is not a readable
journal exits 1 (a missing file, a directory, a record that does not decode; a
workq segment is recognised and pointed at `lanner cmdlog dump`), and a file
not named like a journal, or empty, gets a warning on stderr.  With several
files, `-q` still heads each summary with its `Queue: <file>` line.  Usage
errors exit 2.  qpack refuses to overwrite an existing NEWFILE unless given
`--force`, and never writes over one of its inputs.
"""
from __future__ import annotations

import os
import re
import stat
import sys
from collections import deque

from tqdm import tqdm

from lanner.clock import SYSTEM_CLOCK
from lanner.server.dirlock import refuse_live
from lanner.storage.cmdlog.segment import HEADER as SEGMENT_HEADER
from lanner.storage.journal.codec import JournalCorrupt, read_records
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
usage: lanner qpack -f <new-file> <journal-files...>
    pack one or more kestrel journal file into a single new one

options:
    -f filename     new packed journal file
    --force         overwrite the new file if it exists
    --ignore-lock   pack journals of a directory a running server holds

"""

# `<queue>`, `<queue>.<ms>`, `<queue>.<ms>.pack`, `<queue>~~<ms>` (reference §6.1)
_JOURNAL_NAME = re.compile(r"[^.~]+(\.[0-9]+(\.pack)?|~~[0-9]+)?")

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
    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, file=stderr, leave=False)


def _expiry_text(expiry: int, now: int) -> str:
    if not expiry:
        return ""
    left = expiry - now
    return " expired" if left < 0 else f" exp={duration_str(left)}"


def _check_file(path: str, err) -> int | None:
    """The size of `path` if it can be a journal (warnings for what looks wrong), else None
    after saying why."""
    try:
        st = os.stat(path)
    except OSError:
        err.write(f"Can't open journal file: {path}\n")
        return None
    if not stat.S_ISREG(st.st_mode):
        err.write(f"Can't open journal file: {path} (not a regular file)\n")
        return None
    try:
        with open(path, "rb") as f:
            head = f.read(len(SEGMENT_HEADER))
    except OSError as e:
        err.write(f"Can't open journal file: {path} ({e.strerror or e})\n")
        return None
    if head == SEGMENT_HEADER:
        err.write(f"Not a journal file: {path} is a workq command-log segment; "
                  "use `lanner cmdlog dump <its directory>`\n")
        return None
    if not _JOURNAL_NAME.fullmatch(os.path.basename(path)):
        err.write(f"warning: {path}: not named like a journal (<queue>, <queue>.<ms>, <queue>.<ms>.pack)\n")
    if st.st_size == 0:
        err.write(f"warning: {path} is empty\n")
    return st.st_size


def _dump_file(path: str, quiet: bool, dump: bool, raw: bool, dump_queue: bool, now: int, out, err) -> bool:
    size = _check_file(path, err)
    if size is None:
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


def _options(tool: str, usage: str, argv: list[str], flags: tuple, valued: tuple, err):
    """qdump's and qpack's command lines, one way: ({option: True, or its file name for one of
    `valued`}, [files]), or None once the usage error is on `err`.  `--help` ends the reading
    where it stands, as it did when each tool read its own."""
    opts: dict = {}
    files = []
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg == "--help":
            return {arg: True}, files
        if arg in valued:
            if not args:
                err.write(f"lanner {tool}: {arg} needs a file name\n{usage}")
                return None
            opts[arg] = args.pop(0)
        elif arg in flags:
            opts[arg] = True
        elif arg.startswith("-") and arg != "-":
            err.write(f"lanner {tool}: unknown option {arg}\n{usage}")
            return None
        else:
            files.append(arg)
    return opts, files


def qdump_main(argv: list[str], *, clock=None, stdout=None, stderr=None) -> int:
    """`lanner qdump [-q] [-d] [-A] [-Q] FILE...`; stdout is a binary stream.  Exit 0 when
    every file was read to its end, 1 otherwise, 2 for a usage error."""
    out = stdout if stdout is not None else sys.stdout.buffer
    err = stderr if stderr is not None else sys.stderr
    parsed = _options("qdump", QDUMP_USAGE, argv, ("--ignore-lock", "-q", "-d", "-A", "-Q"), (), err)
    if parsed is None:
        return 2
    opts, files = parsed
    if "--help" in opts:
        out.write(QDUMP_USAGE.encode())
        return 0
    ignore_lock, dump, raw, dump_queue = "--ignore-lock" in opts, "-d" in opts, "-A" in opts, "-Q" in opts
    quiet = "-q" in opts or raw or dump_queue
    if not files:
        err.write(QDUMP_USAGE)
        return 2
    refusal = refuse_live(files, ignore_lock)
    if refusal:
        err.write(f"lanner qdump: {refusal}\n")
        return 1
    now = (clock or SYSTEM_CLOCK).now_ms()
    status = 0
    for path in files:
        if not quiet or (len(files) > 1 and not raw):      # several summaries: say whose each is
            out.write(f"Queue: {path}\n".encode())
        if not _dump_file(path, quiet, dump, raw, dump_queue, now, out, err):
            status = 1
    out.flush()
    return status


def qpack_main(argv: list[str], *, clock=None, stdout=None, stderr=None) -> int:
    """`lanner qpack -f NEWFILE [--force] FILE...`: replay the files in the order given into
    one journal.  Exit 0 when it is written, 1 when it is not, 2 for a usage error."""
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    parsed = _options("qpack", QPACK_USAGE, argv, ("--ignore-lock", "-q", "--force"), ("-f",), err)
    if parsed is None:
        return 2
    opts, files = parsed
    if "--help" in opts:
        out.write(QPACK_USAGE)
        return 0
    ignore_lock, quiet, force, new_file = "--ignore-lock" in opts, "-q" in opts, "--force" in opts, opts.get("-f")
    if new_file is None or not files:
        err.write(("lanner qpack: no new file (-f NEWFILE)\n" if new_file is None else
                   "lanner qpack: no journal files to pack\n") + QPACK_USAGE)
        return 2
    for path in files:
        if not os.path.isfile(path):
            err.write(f"Can't open journal file: {path}\n")
            return 1
        if os.path.exists(new_file) and os.path.samefile(path, new_file):
            err.write(f"lanner qpack: {new_file} is one of the journals to pack; write the pack elsewhere\n")
            return 1
    refusal = refuse_live(files + [new_file], ignore_lock)
    if refusal:
        err.write(f"lanner qpack: {refusal}\n")
        return 1
    if os.path.lexists(new_file) and not force:
        err.write(f"lanner qpack: {new_file} exists; use --force to overwrite it\n")
        return 1
    out.write("Packing journals...\n")
    out.flush()
    total = sum(os.path.getsize(p) for p in files)
    bar = _progress_bar(err, 2 * total, "Packing", not quiet)

    def progress(done: int, _total: int) -> None:
        bar.update(done - bar.n)
    try:
        result = pack_files(files, new_file, progress=progress if bar is not None else None,
                            now_ms=(clock or SYSTEM_CLOCK).now_ms(), legacy_xids=True,
                            allow_torn_tail=True)
    except JournalCorrupt as e:
        err.write(f"Exception reading journal file: {e.file}\n{e}\nNothing written.\n")
        return 1
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
        err.write(f"warning: {file} at offset {offset}: {reason} (a torn write): that record is left out\n")
    return 0
