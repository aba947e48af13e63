"""`GET /metrics`: the Prometheus text exposition, written by prometheus-client.

The figures are exactly those of the memcache `stats` command: the front
gathers every worker's part with the same `stats_slot` and merges them with
the same `Front.global_stats`, then `render` turns the merged lists into metric
families.  Nothing is registered globally: each scrape builds a throw-away
`CollectorRegistry` around one collector over that snapshot, and
`generate_latest` writes it.

Names (each becomes `lanner_...`):

* a global stat `<s>` is a gauge `lanner_<s>`; a counter stat (reference §4.3, and
  protocols.admin.GLOBAL_COUNTERS: the same in /stats.json) is `lanner_<s>_total`, with a
  leading `total_` moved to the end (`total_items` -> `lanner_items_total`, `total_connections` ->
  `lanner_connections_total`); `uptime` and `time` carry `_seconds`;
  `version` is the label of `lanner_build_info`;
* a queue stat the same way as `lanner_queue_<s>{queue="<name>"}`
  (`lanner_queue_items`, `lanner_queue_items_total`,
  `lanner_queue_flushes_total`, `lanner_queue_age_milliseconds`,
  `lanner_queue_logsize_bytes`); an alias's `put_items`/`put_bytes` are
  `lanner_alias_put_items_total{alias=...}`/`lanner_alias_put_bytes_total`;
* `lanner_server_status{status=...}` is 1 for the reported status, 0 for the
  others, and `lanner_server_enforced_status{status=...}` likewise for the
  status in force (they differ during a grace period);
* `lanner_request_latency_seconds{family=...}`: histogram per command family
  (latency.py), summed over fronts; a family appears once it has been used;
* `lanner_process_cpu_seconds_total{process=...,pid=...}`,
  `lanner_process_resident_memory_bytes`, `lanner_process_open_fds`,
  `lanner_process_threads` per process (procs.py).
"""
from __future__ import annotations

from prometheus_client.core import (CollectorRegistry, CounterMetricFamily, GaugeMetricFamily,
                                    HistogramMetricFamily, InfoMetricFamily)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from lanner.protocols.admin import GLOBAL_COUNTERS, QUEUE_COUNTERS, stat_number

from . import latency

__all__ = ["CONTENT_TYPE", "render", "metric_name"]

CONTENT_TYPE = CONTENT_TYPE_LATEST

_UNITS = {"uptime": "uptime_seconds", "time": "time_seconds", "age": "age_milliseconds",
          "logsize": "logsize_bytes"}
STATUSES = ("Up", "WriteAvoid", "ReadOnly", "Quiescent", "Down")

_HELP_GLOBAL = "Lanner stat '%s' (memcache `stats`), summed over workers and fronts"
_HELP_QUEUE = "Lanner per-queue stat '%s' (memcache `stats` queue_<name>_%s)"


def metric_name(stat: str, counter: bool) -> str:
    """Metric base name (without `lanner_`) of a stat; counters end in `_total` once
    prometheus-client adds it."""
    if counter:
        return stat[len("total_"):] if stat.startswith("total_") else stat
    return _UNITS.get(stat, stat)


class _Snapshot:
    """A collector over one merged stats snapshot."""

    def __init__(self, global_stats, queues, status, lat, procs):
        self.global_stats = global_stats
        self.queues = queues
        self.status = status
        self.lat = lat
        self.procs = procs

    def collect(self):
        version = None
        for k, v in self.global_stats:
            if k == "version":
                version = str(v)
                continue
            n = stat_number(v)
            if n is None:
                continue
            if k in GLOBAL_COUNTERS:
                m = CounterMetricFamily("lanner_" + metric_name(k, True), _HELP_GLOBAL % k, value=n)
            else:
                m = GaugeMetricFamily("lanner_" + metric_name(k, False), _HELP_GLOBAL % k, value=n)
            yield m
        if version is not None:
            yield InfoMetricFamily("lanner_build", "Lanner build", value={"version": version})
        if self.status is not None:
            reported, enforced = self.status
            for name, current in (("lanner_server_status", reported),
                                  ("lanner_server_enforced_status", enforced)):
                g = GaugeMetricFamily(name, "1 for the server status %s, 0 for the others" % (
                    "reported by `status`" if name.endswith("_status") and "enforced" not in name
                    else "in force (differs during a grace period)"), labels=["status"])
                for s in STATUSES:
                    g.add_metric([s], 1 if s == current else 0)
                yield g
        yield from self._queues()
        yield from self._latency()
        yield from self._procs()

    def _queues(self):
        families: dict[str, object] = {}
        alias_items = CounterMetricFamily("lanner_alias_put_items", "Items put through an alias",
                                          labels=["alias"])
        alias_bytes = CounterMetricFamily("lanner_alias_put_bytes", "Bytes put through an alias",
                                          labels=["alias"])
        for qname, stats in self.queues:
            if stats is None:
                continue
            first = stats[0][0] if stats else None
            if first == "put_items":             # an alias
                d = dict(stats)
                alias_items.add_metric([qname], stat_number(d.get("put_items")) or 0)
                alias_bytes.add_metric([qname], stat_number(d.get("put_bytes")) or 0)
                continue
            for k, v in stats:
                n = stat_number(v)
                if n is None:
                    continue
                m = families.get(k)
                if m is None:
                    counter = k in QUEUE_COUNTERS
                    cls = CounterMetricFamily if counter else GaugeMetricFamily
                    m = families[k] = cls("lanner_queue_" + metric_name(k, counter),
                                          _HELP_QUEUE % (k, k), labels=["queue"])
                m.add_metric([qname], n)
        yield from families.values()
        if alias_items.samples:
            yield alias_items
            yield alias_bytes

    def _latency(self):
        if not self.lat:
            return
        h = HistogramMetricFamily("lanner_request_latency",
                                  "Seconds from a request's bytes read to its reply queued, "
                                  "per command family", labels=["family"], unit="seconds")
        les = [repr(b) for b in latency.BOUNDS] + ["+Inf"]
        for fam, (buckets, sum_us) in self.lat.items():
            if not any(buckets):
                continue                 # a family appears once it has been used
            cum = latency.cumulative(buckets)
            h.add_metric([fam], list(zip(les, cum)), sum_us / 1e6)
        yield h

    def _procs(self):
        if not self.procs:
            return
        cpu = CounterMetricFamily("lanner_process_cpu_seconds", "User and system CPU seconds per process",
                                  labels=["process", "pid"])
        rss = GaugeMetricFamily("lanner_process_resident_memory_bytes", "Resident set size per process",
                                labels=["process", "pid"])
        fds = GaugeMetricFamily("lanner_process_open_fds", "Open file descriptors per process",
                                labels=["process", "pid"])
        thr = GaugeMetricFamily("lanner_process_threads", "Threads per process",
                                labels=["process", "pid"])
        for p in self.procs:
            lab = [p["name"], str(p["pid"])]
            cpu.add_metric(lab, p["cpu_seconds"])
            rss.add_metric(lab, p["rss_bytes"])
            fds.add_metric(lab, p["open_fds"])
            thr.add_metric(lab, p["threads"])
        yield from (cpu, rss, fds, thr)


def render(global_stats, queues, status=None, lat=None, procs=None) -> bytes:
    """The exposition body.  `global_stats` and `queues` are what `stats_slot` hands
    its formatter ([(key, value)] and {name: [(key, value)]} or a list of pairs),
    `status` is (reported, enforced), `lat` is latency.read(), `procs` procs.snapshot()."""
    items = list(queues.items()) if isinstance(queues, dict) else list(queues)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Snapshot(global_stats, items, status, lat, procs))
    return generate_latest(reg)
