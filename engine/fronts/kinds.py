"""Which connection class serves each kind of listener, and which of them can move to another
worker (server/local.py's handoffs).  Apart from front.py and local.py, which use these only when
they serve or hand over a connection: memcache.so cimports their C types (memcache.pxd), so it
loads them as it loads, and they must not load it back at the top."""
from __future__ import annotations

from lanner.fronts.admin import AdminConn
from lanner.fronts.memcache import MemcacheConn
from lanner.fronts.text import TextConn
from lanner.fronts.thrift import ThriftConn

CONN_CLASSES = {"memcache": MemcacheConn, "text": TextConn, "admin": AdminConn, "thrift": ThriftConn}
# The protocols whose connection state lives entirely in the worker (open reads) and the
# parser's unparsed bytes, so a connection can move; thrift's open reads carry server-wide ids.
MOVABLE = (MemcacheConn, TextConn)
