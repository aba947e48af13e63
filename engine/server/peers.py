"""What a worker does for the rest of the server: stats and config for fan-out
commands, reload, and the supervisor's news of peers that died and came back.
"""
from __future__ import annotations

import logging

import msgpack

from lanner.config import ConfigError, config_items, reload_config
from lanner.fronts.counters import C_CURR
from lanner.ipc import control
from lanner.server import statsjob

log = logging.getLogger(__name__)


class PeerOps:
    """Worker methods; the attributes they use are set in Worker.__init__.

    Filled by Worker: coll, config, epoch, peers, sessions, down_peers, control, send_parked,
    moves, void_moves, moves_voided, drain, drop_holds.
    """
    __slots__ = ()              # the worker's (worker.py)

    # -- stats, config ---------------------------------------------------------------------------
    def stats_names(self, names) -> list[str]:
        """The queues a stats answer covers: `names`, or every queue and each alias this
        worker owns."""
        if names is not None:
            return names
        return self.coll.names() + [a for a in self.config.aliases if self.owns(a)]

    def stats_of(self, name: str):
        """One queue's (or owned alias's) figures; None for a queue that does not exist."""
        if name in self.config.aliases and self.owns(name):
            return self.coll.alias_stats(name)
        return self.coll.queue_stats(name)

    def stats_payload(self, names) -> bytes:
        """The whole answer at once (statsjob.py slices the large ones)."""
        out_queues = [(name, self.stats_of(name)) for name in self.stats_names(names)]
        return msgpack.packb({"global": self.global_figures(), "queues": out_queues})

    def global_figures(self) -> dict:
        """This worker's part of the global stats: its queues', and the fsyncs its group commit
        issued (items per fsync under sync "always" = cmd_set / fsyncs, issue 8)."""
        figures = self.coll.stats()
        figures["fsyncs"] = self.syncer.fsyncs
        return figures

    def config_payload(self) -> bytes:
        entries = [(name, config_items(self.coll.queue(name, create=False).config))
                   for name in self.coll.names()]
        return msgpack.packb(entries)

    def reload(self) -> str | None:
        """Re-read the config; on failure keep the old one and return why (no file path)."""
        at = self.epoch.start()
        try:
            self.config = reload_config(self.config)
        except ConfigError as e:
            self.epoch.loaded(at)
            log.error("worker %d: reload failed: %s", self.index, e)
            return e.brief
        self.coll.reload(self.config)
        if self.front is not None:
            self.front.use_config(self.config)
        self.epoch.loaded(at)
        log.info("worker %d: configuration reloaded", self.index)
        return None

    # -- supervisor and cleaner messages ---------------------------------------------------------
    def on_control(self, msg) -> None:
        cmd = msg.get("cmd")
        if cmd == "peer_down":
            peer = msg["peer"]
            for p in self.peer_slots(peer):
                self.peer_down(p)
            if self.front is not None and not self.peers.is_front(peer):
                self.front.worker_down(peer - self.nfronts)
            control.send(self.control, {"cmd": "ack_down", "peer": peer, "worker": self.index})
        elif cmd == "peer_up":
            for p in self.peer_slots(msg["peer"]):
                self.down_peers.discard(p)
                self.send_parked(p)
            if self.front is not None and not self.peers.is_front(msg["peer"]):
                self.front.down_workers.discard(msg["peer"] - self.nfronts)
            control.send(self.control, {"cmd": "ack_up", "peer": msg["peer"], "worker": self.index})
        elif cmd == "reload":
            if self.epoch.behind():      # else its front caught up already (LocalFront)
                self.reload()
        elif cmd == "stop":
            self.request_stop()

    def peer_slots(self, peer: int) -> list[int]:
        """The peers a process that went down or came up stands for: a worker that serves
        clients is also a front slot (its clients' open reads live here too)."""
        if self.front is not None and not self.peers.is_front(peer):
            return [peer, self.peers.of_embedded(peer - self.nfronts)]
        return [peer]

    def peer_down(self, peer: int) -> None:
        """A front or worker died: whatever a front left unread in our rings is void (a
        half-sent large message included; a worker's whole messages are run first), its
        connections' open reads roll back, and
        nothing more is sent to it until its replacement shows up.  Acknowledged at once
        (on_control): the supervisor starts the replacement only after every peer has, so
        everything in our rings after this point comes from the replacement (ring.py,
        "Crashed peers")."""
        ring = self.inbound[peer]
        if ring is not None and not self.peers.is_front(peer):
            # A worker's moves and acks that it published are whole and still wanted: its moves
            # that its journal does not hold exist nowhere else now; ours it did not acknowledge
            # go again when it is back.
            self.down_peers.discard(peer)
            self.void_moves.add(peer)   # ... but those its journal holds, which it moves again
            try:
                self.drain([(peer, ring)])
            finally:
                self.void_moves.discard(peer)
            if self.moves_voided:
                log.info("worker %d: %d moves worker %d left are left to its journal", self.index,
                         self.moves_voided, peer - self.nfronts)
                self.moves_voided = 0
            self.moves.peer_down(peer)
        self.down_peers.add(peer)
        statsjob.cancel(self, peer)
        if ring is not None:
            ring.resync_consumer(discard=True)
            ring.prepare_sleep()    # resync cleared our flag: the replacement must signal us
            self.asm[peer].reset()
            self.bodies.drop(peer)
        out = self.outbound[peer]
        if out is not None:
            out.drop_backlog()
        if not self.peers.is_front(peer) and self.inbox is not None:
            ended = self.inbox.drop_from(peer - self.nfronts)    # sockets it sent, never claimed
            if ended:
                self.front.my.decr(C_CURR, ended)
        if self.peers.is_front(peer):
            self.closed_conns = {k for k in self.closed_conns if k[0] != peer}
            for key in [k for k in self.sessions if k[0] == peer]:
                self.disconnect(*key)
            for key in [k for k in self.pending_by_conn if k[0] == peer]:
                self.disconnect(*key)
            self.drop_holds(peer)       # and the held reads of replies it had not written (holding.py)
        for replies in self.waiting_replies():      # (a worker's: acks its replacement never sent for)
            replies[:] = [r for r in replies if r[0] != peer]

    def peer_back(self, peer: int) -> None:
        """A record from a peer we marked down: its replacement is running (it may send
        before its `peer_up` reaches us, and must then get its replies)."""
        self.down_peers.discard(peer)
        log.info("worker %d: peer %d is back", self.index, peer)
        self.send_parked(peer)

    def on_cleaner(self, msg) -> None:
        self.storage_factory.on_cleaner_reply(msg)
