"""drop_probe: what the c=100 -> c=1000 drop of `mixed` (1 KiB, closed loop) is made of.

`python -m lanner.perf.drop_probe ROUNDS DURATION TAG` starts one `lanner serve` (default layout,
this interpreter's lanner; memcache port $PORT, default 24101, admin $PORT+1) and runs
c=100 then c=1000 ROUNDS times, as `compare mixed -i 1024 -c 100,1000` does on its Lanner side
(a flush, 512 items put first, then DURATION seconds at gets:sets 1:1).  Per level it prints one
JSON line: the rate, the loadgen's 250-ms progress (`rates_250ms`: is the start slower?), the
handoffs and routed requests in the level (`stats`), and per server process its CPU (user and
system), CPU per request, voluntary and involuntary context switches, sockets held at mid-run
and the cores its threads were seen running on; also how often the queue's worker and the load
generator were seen running on the same core (`w0_lg_running`).  perf/README.md, stop 22.
"""
import json, os, socket, subprocess, sys, threading, time, tempfile

from lanner.perf.loadgen import ensure_built

BIN = None          # the load generator, built by main()
PORT = int(os.environ.get('PORT', 24101)); ADMIN = PORT + 1
HZ = os.sysconf('SC_CLK_TCK')

def children(pid):
    out = [pid]
    try:
        for t in os.listdir(f'/proc/{pid}/task'):
            with open(f'/proc/{pid}/task/{t}/children') as f:
                for c in f.read().split():
                    out += children(int(c))
    except OSError:
        pass
    return out

def stat(pid):
    with open(f'/proc/{pid}/stat') as f:
        s = f.read()
    r = s.rsplit(')', 1)[1].split()
    # r[0] = state (field 3); utime field 14 -> r[11]; stime r[12]; processor field 39 -> r[36]
    return r[0], int(r[11]) + int(r[12]), int(r[36])

def ustime(pid):
    with open(f'/proc/{pid}/stat') as f:
        r = f.read().rsplit(')', 1)[1].split()
    return int(r[11]), int(r[12])

def threads_stat(pid):
    """per-thread (state, cpu) of a process"""
    out = {}
    for t in os.listdir(f'/proc/{pid}/task'):
        try:
            with open(f'/proc/{pid}/task/{t}/stat') as f:
                s = f.read()
            r = s.rsplit(')', 1)[1].split()
            out[int(t)] = (r[0], int(r[11]) + int(r[12]), int(r[36]))
        except OSError:
            pass
    return out

def ctxt(pid):
    v = n = 0
    for t in os.listdir(f'/proc/{pid}/task'):
        try:
            for line in open(f'/proc/{pid}/task/{t}/status'):
                if line.startswith('voluntary_ctxt_switches'): v += int(line.split()[1])
                elif line.startswith('nonvoluntary_ctxt_switches'): n += int(line.split()[1])
        except OSError:
            pass
    return v, n

def comm(pid):
    try:
        return open(f'/proc/{pid}/comm').read().strip() + ('' if pid != ROOT[0] else '-sup')
    except OSError:
        return '?'
ROOT = [0]

def nsocks(pid):
    n = 0
    for fd in os.listdir(f'/proc/{pid}/fd'):
        try:
            if os.readlink(f'/proc/{pid}/fd/{fd}').startswith('socket:'): n += 1
        except OSError:
            pass
    return n

def mc(cmd):
    s = socket.create_connection(('127.0.0.1', PORT)); s.sendall(cmd)
    buf = b''
    while not (buf.endswith(b'END\r\n') or buf.endswith(b'\r\n') and cmd.startswith(b'flush')):
        d = s.recv(65536)
        if not d: break
        buf += d
    s.close(); return buf

def stats():
    out = {}
    for line in mc(b'stats\r\n').decode().splitlines():
        p = line.split()
        if len(p) == 3 and p[0] == 'STAT': out[p[1]] = p[2]
    return out

def run_level(root, conns, dur):
    mc(b'flush db_bench\r\n')
    subprocess.run([BIN, '--host', '127.0.0.1', '--port', str(PORT), '--depth', '32', '--value-size', '1024',
                    '--queue', 'db_bench', '--queues', '1', '--producers', '1', '--sets', '512'], capture_output=True, check=True)
    st0 = stats()
    pids = [p for p in children(root)]
    names = {p: comm(p) for p in pids}
    cpu0 = {p: stat(p)[1] for p in pids}; us0 = {p: ustime(p) for p in pids}; cs0 = {p: ctxt(p) for p in pids}
    lg = subprocess.Popen([BIN, '--host', '127.0.0.1', '--port', str(PORT), '--depth', '1', '--value-size', '1024',
                           '--queue', 'db_bench', '--queues', '1', '--conns', str(conns), '--get-ratio', '0.5',
                           '--duration', str(dur), '--progress'], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    place = {p: {} for p in pids + [lg.pid]}
    socks = {}
    stop = threading.Event()
    def sampler():
        t0 = time.monotonic(); got_socks = False
        while not stop.is_set():
            for p in pids + [lg.pid]:
                try:
                    for tid, (s, _, cpu) in threads_stat(p).items():
                        if s == 'R':
                            place[p][cpu] = place[p].get(cpu, 0) + 1
                except OSError:
                    pass
            if not got_socks and time.monotonic() - t0 > dur / 2:
                for p in pids:
                    try: socks[p] = nsocks(p)
                    except OSError: pass
                got_socks = True
            time.sleep(0.02)
    w0 = [p for p in pids if names[p] == 'lanner-w0'][0]
    both = {'same': 0, 'diff': 0}
    def cosampler():
        while not stop.is_set():
            try:
                a = stat(w0); b = stat(lg.pid)
                if a[0] == 'R' and b[0] == 'R':
                    both['same' if a[2] == b[2] else 'diff'] += 1
            except OSError:
                pass
            time.sleep(0.01)
    th2 = threading.Thread(target=cosampler); th2.start()
    th = threading.Thread(target=sampler); th.start()
    out, err = lg.communicate()
    stop.set(); th.join(); th2.join()
    cpu1 = {p: stat(p)[1] for p in pids}; us1 = {p: ustime(p) for p in pids}; cs1 = {p: ctxt(p) for p in pids}
    res = json.loads(out)
    st1 = stats()
    prog = [int(l.split()[1]) for l in err.splitlines() if l.startswith('progress')]
    rates = [(b - a) * 4 for a, b in zip([0] + prog, prog)]
    ops = res['ops']
    rep = {'conns': conns, 'ops_s': res['ops_per_s'], 'errors': res.get('errors'),
           'handoffs': int(st1['handoffs']) - int(st0['handoffs']),
           'routed': int(st1['routed_requests']) - int(st0['routed_requests']),
           'rates_250ms': rates, 'w0_lg_running': both, 'load': os.getloadavg()[0],
           'procs': {}}
    for p in pids:
        d = (cpu1[p] - cpu0[p]) / HZ
        rep['procs'][names[p]] = {'cpu_s': round(d, 2), 'us_op': round(d * 1e6 / ops, 2) if ops else None,
                                   'vcs': cs1[p][0] - cs0[p][0], 'nvcs': cs1[p][1] - cs0[p][1],
                                   'socks': socks.get(p), 'run_on': place[p],
                                   'user_s': (us1[p][0] - us0[p][0]) / HZ, 'sys_s': (us1[p][1] - us0[p][1]) / HZ}
    rep['loadgen_run_on'] = place[lg.pid]
    rep['loadgen_rusage'] = {k: res[k] for k in res if 'cpu' in k or 'rusage' in k}
    return rep

def main():
    global BIN
    BIN = ensure_built()
    rounds = int(sys.argv[1]); dur = float(sys.argv[2]); tag = sys.argv[3]
    work = tempfile.mkdtemp(prefix='conns-modes-')
    env = dict(os.environ)
    srv = subprocess.Popen([sys.executable, '-m', 'lanner.cli', 'serve', '--queue-path', work + '/q', '--status-file', work + '/status',
                            '--listen', '127.0.0.1', '--memcache-port', str(PORT), '--text-port', 'off',
                            '--admin-port', str(ADMIN), '--thrift-port', 'off'], stdout=subprocess.PIPE,
                           stderr=open(work + '/log', 'wb'), env=env)
    while b'ready' not in srv.stdout.readline():
        pass
    threading.Thread(target=lambda: srv.stdout.read(), daemon=True).start()
    ROOT[0] = srv.pid
    try:
        # names of processes
        for p in children(srv.pid):
            print(p, comm(p), open(f'/proc/{p}/comm').read().strip(), file=sys.stderr)
        results = []
        for r in range(rounds):
            for c in (100, 1000):
                rep = run_level(srv.pid, c, dur)
                rep['round'] = r; results.append(rep)
                print(json.dumps(rep), flush=True)
            a, b = results[-2]['ops_s'], results[-1]['ops_s']
            print(f'# {tag} round {r}: c=100 {a:.0f} c=1000 {b:.0f} drop {100*(1-b/a):.1f} % load {os.getloadavg()[0]:.2f}', flush=True)
    finally:
        srv.terminate(); srv.wait(30)

if __name__ == "__main__":
    main()
