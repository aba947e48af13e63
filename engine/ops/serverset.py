"""ZooKeeper server sets: clients find servers by status (reference §5.11, Kestrel's
`ZooKeeperServerStatus`).

With a `[zookeeper]` table in the config the supervisor forks one more child,
`lanner-zk`, that runs `serverset_main`: it keeps a kazoo session and makes the
server a member of

* `<path_prefix>/write` and `<path_prefix>/read` while the status in force is Up,
* only `<path_prefix>/read` while it is ReadOnly or WriteAvoid,
* neither while it is Quiescent or Down (shutdown).

It follows the status *in force* (`ServerStatus.enforced`), which it reads from
the shared status block every `POLL` seconds, so a stricter status leaves the
sets only when its grace period ends, as Kestrel's did, and a looser one joins
at once.

A member is an ephemeral sequential znode `member_NNNNNNNNNN` whose data is the
ServerSet JSON of Twitter's `ServiceInstance` (what finagle's and Kestrel's
clients read):

    {"serviceEndpoint": {"host": "h", "port": 22133},
     "additionalEndpoints": {"memcache": {...}, "thrift": {...}, "text": {...}},
     "status": "ALIVE"}

The default endpoint is memcache, else thrift, else text.  Ephemeral nodes go
with the session, so a `kill -9` of the whole server leaves the sets within
`session_timeout`.

ZooKeeper going away never touches request handling (this is a separate
process).  While disconnected the session may survive (kazoo SUSPENDED, then
CONNECTED: the members are still there); if it expired (LOST), kazoo opens a
new session and the next pass re-creates the members.  Every pass compares
what should be with what this process has created, and a failed ZooKeeper call
is retried on the next pass.  A create whose reply was lost (ConnectionLoss)
may still have happened: before creating again, the pass adopts any member of
that set owned by this session that carries this server's data.

With `digest = "user:password"` the session authenticates with that digest;
members (and path nodes this process creates) are then writable by that
identity only and readable by everyone, so clients discover without
credentials.
"""
from __future__ import annotations

import json
import logging
import signal
import socket
import threading

log = logging.getLogger("lanner.serverset")

POLL = 0.1
SETS = ("write", "read")
_MEMBERSHIP = {"Up": ("write", "read"), "WriteAvoid": ("read",), "ReadOnly": ("read",),
               "Quiescent": (), "Down": ()}
_ENDPOINT_ORDER = ("memcache", "thrift", "text")


def sets_for(status: str) -> frozenset[str]:
    """The server sets a server with status `status` (in force) belongs to."""
    return frozenset(_MEMBERSHIP.get(status, ()))


def advertised_host(listen_address: str, configured: str | None = None) -> str:
    if configured:
        return configured
    if listen_address in ("0.0.0.0", "::", ""):
        return socket.getfqdn()
    return listen_address


def member_data(host: str, ports: dict[str, int]) -> bytes:
    """ServerSet JSON for the listeners in `ports` ({"memcache": 22133, ...})."""
    eps = {k: {"host": host, "port": ports[k]} for k in _ENDPOINT_ORDER if ports.get(k)}
    if not eps:
        raise ValueError("a server-set member needs a memcache, thrift or text listener")
    main = next(k for k in _ENDPOINT_ORDER if k in eps)
    doc = {"serviceEndpoint": eps[main], "additionalEndpoints": eps, "status": "ALIVE"}
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


class ServerSet:
    """Membership of one server in `<prefix>/write` and `<prefix>/read`.

    `want(sets)` records what should be; `reconcile()` (called by the owner's loop)
    makes it so as far as ZooKeeper allows, and is safe to call at any time."""

    def __init__(self, zk_config, data: bytes, client=None) -> None:
        # lazy: kazoo and the control socket are loaded only in the zk child
        from kazoo.client import KazooClient
        from kazoo.protocol.states import KazooState
        self._states = KazooState
        self.prefix = zk_config.path_prefix.rstrip("/") or ""
        self.data = data
        self.acl = None
        auth = None
        if zk_config.digest:
            # lazy: kazoo and the control socket are loaded only in the zk child
            from kazoo.security import READ_ACL_UNSAFE, make_digest_acl
            user, _, password = zk_config.digest.partition(":")
            auth = [("digest", zk_config.digest)]
            self.acl = [make_digest_acl(user, password, all=True)] + list(READ_ACL_UNSAFE)
        self.client = client or KazooClient(
            hosts=zk_config.hosts, timeout=zk_config.session_timeout / 1000.0, auth_data=auth,
            connection_retry={"max_tries": -1, "delay": 0.1, "backoff": 2, "max_delay": 2.0},
            logger=logging.getLogger("lanner.serverset.kazoo"))
        self.wanted: frozenset[str] = frozenset()
        self.joined: dict[str, str] = {}       # set -> member path
        self.unsure: set[str] = set()          # sets whose last create's reply was lost
        self._lock = threading.Lock()
        self.client.add_listener(self._on_state)

    def path(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    # kazoo calls this from its own thread: no ZooKeeper calls here
    def _on_state(self, state) -> None:
        if state == self._states.LOST:
            with self._lock:
                if self.joined:
                    log.warning("zookeeper session lost; members %s are gone, will rejoin",
                                ", ".join(sorted(self.joined)))
                self.joined = {}
                self.unsure.clear()
        elif state == self._states.SUSPENDED:
            log.warning("zookeeper connection suspended")
        else:
            log.info("zookeeper connected")

    def start(self) -> None:
        self.client.start_async()

    def want(self, sets) -> None:
        sets = frozenset(sets)
        if sets != self.wanted:
            log.info("server sets: %s", ", ".join(sorted(sets)) or "none")
        self.wanted = sets

    def in_sync(self) -> bool:
        with self._lock:
            return set(self.joined) == set(self.wanted) and not self.unsure

    def reconcile(self) -> bool:
        """One pass; True when membership matches `wanted`."""
        if not self.client.connected:
            return False
        # lazy: kazoo and the control socket are loaded only in the zk child
        from kazoo.exceptions import KazooException, NoNodeError, NodeExistsError
        ok = True
        for name in SETS:
            with self._lock:
                have = self.joined.get(name)
            try:
                if name in self.wanted and have is None:
                    self._join(name)
                elif name not in self.wanted and have is not None:
                    try:
                        self.client.delete(have)
                    except NoNodeError:
                        pass
                    with self._lock:
                        self.joined.pop(name, None)
                    log.info("left %s (%s)", self.path(name), have)
            except (KazooException, NodeExistsError) as e:
                log.warning("server set %s: %s; will retry", self.path(name), type(e).__name__)
                ok = False
        return ok and self.in_sync()

    def _join(self, name: str) -> None:
        # lazy: kazoo and the control socket are loaded only in the zk child
        from kazoo.exceptions import ConnectionLoss
        path = self.path(name)
        if name in self.unsure:
            mine = self._find_mine(name)
            self.unsure.discard(name)
            if mine is not None:
                with self._lock:
                    self.joined[name] = mine
                log.info("joined %s (%s, adopted)", path, mine)
                return
        self.client.ensure_path(path, acl=self.acl)
        try:
            member = self.client.create(path + "/member_", self.data, acl=self.acl,
                                        ephemeral=True, sequence=True)
        except ConnectionLoss:
            self.unsure.add(name)
            raise
        with self._lock:
            self.joined[name] = member
        log.info("joined %s (%s)", path, member)

    def _find_mine(self, name: str) -> str | None:
        cid = self.client.client_id
        if cid is None:
            return None
        path = self.path(name)
        for child in self.client.get_children(path):
            data, stat = self.client.get(f"{path}/{child}")
            if stat.ephemeralOwner == cid[0] and data == self.data:
                return f"{path}/{child}"
        return None

    def stop(self) -> None:
        """Leave every set (delete the members, then close the session)."""
        self.want(())
        try:
            if self.client.connected:
                self.reconcile()
        finally:
            try:
                self.client.stop()
                self.client.close()
            except Exception:          # already gone: nothing to leave
                pass


def serverset_main(config, status, ports: dict[str, int], control_sock) -> int:
    """The `lanner-zk` child: follow the status until SIGTERM or the supervisor's end."""
    zk = config.zookeeper
    host = advertised_host(config.server.listen_address, zk.advertise_host)
    sset = ServerSet(zk, member_data(host, ports))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    log.info("server sets under %s on %s as %s", zk.path_prefix, zk.hosts, host)
    sset.start()
    # lazy: kazoo and the control socket are loaded only in the zk child
    from lanner.ipc import control
    from lanner.ipc.fdwait import wait_readable
    control.send(control_sock, {"cmd": "ready"})
    while not stop.is_set():
        sset.want(sets_for(status.enforced()))
        if not sset.in_sync():
            sset.reconcile()
        if wait_readable((control_sock,), POLL):
            try:
                if not control_sock.recv(4096):
                    log.warning("serverset: supervisor gone, leaving")
                    break
            except OSError:
                break
    sset.stop()
    return 0
