"""engine/config.py: TOML layout, value syntax, errors naming keys, inheritance, reload."""
from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import tomllib

import pytest
from hypothesis import given, settings, strategies as st

from lanner.config import (
    CmdlogConfig, Config, ConfigError, QueueConfig, ServerConfig, config_items, load_config,
    parse_duration, parse_size, reload_config,
)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SAMPLE = os.path.join(REPO, "etc", "lanner.toml")
LONG_MAX = 2**63 - 1


@pytest.fixture
def write(tmp_path):
    def write(text: str, name: str = "lanner.toml") -> str:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return str(path)
    return write


# ----------------------------------------------------------------------------- defaults

def test_embedded_defaults_are_the_dataclass_defaults():
    c = load_config()
    assert c.path is None
    assert c.server == ServerConfig()
    assert c.default == QueueConfig()
    assert c.cmdlog == CmdlogConfig()
    assert dict(c.queue_overrides) == {} and dict(c.aliases) == {}


def test_default_layout_is_one_serving_worker_per_cpu():
    from lanner.config import default_layout
    assert default_layout(1) == (1, 0) and default_layout(2) == (2, 0) and default_layout(16) == (16, 0)
    assert default_layout(500) == (64, 0)          # one partition per worker at most
    s = ServerConfig()
    assert (s.fronts, s.worker_fronts) == (0, True) and s.workers == default_layout()[0]


def test_defaults_match_the_contract():
    s, q, cl = ServerConfig(), QueueConfig(), CmdlogConfig()
    assert (s.listen_address, s.memcache_port, s.text_port, s.thrift_port, s.admin_port) == \
        ("127.0.0.1", 22133, 2222, 2229, 2223)
    assert (s.queue_path, s.status_file, s.default_status, s.max_open_transactions) == \
        ("data/queues", "data/status", "Up", 1)
    assert (q.max_items, q.max_size, q.default_journal_size, q.max_memory_size, q.max_journal_size) == \
        (2147483647, LONG_MAX, 16 << 20, 128 << 20, 1 << 30)
    assert q.min_journal_compact_delay == 60_000 and q.sync_journal == "never" and q.storage == "journal"
    assert (cl.segment_size, cl.sync, cl.sync_interval, cl.clean_interval) == (64 << 20, "interval", 1000, 300_000)


def test_sample_file_sets_every_key_to_its_default():
    c = load_config(SAMPLE)
    assert c.path == SAMPLE
    # the sample spells out the 2-CPU machine's default worker count (it depends on the CPUs)
    server = dataclasses.replace(c.server, workers=ServerConfig().workers)
    assert (server, c.default, c.cmdlog) == (ServerConfig(), QueueConfig(), CmdlogConfig())
    with open(SAMPLE, "rb") as f:
        doc = tomllib.load(f)
    for table, cls in (("server", ServerConfig), ("default", QueueConfig), ("cmdlog", CmdlogConfig)):
        assert set(doc[table]) == {f.name for f in dataclasses.fields(cls)}, table


def test_contract_example_loads(write):
    text = """
[server]
default_status = "up"
status_change_grace_period = "0s"
expiration_timer_frequency = "off"
[default]
max_size = "8EiB"
[queues."orders"]
max_items = 500
[queues."orders+audit"]
max_age = "1m"
[aliases."everything"]
destinations = ["orders", "logs"]
[cmdlog]
sync_interval = "1s"
clean_interval = "5m"
"""
    c = load_config(write(text))
    assert c.queue_config("orders").max_items == 500
    assert c.queue_config("orders+audit") == dataclasses.replace(QueueConfig(), max_items=500, max_age=60_000)
    assert c.aliases["everything"] == ("orders", "logs")
    assert c.is_alias("everything") and not c.is_alias("orders")


# ----------------------------------------------------------------------------- sizes

@pytest.mark.parametrize("value, expected", [
    (0, 0), (100, 100), ("100", 100), ("0", 0), ("512KiB", 512 << 10), ("16MiB", 16 << 20),
    ("1GiB", 1 << 30), ("1TiB", 1 << 40), ("1KB", 1024), ("1MB", 1 << 20), ("1GB", 1 << 30),
    ("1TB", 1 << 40), ("1.5MiB", 3 << 19), ("0.5KiB", 512), ("2 KiB", 2048), ("1k", 1024),
    ("64mib", 64 << 20), ("10B", 10), ("8EiB", LONG_MAX), ("9EiB", LONG_MAX), (2**70, LONG_MAX),
    ("1.3KiB", 1331),
])
def test_parse_size(value, expected):
    assert parse_size(value, "k") == expected


@pytest.mark.parametrize("value", [-1, "-1KiB", "x", "1XB", "", "1.2.3", "KiB", 1.5, True, None, [1]])
def test_parse_size_rejects(value):
    with pytest.raises(ConfigError) as e:
        parse_size(value, "default.max_size")
    assert e.value.key == "default.max_size"
    assert str(e.value).startswith("default.max_size: ")


# ----------------------------------------------------------------------------- durations

@pytest.mark.parametrize("value, expected", [
    (0, 0), (250, 250), ("250ms", 250), ("1s", 1000), ("5m", 300_000), ("1h", 3_600_000),
    ("1d", 86_400_000), ("off", None), ("OFF", None), ("0s", 0), ("0ms", 0), ("1.5s", 1500),
    ("100", 100), ("2 min", 120_000), ("10 seconds", 10_000), ("1S", 1000),
])
def test_parse_duration(value, expected):
    assert parse_duration(value, "k") == expected


@pytest.mark.parametrize("value", [-5, "-1s", "5x", "", "s", "1w", True, 1.0, None, "on"])
def test_parse_duration_rejects(value):
    with pytest.raises(ConfigError) as e:
        parse_duration(value, "default.max_age")
    assert e.value.key == "default.max_age"


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 10**6), st.sampled_from([("ms", 1), ("s", 1000), ("m", 60_000), ("h", 3_600_000),
                                               ("d", 86_400_000)]))
def test_duration_units_scale(n, unit):
    suffix, mult = unit
    assert parse_duration(f"{n}{suffix}", "k") == n * mult


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**20), st.sampled_from(["KiB", "KB", "MiB", "MB", "GiB", "GB"]))
def test_size_units_are_binary(n, suffix):
    power = {"K": 10, "M": 20, "G": 30}[suffix[0]]
    assert parse_size(f"{n}{suffix}", "k") == min(n << power, LONG_MAX)


# ----------------------------------------------------------------------------- values

def test_value_forms(write):
    c = load_config(write("""
[server]
memcache_port = "off"
text_port = "OFF"
default_status = "readOnly"
status_change_grace_period = "30s"
client_timeout = 1500
connection_limit_refuse_reads = 10
connection_limit_refuse_writes = "off"
log_level = "DEBUG"
[default]
max_age = "1h"
sync_journal = "100ms"
expire_to_queue = "dead"
min_journal_compact_delay = "off"
storage = "CMDLOG"
[cmdlog]
segment_size = 9
sync = "always"
"""))
    s = c.server
    assert (s.memcache_port, s.text_port, s.default_status) == (None, None, "ReadOnly")
    assert (s.status_change_grace_period, s.client_timeout) == (30_000, 1500)
    assert (s.connection_limit_refuse_reads, s.connection_limit_refuse_writes, s.log_level) == (10, None, "debug")
    d = c.default
    assert (d.max_age, d.sync_journal, d.expire_to_queue, d.min_journal_compact_delay, d.storage) == \
        (3_600_000, 100, "dead", None, "cmdlog")
    assert (c.cmdlog.segment_size, c.cmdlog.sync) == (9, "always")


@pytest.mark.parametrize("status, canonical", [
    ("up", "Up"), ("READONLY", "ReadOnly"), ("quiescent", "Quiescent"), ("WriteAvoid", "WriteAvoid"),
    ("writeavoid", "WriteAvoid"),
])
def test_default_status_is_case_insensitive(write, status, canonical):
    assert load_config(write(f'[server]\ndefault_status = "{status}"\n')).server.default_status == canonical


@pytest.mark.parametrize("value, expected", [
    ('"never"', "never"), ('"always"', "always"), ('"Always"', "always"), ("0", "always"),
    ('"0ms"', "always"), ('"0s"', "always"), ("250", 250), ('"1s"', 1000),
])
def test_sync_journal(write, value, expected):
    assert load_config(write(f"[default]\nsync_journal = {value}\n")).default.sync_journal == expected


# ----------------------------------------------------------------------------- errors

BAD = [
    ('[queues."orders"]\nmax_items = "x"', "queues.orders.max_items", "expected an integer, got 'x'"),
    ("[foo]\nx = 1", "foo", "unknown table"),
    ("foo = 1", "foo", "unknown key"),
    ("queues = 3", "queues", "expected a table"),
    ("[server]\nbogus = 1", "server.bogus", "unknown key"),
    ("[default]\nmax_itemz = 1", "default.max_itemz", "unknown key"),
    ("[cmdlog]\nsegment = 1", "cmdlog.segment", "unknown key"),
    ('[queues."q"]\nbogus = 1', "queues.q.bogus", "unknown key"),
    ('[queues."a+b"]\nbogus = 1', 'queues."a+b".bogus', "unknown key"),
    ("[queues.orders.sub]\nmax_items = 1", "queues.orders.sub", "unknown key"),
    ('[aliases."all"]\ndest = ["a"]', "aliases.all.dest", "unknown key"),
    ("[default]\nkeep_journal = 1", "default.keep_journal", "expected true or false"),
    ('[default]\nkeep_journal = "true"', "default.keep_journal", "expected true or false"),
    ("[default]\nmax_items = -1", "default.max_items", "expected an integer from 0 to 2147483647"),
    ("[default]\nmax_items = 2147483648", "default.max_items", "expected an integer from 0"),
    ("[default]\nmax_items = 1.5", "default.max_items", "expected an integer"),
    ("[default]\nmax_items = true", "default.max_items", "expected an integer"),
    ("[default]\nmax_expire_sweep = -3", "default.max_expire_sweep", "expected an integer"),
    ('[default]\nmax_size = "12QB"', "default.max_size", "expected a size"),
    ("[default]\nmax_item_size = -1", "default.max_item_size", "negative"),
    ("[default]\nmax_memory_size = 1.5", "default.max_memory_size", "expected a size"),
    ('[default]\nmax_age = "soon"', "default.max_age", "expected a duration"),
    ("[default]\nmax_age = -1", "default.max_age", "negative"),
    ('[default]\nsync_journal = "sometimes"', "default.sync_journal", 'expected "never", "always" or a period'),
    ('[default]\nsync_journal = "off"', "default.sync_journal", 'expected "never", "always" or a period'),
    ("[default]\nsync_journal = true", "default.sync_journal", 'expected "never", "always" or a period'),
    ("[default]\nsync_journal = -1", "default.sync_journal", 'expected "never", "always" or a period'),
    ('[default]\nstorage = "disk"', "default.storage", "expected one of journal, cmdlog"),
    ('[default]\nexpire_to_queue = "a/b"', "default.expire_to_queue", "illegal characters"),
    ("[default]\nexpire_to_queue = 3", "default.expire_to_queue", "expected a queue name"),
    ('[default]\nexpire_to_queue = ""', "default.expire_to_queue", "empty"),
    # a target with a dot is only legal when that target is kept in a command log
    ('[default]\nexpire_to_queue = "a.b"', "default.expire_to_queue", "illegal characters"),
    ('[queues."q"]\nexpire_to_queue = "dead.letters"', "queues.q.expire_to_queue", "illegal characters"),
    ('[server]\nstatus_change_grace_period = "off"', "server.status_change_grace_period", "not allowed"),
    ('[server]\nexpiration_timer_frequency = "0s"', "server.expiration_timer_frequency", "at least 1ms"),
    ("[server]\nclient_timeout = true", "server.client_timeout", "expected a duration"),
    ("[server]\nmemcache_port = 0", "server.memcache_port", "from 1 to 65535"),
    ("[server]\ntext_port = 65536", "server.text_port", "from 1 to 65535"),
    ('[server]\nthrift_port = "2229"', "server.thrift_port", "expected an integer"),
    ("[server]\nadmin_port = true", "server.admin_port", "expected an integer"),
    ('[server]\ndefault_status = "down"', "server.default_status", "expected one of"),
    ('[server]\ndefault_status = "sideways"', "server.default_status", "expected one of"),
    ("[server]\nworkers = 0", "server.workers", "from 1 to 64"),
    ("[server]\nworkers = 65", "server.workers", "from 1 to 64"),
    ("[server]\nfronts = -1", "server.fronts", "from 0"),
    ("[server]\nfronts = 0\nworker_fronts = false", "server.fronts", "nothing would accept clients"),
    ("[server]\nmax_open_transactions = -1", "server.max_open_transactions", "expected an integer"),
    ("[server]\nconnection_limit_refuse_reads = -1", "server.connection_limit_refuse_reads", "expected"),
    ('[server]\nlog_level = "verbose"', "server.log_level", "debug, info, warning, error"),
    ('[server]\nlisten_address = ""', "server.listen_address", "non-empty"),
    ("[server]\nqueue_path = 5", "server.queue_path", "path"),
    ('[server]\nstatus_file = ""', "server.status_file", "path"),
    ("[cmdlog]\nsegment_size = 8", "cmdlog.segment_size", "larger than 8 bytes"),
    ('[cmdlog]\nsegment_size = "8"', "cmdlog.segment_size", "larger than 8 bytes"),
    ('[cmdlog]\nsync = "never"', "cmdlog.sync", "interval, os, always"),
    ("[cmdlog]\nsync_interval = 0", "cmdlog.sync_interval", "at least 1ms"),
    ('[cmdlog]\nclean_interval = "off"', "cmdlog.clean_interval", "not allowed"),
    ('[queues."a/b"]\nmax_items = 1', 'queues."a/b"', "illegal characters"),
    ('[queues."a.b"]\nmax_items = 1', 'queues."a.b"', "illegal characters"),
    ('[queues."a~b"]\nmax_items = 1', 'queues."a~b"', "illegal characters"),
    ('[queues."a\\\\b"]\nmax_items = 1', 'queues."a\\\\b"', "illegal characters"),
    ('[queues."a\\u0001b"]\nmax_items = 1', 'queues."a\\u0001b"', "illegal characters"),
    ('[queues."a\\nb"]\nmax_items = 1', 'queues."a\\u000ab"', "illegal characters"),
    ('[queues.""]\nmax_items = 1', 'queues.""', "empty"),
    (f'[queues."{"q" * 256}"]\nmax_items = 1', f"queues.{'q' * 256}", "too long"),
    ('[queues."a"]\nmax_items = 1\n[queues."a.b+c"]\nmax_items = 2', 'queues."a.b+c"', "illegal"),
    ("[queues]\norders = 5", "queues.orders", "expected a table"),
    ('[aliases."all"]\ndestinations = "a"', "aliases.all.destinations", "expected a list"),
    ('[aliases."all"]\ndestinations = ["a", 3]', "aliases.all.destinations", "expected a list"),
    ('[aliases."all"]\ndestinations = ["a", "b/c"]', "aliases.all.destinations[1]", "illegal"),
    ('[aliases."all"]\ndestinations = ["a.b"]', "aliases.all.destinations[0]", "illegal"),
    ('[aliases."a.b"]\ndestinations = []', 'aliases."a.b"', "illegal"),
]


@pytest.mark.parametrize("text, key, reason", BAD, ids=[b[1][:40] for b in BAD])
def test_errors_name_the_key_and_the_file(write, text, key, reason):
    path = write(text + "\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    err = e.value
    assert err.key == key
    assert err.file == path
    assert reason in err.reason
    msg = str(err)
    assert msg.startswith(f"{key}: ") and msg.endswith(f"(in {path})")
    assert "\n" not in msg


def test_error_message_example_from_the_brief(write):
    path = write('[queues."orders"]\nmax_items = "x"\n')
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value) == f"queues.orders.max_items: expected an integer, got 'x' (in {path})"


def test_toml_syntax_error_names_file_and_line(write):
    path = write("[server]\nworkers = = 3\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert e.value.file == path and "invalid TOML" in str(e.value) and "line 2" in str(e.value)
    assert "\n" not in str(e.value)


def test_missing_and_non_utf8_files(tmp_path):
    missing = str(tmp_path / "nope.toml")
    with pytest.raises(ConfigError) as e:
        load_config(missing)
    assert e.value.file == missing and "cannot read" in str(e.value)
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"x = \"\xff\"\n")
    with pytest.raises(ConfigError) as e:
        load_config(str(binary))
    assert e.value.file == str(binary)


# ----------------------------------------------------------------------------- queue names

def test_cmdlog_queues_may_have_dots(write):
    c = load_config(write("""
[queues."email.send"]
storage = "cmdlog"
max_items = 7
[queues."email.send+audit"]
max_age = "1s"
[aliases."all"]
destinations = ["email.send", "plain"]
"""))
    assert c.queue_config("email.send").storage == "cmdlog"
    assert c.queue_config("email.send+audit") == dataclasses.replace(
        QueueConfig(), storage="cmdlog", max_items=7, max_age=1000)


def test_default_cmdlog_storage_allows_dots_everywhere(write):
    c = load_config(write('[default]\nstorage = "cmdlog"\n[queues."a.b"]\nmax_items = 1\n'))
    assert c.queue_config("a.b").max_items == 1


def test_expire_to_queue_may_name_a_dotted_cmdlog_queue(write):
    c = load_config(write('[default]\nexpire_to_queue = "dead.letters"\n'
                          '[queues."dead.letters"]\nstorage = "cmdlog"\n'))
    assert c.queue_config("jobs").expire_to_queue == "dead.letters"


def test_a_child_cannot_undo_the_dot_rule_of_a_journal_master(write):
    with pytest.raises(ConfigError) as e:
        load_config(write('[queues."a.b"]\nstorage = "journal"\n[queues."a.b+c"]\nstorage = "cmdlog"\n'))
    assert e.value.key == 'queues."a.b"'


def test_non_ascii_names_are_the_utf8_bytes_read_as_latin1(write):
    c = load_config(write('[queues."café"]\nmax_items = 3\n[aliases."tous"]\ndestinations = ["café"]\n'))
    wire = "café".encode("utf-8").decode("latin-1")
    assert c.queue_config(wire).max_items == 3
    assert c.aliases["tous"] == (wire,)


def test_alias_with_a_queue_name_is_allowed_with_a_warning(write, caplog):
    with caplog.at_level(logging.WARNING, logger="lanner.config"):
        c = load_config(write('[queues."jobs"]\nmax_items = 2\n[aliases."jobs"]\ndestinations = ["a"]\n'))
    assert c.is_alias("jobs") and c.queue_config("jobs").max_items == 2
    assert any("jobs" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)


def test_alias_destinations_default_to_empty(write):
    c = load_config(write('[aliases."void"]\n'))
    assert c.aliases["void"] == () and c.is_alias("void")


# ----------------------------------------------------------------------------- inheritance

HIERARCHY = """
[default]
max_items = 100
max_age = "1m"
max_size = "1MiB"

[queues."jobs"]
max_items = 50
max_size = "2KiB"

[queues."jobs+audit"]
max_age = "30s"
fanout_only = true

[queues."other+child"]
max_items = 7
"""


def test_configuration_hierarchy_default_master_child(write):
    """QueueCollectionSpec's "configuration hierarchy": default -> master -> child."""
    c = load_config(write(HIERARCHY))
    default = c.queue_config("anything")
    assert default is c.default
    assert (default.max_items, default.max_age, default.max_size) == (100, 60_000, 1 << 20)
    jobs = c.queue_config("jobs")
    assert (jobs.max_items, jobs.max_age, jobs.max_size) == (50, 60_000, 2048)
    audit = c.queue_config("jobs+audit")
    assert (audit.max_items, audit.max_age, audit.max_size, audit.fanout_only) == (50, 30_000, 2048, True)
    # A child with no table of its own is exactly its master's config.
    assert c.queue_config("jobs+other") is jobs
    # Only the part before the first "+" names the master.
    assert c.queue_config("jobs+audit+x") is jobs
    # A child of an unconfigured master resolves against default.
    child = c.queue_config("other+child")
    assert (child.max_items, child.max_age, child.max_size) == (7, 60_000, 1 << 20)
    assert c.queue_config("other+else") is c.default
    # Explicit values equal to the default still count as explicit for the child.
    assert dict(c.queue_overrides["jobs"]) == {"max_items": 50, "max_size": 2048}


def test_child_explicit_value_equal_to_default_overrides_master(write):
    c = load_config(write('[queues."a"]\nmax_items = 5\n[queues."a+b"]\nmax_items = 2147483647\n'))
    assert c.queue_config("a+b").max_items == 2147483647


def test_queue_config_is_cached(write):
    c = load_config(write(HIERARCHY))
    assert c.queue_config("jobs+audit") is c.queue_config("jobs+audit")
    assert c.queue_config("jobs") is c.queue_config("jobs")


def test_config_built_from_parts():
    c = Config(queue_overrides={"a": {"max_items": 3}, "a+b": {"max_age": 5}}, aliases={"x": ["a"]})
    assert c.queue_config("a+b") == dataclasses.replace(QueueConfig(), max_items=3, max_age=5)
    assert c.aliases["x"] == ("a",)
    with pytest.raises(TypeError):
        c.queue_overrides["a"] = {}


def test_config_is_immutable_picklable_and_comparable(write):
    c = load_config(write(HIERARCHY))
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.path = "x"
    clone = pickle.loads(pickle.dumps(c))
    assert clone == c and hash(clone) == hash(c)
    assert clone.queue_config("jobs+audit") == c.queue_config("jobs+audit")


# ----------------------------------------------------------------------------- overrides

def test_command_line_overrides_win(write):
    path = write('[server]\nworkers = 4\nqueue_path = "/srv/q"\ntext_port = 1234\n')
    c = load_config(path, {"queue_path": "/tmp/x", "memcache_port": None, "workers": "3",
                           "thrift_port": "off", "admin_port": "8080", "log_level": "WARNING"})
    s = c.server
    assert (s.queue_path, s.memcache_port, s.workers, s.thrift_port, s.admin_port, s.text_port, s.log_level) == \
        ("/tmp/x", None, 3, None, 8080, 1234, "warning")
    assert c.path == path


def test_overrides_without_file():
    c = load_config(None, {"status_file": "/tmp/s", "fronts": 1, "listen_address": "0.0.0.0"})
    assert (c.server.status_file, c.server.fronts, c.server.listen_address) == ("/tmp/s", 1, "0.0.0.0")
    assert c.default == QueueConfig()


@pytest.mark.parametrize("overrides, key", [
    ({"workers": "x"}, "server.workers"), ({"workers": "0"}, "server.workers"),
    ({"memcache_port": "99999"}, "server.memcache_port"), ({"bogus": 1}, "server.bogus"),
    ({"log_level": "loud"}, "server.log_level"), ({"queue_path": None}, "server.queue_path"),
    ({"workers": None}, "server.workers"),
])
def test_bad_overrides(write, overrides, key):
    path = write("[server]\nworkers = 2\n")
    with pytest.raises(ConfigError) as e:
        load_config(path, overrides)
    assert e.value.key == key and e.value.file is None
    assert "command-line" in str(e.value)


# ----------------------------------------------------------------------------- reload

def test_reload_keeps_server_section_and_replaces_the_rest(write):
    path = write('[server]\nworkers = 2\n[queues."a"]\nmax_items = 1\n[aliases."x"]\ndestinations = ["a"]\n')
    old = load_config(path, {"queue_path": "/from/cli"})
    with open(path, "w") as f:
        f.write('[server]\nworkers = 5\nqueue_path = "/elsewhere"\n'
                '[queues."a"]\nmax_items = 9\n[aliases."y"]\ndestinations = ["b"]\n[cmdlog]\nsync = "os"\n')
    new = reload_config(old)
    assert new.server is old.server and new.server.workers == 2 and new.server.queue_path == "/from/cli"
    assert new.queue_config("a").max_items == 9
    assert dict(new.aliases) == {"y": ("b",)}
    assert new.cmdlog.sync == "os"
    assert new.path == path


def reload_error(write, before: str, after: str):
    """Load `before`, rewrite the file as `after` and reload: the path and the pytest.raises
    info of the ConfigError the reload must raise (the reload tests differ only in the files)."""
    path = write(before)
    old = load_config(path)
    with open(path, "w") as f:
        f.write(after)
    with pytest.raises(ConfigError) as e:
        reload_config(old)
    return path, e


def test_reload_errors_name_key_and_file(write):
    path, e = reload_error(write, '[queues."a"]\nmax_items = 1\n', '[queues."a"]\nmax_items = "many"\n')
    assert e.value.key == "queues.a.max_items" and e.value.file == path


def test_reload_validates_the_server_section_too(write):
    _, e = reload_error(write, "[server]\nworkers = 2\n", "[server]\nworkers = 0\n")
    assert e.value.key == "server.workers"


def test_reload_error_brief_names_the_key_but_not_the_file(write):
    path, e = reload_error(write, "[default]\nmax_items = 1\n", "[default]\nmax_itemz = 1\n")
    assert e.value.brief == "default.max_itemz: unknown key"
    assert path in str(e.value)


@pytest.mark.parametrize("make, reason", [
    (os.mkfifo, "not a regular file"),                      # opening it would block forever
    (os.mkdir, "not a regular file"),
    (lambda p: open(p, "wb").write(b"#" * (2 << 20)), "larger than"),
])
def test_a_config_path_that_is_not_a_small_regular_file_is_an_error(tmp_path, make, reason):
    path = str(tmp_path / "lanner.toml")
    make(path)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert reason in e.value.reason and e.value.file == path


def test_reload_of_embedded_defaults():
    old = load_config(None, {"workers": 1})
    new = reload_config(old)
    assert new.server.workers == 1 and new.default == QueueConfig() and new.path is None


# ----------------------------------------------------------------------------- rendering

def test_config_items_for_dump_config():
    items = dict(config_items(dataclasses.replace(QueueConfig(), max_age=1000, keep_journal=False)))
    assert list(items) == [f.name for f in dataclasses.fields(QueueConfig)]
    assert items["max_age"] == "1000" and items["keep_journal"] == "false"
    assert items["max_queue_age"] == "off" and items["sync_journal"] == "never"
    assert items["max_items"] == "2147483647"
