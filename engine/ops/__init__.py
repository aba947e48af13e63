"""Operations: what an operator scrapes, looks at and deploys around the server.

* `latency`: request latency histograms per command family, kept by every
  front in the shared counter block and summed on demand;
* `metrics`: the Prometheus exposition of `/metrics` (prometheus-client), built
  from the same merged figures as `stats`;
* `ostrich`: `/stats.json?period=N` latching and the `/stats.txt` rendering;
* `procs`: CPU and memory of the supervisor and every child process;
* `endpoints`: the admin-port routes that need the above (`/metrics`, `/`,
  `/dashboard.json`, `/stats.txt`, `/stats.json?period=`), and `dashboard.html`;
* `serverset`: ZooKeeper server-set membership following the server status;
* `notify`: the systemd `NOTIFY_SOCKET` datagram;
* `logfile`: `--log-file`, reopened on SIGUSR1 in every process.
"""
