"""Configuration: the TOML file of contract.md, validated into frozen dataclasses.

Layout (contract.md "Config file"): `[server]` (ServerConfig), `[default]`
(QueueConfig), `[queues."<name>"]` (per-queue overrides), `[aliases."<name>"]`
(`destinations = [...]`), `[cmdlog]` (CmdlogConfig) and the optional
`[zookeeper]` (ZooKeeperConfig).  Everything is checked when the file is read, at start-up and at `reload`: an unknown table or key, a
wrong TOML type, a bad size or duration, a negative number, or a bad enum value
raises ConfigError, whose one-line message starts with the dotted key at fault
and ends with the file.  Nothing is checked later, so code holding a Config can
trust every value in it.

Values (config_values.py reads and checks each one):

* Sizes are int bytes or strings with binary units; `KB`/`MB`/... are binary
  too, as in Kestrel.  They saturate at 2**63-1 (Kestrel's Long.MaxValue), so
  the sample's `"8EiB"` means "unlimited" and equals the built-in default.
* Durations are int milliseconds or strings ("250ms", "1s", "5m", "1h", "1d");
  `"off"` is None where the setting is optional.  Fractions of a byte or a
  millisecond are dropped.
* Booleans must be TOML booleans; plain integers must be TOML integers.  Only
  command-line overrides may spell integers, ports and "off" as strings.
* Queue names follow queues/names.py.

Queue names: TOML text is Unicode, but the server sees queue names as the raw
bytes a client sent, which the rest of Lanner carries as latin-1 decoded `str`.
So every queue, alias, destination and expire_to_queue name from the file is
turned into the latin-1 reading of its UTF-8 bytes (identity for ASCII), which
is the name a client sending those UTF-8 bytes would use.

Inheritance (reference §7.2, Kestrel 2.3.4+): a master queue's config is
`[default]` with the queue's explicit fields applied; a fanout child `a+b` is
master `a`'s resolved config with `a+b`'s explicit fields applied.  All names
with overrides are resolved once when the Config is built; any other name maps
to `default` or to its master's config, so `queue_config` never allocates and
its cache stays bounded by the file, whatever names clients invent.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import stat
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from lanner.config_values import (
    CMDLOG_FIELDS, INT_MAX, LONG_MAX, QUEUE_FIELDS, SERVER_FIELDS, ZOOKEEPER_FIELDS, Checker,
    ConfigError, key_part, parse_duration, parse_size, wire_name,
)
from lanner.queues.names import validate_queue_name
from lanner.queues.placement import PARTITIONS

log = logging.getLogger(__name__)

MAX_CONFIG_BYTES = 1 << 20    # a config file is a few KiB; anything this big is a mistake

__all__ = [
    "CmdlogConfig", "Config", "ConfigError", "QueueConfig", "ServerConfig", "ZooKeeperConfig",
    "config_items", "load_config", "parse_duration", "parse_size", "reload_config",
]

# ------------------------------------------------------------------- the dataclasses

@dataclass(frozen=True, slots=True)
class QueueConfig:
    """One queue's settings (reference §7.2).  Sizes in bytes, durations in ms."""

    max_items: int = INT_MAX
    max_size: int = LONG_MAX
    max_item_size: int = LONG_MAX
    max_age: int | None = None
    default_journal_size: int = 16 * 2**20
    max_memory_size: int = 128 * 2**20
    max_journal_size: int = 2**30
    min_journal_compact_delay: int | None = 60_000
    discard_old_when_full: bool = False
    keep_journal: bool = True
    sync_journal: str | int = "never"       # "never" | "always" | a period in ms (> 0)
    expire_to_queue: str | None = None
    max_expire_sweep: int = INT_MAX
    fanout_only: bool = False
    max_queue_age: int | None = None
    disable_aggressive_rewrites: bool = False
    open_transaction_timeout: int | None = None
    storage: str = "journal"                # "journal" | "cmdlog"
    white_list_client_id_for_enqueue: str | None = None     # §5.12: only this thrift client id adds
    white_list_client_id_for_dequeue: str | None = None     # ... and removes


@dataclass(frozen=True, slots=True)
class CmdlogConfig:
    """Settings of the workq-format command logs (one per partition)."""

    segment_size: int = 64 * 2**20
    sync: str = "interval"                  # "interval" | "os" | "always"
    sync_interval: int = 1000
    clean_interval: int = 300_000


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """Server-wide settings (reference §7.1); `reload` never changes them."""

    listen_address: str = "127.0.0.1"
    memcache_port: int | None = 22133
    text_port: int | None = 2222
    thrift_port: int | None = 2229
    admin_port: int | None = 2223
    queue_path: str = "data/queues"
    status_file: str = "data/status"
    default_status: str = "Up"
    status_change_grace_period: int = 0
    max_open_transactions: int = 1
    expiration_timer_frequency: int | None = None
    client_timeout: int | None = None
    connection_limit_refuse_writes: int | None = None
    connection_limit_refuse_reads: int | None = None
    heartbeat_timeout: int | None = 30_000
    workers: int = field(default_factory=lambda: default_layout()[0])
    fronts: int = field(default_factory=lambda: default_layout()[1])
    worker_fronts: bool = True          # every worker also accepts and serves clients
    log_level: str = "info"
    log_file: str | None = None             # None: stderr; reopened on SIGUSR1 (ops/logfile.py)

    def __post_init__(self) -> None:
        if not self.fronts and not self.worker_fronts:
            raise ConfigError("server.fronts", "0 dedicated fronts and worker_fronts = false: "
                                               "nothing would accept clients")


def default_layout(cpus: int | None = None) -> tuple[int, int]:
    """(workers, dedicated fronts) for `lanner serve` without --workers/--fronts.

    Measured on the 2-core VM (perf/README.md, "Layouts (processes)"): workers that serve their
    own clients beat every layout with dedicated fronts, because a request that never crosses a
    process pays no wakeup.  So one worker per core and no dedicated fronts, the
    shard-per-core shape, on two cores too: there one worker spends less CPU per request (two
    sleep and wake on half the connections each), but in 36 interleaved pairs two workers
    still answered an eight-queue load 8-10 % faster, and a one-queue load ties.  Dedicated
    fronts (`--fronts N`) stay available for machines where connections, not queues, are the
    load."""
    if cpus is None:
        try:
            cpus = len(os.sched_getaffinity(0))     # honours taskset and cgroup cpusets
        except (AttributeError, OSError):
            cpus = os.cpu_count() or 1
    return max(1, min(cpus, PARTITIONS)), 0


@dataclass(frozen=True, slots=True)
class ZooKeeperConfig:
    """`[zookeeper]`: server-set membership (ops/serverset.py); absent means none."""

    hosts: str                              # "zk1:2181,zk2:2181[/chroot]"
    path_prefix: str                        # the sets are <path_prefix>/write and /read
    session_timeout: int = 10_000
    digest: str | None = None               # "user:password" (digest auth and ACL)
    advertise_host: str | None = None       # host in the member data; default: listen address


class FrozenMap(Mapping):
    """A read-only, hashable, picklable dict (MappingProxyType cannot be pickled)."""

    # `get` is the dict's own bound method, set per instance: the fronts and workers look
    # aliases and queue configs up per request, and a Python-level get() would be a call each
    __slots__ = ("_d", "get")

    def __init__(self, data: Mapping | None = None) -> None:
        self._d = dict(data or {})
        self.get = self._d.get

    def __getitem__(self, key):
        return self._d[key]

    def __iter__(self) -> Iterator:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __contains__(self, key) -> bool:
        return key in self._d

    def __hash__(self) -> int:
        return hash(frozenset(self._d.items()))

    def __repr__(self) -> str:
        return f"FrozenMap({self._d!r})"

    def __getstate__(self):
        return self._d

    def __setstate__(self, state) -> None:
        self._d = state
        self.get = state.get


def _freeze_overrides(overrides: Mapping[str, Mapping[str, object]]) -> FrozenMap:
    if isinstance(overrides, FrozenMap) and all(isinstance(v, FrozenMap) for v in overrides.values()):
        return overrides
    return FrozenMap({name: FrozenMap(fields) for name, fields in overrides.items()})


def _freeze_aliases(aliases: Mapping[str, tuple[str, ...]]) -> FrozenMap:
    return FrozenMap({name: tuple(dest) for name, dest in aliases.items()})


@dataclass(frozen=True)
class Config:
    """The whole configuration.  Build it with load_config; the constructor is
    public so tests can make one from parts (mappings are frozen on the way in)."""

    server: ServerConfig = field(default_factory=ServerConfig)
    default: QueueConfig = field(default_factory=QueueConfig)
    queue_overrides: Mapping[str, Mapping[str, object]] = field(default_factory=FrozenMap)
    aliases: Mapping[str, tuple[str, ...]] = field(default_factory=FrozenMap)
    cmdlog: CmdlogConfig = field(default_factory=CmdlogConfig)
    path: str | None = None
    zookeeper: ZooKeeperConfig | None = None
    _resolved: Mapping[str, QueueConfig] = field(init=False, repr=False, compare=False)
    #: whether any queue has a client-id whitelist: the fronts' hot paths look only at this
    has_whitelists: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        overrides = _freeze_overrides(self.queue_overrides)
        object.__setattr__(self, "queue_overrides", overrides)
        object.__setattr__(self, "aliases", _freeze_aliases(self.aliases))
        resolved: dict[str, QueueConfig] = {}
        # Masters first: a child resolves against its master's resolved config.
        for name, fields in overrides.items():
            if "+" not in name:
                resolved[name] = dataclasses.replace(self.default, **fields)
        for name, fields in overrides.items():
            plus = name.find("+")
            if plus >= 0:
                master = resolved.get(name[:plus], self.default)
                resolved[name] = dataclasses.replace(master, **fields)
        object.__setattr__(self, "_resolved", FrozenMap(resolved))
        object.__setattr__(self, "has_whitelists", any(
            qc.white_list_client_id_for_enqueue is not None or qc.white_list_client_id_for_dequeue is not None
            for qc in (self.default, *resolved.values())))

    def queue_config(self, name: str) -> QueueConfig:
        """Resolved config of queue `name` (default -> master -> child, §7.2)."""
        qc = self._resolved.get(name)
        if qc is not None:
            return qc
        plus = name.find("+")
        if plus < 0:
            return self.default
        return self._resolved.get(name[:plus], self.default)

    def is_alias(self, name: str) -> bool:
        return name in self.aliases


assert set(QUEUE_FIELDS) == {f.name for f in dataclasses.fields(QueueConfig)}
assert set(SERVER_FIELDS) == {f.name for f in dataclasses.fields(ServerConfig)}
assert set(CMDLOG_FIELDS) == {f.name for f in dataclasses.fields(CmdlogConfig)}
assert set(ZOOKEEPER_FIELDS) == {f.name for f in dataclasses.fields(ZooKeeperConfig)}


# ------------------------------------------------------------------- file -> Config

def _table(value: object, key: str) -> dict:
    if not isinstance(value, dict):
        raise ConfigError(key, f"expected a table, got {value!r}")
    return value


def _fields(table: Mapping[str, Any], checkers: Mapping[str, Checker], prefix: str,
            lenient: bool = False, unknown: str = "unknown key") -> dict[str, object]:
    """Each value checked by its key's checker; the file's tables and the command-line
    overrides (lenient: strings as typed) go through this one loop."""
    out: dict[str, object] = {}
    for k, v in table.items():
        key = f"{prefix}.{key_part(k)}"
        checker = checkers.get(k)
        if checker is None:
            raise ConfigError(key, unknown)
        out[k] = checker(v, key, lenient)
    return out


def _read_toml(path: str) -> dict:
    """The parsed file.  Opened without blocking and read only when it is a regular file of at
    most MAX_CONFIG_BYTES, so pointing the config at a FIFO, a device or a huge file is an
    error, not a hang of every process at `reload`."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ConfigError("", "the config file is not a regular file", path)
            if st.st_size > MAX_CONFIG_BYTES:
                raise ConfigError("", f"the config file is larger than {MAX_CONFIG_BYTES} bytes", path)
            with os.fdopen(os.dup(fd), "rb") as f:
                text = f.read(MAX_CONFIG_BYTES + 1)
        finally:
            os.close(fd)
        return tomllib.loads(text.decode("utf-8"))
    except OSError as e:
        raise ConfigError("", f"cannot read config file: {e.strerror or e}", path) from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError("", f"invalid TOML: {e}", path) from None
    except UnicodeDecodeError as e:
        raise ConfigError("", f"invalid TOML: not UTF-8 ({e.reason} at byte {e.start})", path) from None


def _build(doc: Mapping[str, Any], path: str | None) -> Config:
    unknown = set(doc) - {"server", "default", "queues", "aliases", "cmdlog", "zookeeper"}
    if unknown:
        k = sorted(unknown)[0]
        raise ConfigError(key_part(k), "unknown table" if isinstance(doc[k], dict) else "unknown key")

    server = _fields(_table(doc.get("server", {}), "server"), SERVER_FIELDS, "server")
    default = QueueConfig(**_fields(_table(doc.get("default", {}), "default"), QUEUE_FIELDS, "default"))

    queues: dict[str, dict[str, object]] = {}
    raw_names: dict[str, str] = {}
    for raw, table in _table(doc.get("queues", {}), "queues").items():
        prefix = f"queues.{key_part(raw)}"
        name = wire_name(raw)
        queues[name] = _fields(_table(table, prefix), QUEUE_FIELDS, prefix)
        raw_names[name] = raw

    cmdlog = CmdlogConfig(**_fields(_table(doc.get("cmdlog", {}), "cmdlog"), CMDLOG_FIELDS, "cmdlog"))

    aliases: dict[str, tuple[str, ...]] = {}
    raw_alias: dict[str, str] = {}
    for raw, table in _table(doc.get("aliases", {}), "aliases").items():
        prefix = f"aliases.{key_part(raw)}"
        table = _table(table, prefix)
        for k in table:
            if k != "destinations":
                raise ConfigError(f"{prefix}.{key_part(k)}", "unknown key")
        dests = table.get("destinations", [])
        if not isinstance(dests, list) or not all(isinstance(d, str) for d in dests):
            raise ConfigError(f"{prefix}.destinations", f"expected a list of queue names, got {dests!r}")
        aliases[wire_name(raw)] = tuple(wire_name(d) for d in dests)
        raw_alias[wire_name(raw)] = raw

    zookeeper = None
    if "zookeeper" in doc:
        zk = _fields(_table(doc["zookeeper"], "zookeeper"), ZOOKEEPER_FIELDS, "zookeeper")
        for required in ("hosts", "path_prefix"):
            if required not in zk:
                raise ConfigError(f"zookeeper.{required}", "required")
        zookeeper = ZooKeeperConfig(**zk)

    config = Config(ServerConfig(**server), default, queues, aliases, cmdlog, path, zookeeper)

    # Names are checked last: whether a name may contain "." depends on the
    # resolved storage of that queue.
    for name, raw in raw_names.items():
        try:
            validate_queue_name(name, allow_dots=config.queue_config(name).storage == "cmdlog")
        except ValueError as e:
            raise ConfigError(f"queues.{key_part(raw)}", str(e)) from None
    # An expire_to_queue target is created when its first item expires: a name only a
    # command-log queue may carry would fail then, on a client's request, not here.
    targets = [("default", default.expire_to_queue)]
    targets += [(f"queues.{key_part(raw)}", queues[name].get("expire_to_queue")) for name, raw in raw_names.items()]
    for prefix, target in targets:
        if target is not None:
            try:
                validate_queue_name(target, allow_dots=config.queue_config(target).storage == "cmdlog")
            except ValueError as e:
                raise ConfigError(f"{prefix}.expire_to_queue", f"{e} ({target!r})") from None
    for name, raw in raw_alias.items():
        prefix = f"aliases.{key_part(raw)}"
        try:
            validate_queue_name(name)
        except ValueError as e:
            raise ConfigError(prefix, str(e)) from None
        for i, dest in enumerate(config.aliases[name]):
            try:
                validate_queue_name(dest, allow_dots=config.queue_config(dest).storage == "cmdlog")
            except ValueError as e:
                raise ConfigError(f"{prefix}.destinations[{i}]", f"{e} ({dest!r})") from None
        if name in queues:
            log.warning("alias %r has the name of a configured queue; the alias wins for adds and reads%s",
                        name, f" (in {path})" if path else "")
    return config


def _apply_overrides(server: ServerConfig, overrides: Mapping[str, object]) -> ServerConfig:
    """Command-line values win over the file; they are checked like file values
    but may be strings as typed ("3", "off").  Their errors name no file."""
    try:
        fields = _fields(overrides, SERVER_FIELDS, "server", lenient=True, unknown="unknown setting")
    except ConfigError as e:
        raise ConfigError(e.key, e.reason + " (command-line override)") from None
    return dataclasses.replace(server, **fields)


def load_config(path: str | None = None, overrides: Mapping[str, object] | None = None) -> Config:
    """Read and validate the config file (None: built-in defaults), then apply
    command-line `overrides` (ServerConfig field name -> value, strings allowed),
    which win over the file."""
    doc = _read_toml(path) if path is not None else {}
    try:
        config = _build(doc, path)
    except ConfigError as e:
        raise e.in_file(path) from None
    if not overrides:
        return config
    server = _apply_overrides(config.server, overrides)
    return Config(server, config.default, config.queue_overrides, config.aliases, config.cmdlog, path,
                  config.zookeeper)


def reload_config(old: Config) -> Config:
    """Re-read `old.path` for `reload`/SIGHUP.  The new file is validated in full,
    but its `[server]` section is not applied: server settings (ports, paths,
    workers, command-line overrides) only change on restart (§7.1)."""
    new = load_config(old.path)
    return Config(old.server, new.default, new.queue_overrides, new.aliases, new.cmdlog, old.path,
                  old.zookeeper)


# ------------------------------------------------------------------- rendering

def _render(value: object) -> str:
    if value is None:
        return "off"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def config_items(qc: QueueConfig) -> list[tuple[str, str]]:
    """(key, value) pairs of a queue's config, in field order, as dump_config
    prints them: sizes in bytes, durations in ms, None as "off"."""
    return [(f.name, _render(getattr(qc, f.name))) for f in dataclasses.fields(qc)]


# Queue settings under which a journal never rotates, rewrites or reads behind on its own:
# for tools and benchmarks that drive one journal directly.
UNBOUNDED_JOURNAL = QueueConfig(max_memory_size=1 << 40, max_journal_size=1 << 50,
                                default_journal_size=1 << 40, min_journal_compact_delay=None)
