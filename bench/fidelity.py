#!/usr/bin/env python3
"""Probe fidelity: the pg-storage-exporter daemon at default settings but
a 1 s probe interval against fio, interleaved A/B, in one directory.

Each pair runs the exporter with nothing but `--probe.path DIR` and a 1 s
`--probe.interval` (a listen address, and `--collector.probes.split`, which only exposes the commit
probe's write and sync halves as their own series: the sync half is what
fio's sync percentiles compare with) for --daemon-seconds (130: at the
default busy_every of 40 s that is four bursts, at about 3, 43, 83 and
123 s, so 48 busy commit samples, the busy reads of four 8 ms spans
(250-400) and about 130 lone after-idle probes of each kind; with two
bursts the busy figure was two moments of the host, and one burst's
median moved between 91 and 184 us from one burst to the next, every 2 s
for a minute, on a host where fio's back-to-back sync was 111-115 us), reads
pgstorage_probe_window_seconds{op, phase, quantile="0.5"} from /metrics and
stops it (SIGTERM); and runs fio in the same directory:

  sync, back to back     --rw=write --bs=8k --ioengine=sync --fdatasync=1
                         --size=16M --overwrite=1, --fio-seconds (4); its
                         sync percentile 50
  sync, 1 s think time   the same with --thinktime=1s --thinktime_blocks=1,
                         --fio-idle-seconds (25: >= 20 samples)
  read, back to back     --rw=randread --bs=8k --direct=1 --ioengine=io_uring
                         --iodepth=1 --size=64M, total latency p50 (lat_ns
                         percentiles, else clat_ns)
  read, 1 s think time   the same with --thinktime=1s --thinktime_blocks=1
  the exporter's pattern one run of both jobs, each with the 1 s think
                         time, the read job starting 0.5 s after the sync
                         job (fio_pattern): what the exporter's lone probes
                         do, a commit and, half an interval later, a read

fio's back-to-back runs bracket the exporter's run (just before and just
after it; the busy ratio takes the mean of the two), and the think-time
runs come before that in odd pairs and after it in even ones. The ratios:
exporter busy p50 / fio back-to-back p50 and exporter after-idle p50 / fio
doing the exporter's pattern with the think time of the probe interval
(1 s), for op="sync" and op="read", each with min, median and max over the
pairs; and, for comparison, after-idle p50 / fio with the think time and
one operation alone (a whole second of quiet before each operation, where
the exporter's lone operations follow half a second of quiet).

fio's --overwrite=1 for the sync job: the exporter's WAL probe overwrites a
preallocated, zero-written file (like a recycled WAL segment); fio's default
would fallocate() unwritten extents whose first write costs a metadata
journal commit.

bench/run imports this module (run_pairs, summarize, pg_test_fsync,
exporter); run alone it prints its own table.

Usage: bench/fidelity.py [--pairs 5] [--daemon-seconds 130] [--fio-seconds 4]
                         [--fio-idle-seconds 25] [--dir DIR] [--bin PATH]
                         [--pg-test-fsync PG_BIN_DIR]
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def sh(args):
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({r.returncode}):\n{r.stderr}")
    return r.stdout


def exporter(binary, d, seconds, what, engine="auto"):
    """One `check` run, commit probes only (what="sync") or reads only.

    With --no-read the whole duration is commit probes: back to back, then
    (the last seconds) a few lone commits, each after a pause
    (after_idle_commit); commits_per_s is the back-to-back part's rate."""
    args = [binary, "check", d, "--duration", f"{seconds}s", "--format", "json",
            "--engine", engine, "--free-space-reserve", "0"]
    args.append("--no-read" if what == "sync" else "--no-commit")
    j = json.loads(sh(args))
    s = j["sync" if what == "sync" else "read"]
    out = {"p50": s["p50"], "p99": s["p99"], "engine": j["engine"], "n": s["count"]}
    if what == "sync":
        lone = j.get("after_idle_commit") or {}
        busy_s = j["duration_seconds"] - lone.get("count", 0) * j.get("after_idle_pause_seconds", 0)
        out["commits_per_s"] = j["commit"]["count"] / busy_s
        out["commit_p50"] = j["commit"]["p50"]
        out["after_idle_commit_p50"] = lone.get("p50")
        out["after_idle_commits"] = lone.get("count", 0)
        out["after_idle_pause_s"] = j.get("after_idle_pause_seconds")
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


WINDOW = re.compile(r'^pgstorage_probe_window_(seconds|samples)\{([^}]*)\}\s+(\S+)', re.M)


def daemon(binary, d, seconds, logfile=None):
    """The exporter at default settings (only --probe.path d) for `seconds`
    from its start; its window p50 and sample count per (op, phase) at the
    end: {"sync": {"busy": {"p50", "samples"}, "after_idle": {...}}, "read":
    ...}. Always stopped (SIGTERM, then SIGKILL after 20 s) before
    returning or raising."""
    port = free_port()
    lf = open(logfile, "w") if logfile else subprocess.DEVNULL
    # A 1 s interval, the think time fio copies (the default, 2 s, would
    # only halve the after-idle samples).
    p = subprocess.Popen([binary, "--probe.path", d, "--probe.interval", "1s",
                          "--web.listen-address", f"127.0.0.1:{port}",
                          "--collector.probes.split"],
                         stdin=subprocess.DEVNULL, stdout=lf, stderr=lf, start_new_session=True)
    if logfile:
        lf.close()
    t0 = time.monotonic()
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        while True:
            try:
                urllib.request.urlopen(url, timeout=5).read()
                break
            except OSError:
                if p.poll() is not None or time.monotonic() - t0 > 30:
                    raise RuntimeError(f"exporter did not serve {url} (exit {p.poll()})"
                                       + (f"; log {logfile}" if logfile else ""))
                time.sleep(0.1)
        time.sleep(max(0.0, t0 + seconds - time.monotonic()))
        text = urllib.request.urlopen(url, timeout=10).read().decode()
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    out = {op: {ph: {"p50": None, "samples": 0} for ph in ["busy", "after_idle"]}
           for op in ["sync", "read", "commit"]}
    for kind, labels, value in WINDOW.findall(text):
        l = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        op, ph = l.get("op"), l.get("phase")
        if op not in out or ph not in out[op]:
            continue
        if kind == "seconds" and l.get("quantile") == "0.5":
            out[op][ph]["p50"] = float(value)
        elif kind == "samples":
            out[op][ph]["samples"] = int(float(value))
    out["exit"] = p.returncode
    out["seconds"] = time.monotonic() - t0
    return out


# The exporter's two operations as fio jobs, the one statement of them that
# bench/run and bench/read_span use too: an 8 KiB write + fdatasync that
# overwrites a preallocated 16 MiB file (as the commit probe cycles
# through its WAL-sized file), and an 8 KiB O_DIRECT random read of a
# 64 MiB file through io_uring at queue depth 1 (the read probe).
SYNC_JOB = ["--name=sync", "--rw=write", "--ioengine=sync", "--fdatasync=1", "--size=16M", "--overwrite=1"]
READ_JOB = ["--name=read", "--rw=randread", "--direct=1", "--ioengine=io_uring", "--iodepth=1", "--size=64M"]


def fio(d, seconds, what, overwrite=True, thinktime=None):
    """One fio job in d: what="sync" (8 KiB write + fdatasync, its sync
    latency) or "read" (8 KiB O_DIRECT random read, io_uring, QD 1, total
    latency); thinktime (e.g. "1s") between IOs, or back to back."""
    common = ["fio", "--directory", d, "--bs=8k", "--time_based", f"--runtime={seconds}",
              "--output-format=json"]
    if thinktime:
        common += [f"--thinktime={thinktime}", "--thinktime_blocks=1"]
    if what == "sync":
        args = common + [a for a in SYNC_JOB if overwrite or a != "--overwrite=1"]
    else:
        args = common + READ_JOB + ["--lat_percentiles=1"]
    try:
        j = json.loads(sh(args))["jobs"][0]
    finally:
        for f in os.listdir(d):
            if f.startswith(("sync.", "read.")):
                os.unlink(os.path.join(d, f))
    if what == "sync":
        lat = j["sync"]["lat_ns"]
    else:
        lat = j["read"]["lat_ns"] if "percentile" in j["read"].get("lat_ns", {}) else j["read"]["clat_ns"]
    return {"p50": lat["percentile"]["50.000000"] / 1e9,
            "p99": lat["percentile"]["99.000000"] / 1e9,
            "n": lat.get("N", 0),
            "cpu_s": (j["usr_cpu"] + j["sys_cpu"]) / 100 * j["job_runtime"] / 1000}


def fio_pattern(d, seconds, think="1s", offset="500ms"):
    """The exporter's lone probes at its defaults, done by fio: one run of
    two jobs, a sync job (8 KiB write + fdatasync, then `think`) and a read
    job (8 KiB O_DIRECT random read, io_uring, QD 1, then `think`) that
    starts `offset` later. {"sync": ..., "read": ...} as fio() returns.

    Why not fio() with a think time per operation alone: the exporter's
    lone read comes half an interval after its lone commit on the same
    volume, and the next commit half an interval after that read, so each
    follows half a second of quiet on the device and the vCPU, not a whole
    second. A lone IO's cost grows with the pause before it, so fio alone
    with a 1 s think time measures a longer pause than the exporter's
    (both are still reported: the "idle" arms)."""
    args = ["fio", "--directory", d, "--bs=8k", "--time_based", f"--runtime={seconds}",
            "--output-format=json", f"--thinktime={think}", "--thinktime_blocks=1"] + SYNC_JOB \
        + READ_JOB + ["--lat_percentiles=1", f"--startdelay={offset}"]
    try:
        jobs = {j["jobname"]: j for j in json.loads(sh(args))["jobs"]}
    finally:
        for f in os.listdir(d):
            if f.startswith(("sync.", "read.")):
                os.unlink(os.path.join(d, f))
    out = {}
    for what in ["sync", "read"]:
        j = jobs[what]
        lat = j[what]["lat_ns"] if "percentile" in j[what].get("lat_ns", {}) else j[what]["clat_ns"]
        out[what] = {"p50": lat["percentile"]["50.000000"] / 1e9,
                     "p99": lat["percentile"]["99.000000"] / 1e9,
                     "n": lat.get("N", 0)}
    return out


# (exporter op, exporter phase, fio arm) of each ratio: busy against fio
# back to back, after idle against fio doing the exporter's pattern of lone
# operations (fio_pattern).
RATIOS = [("sync", "busy", ("sync", "b2b")), ("sync", "after_idle", ("sync", "pattern")),
          ("read", "busy", ("read", "b2b")), ("read", "after_idle", ("read", "pattern"))]
# After idle against fio with the think time and one operation alone: a
# whole second of quiet before each operation (reported, not a goal).
ALONE = [("sync", "after_idle", ("sync", "idle")), ("read", "after_idle", ("read", "idle"))]


def run_pairs(binary, d, pairs, daemon_seconds=130, fio_seconds=4, fio_idle_seconds=25,
              think="1s", logdir=None):
    """Interleaved pairs. Each pair brackets the exporter's run with fio's
    back-to-back runs (sync and read just before it and just after it) and
    runs fio's think-time arms (sync alone, read alone, both in the
    exporter's pattern) before that in odd pairs and after it in even ones.

    Why bracket: the busy figure comes from two bursts of a few
    milliseconds (at about 3 s and 43 s of a 50 s run at the default
    busy_every),
    and fio's back-to-back p50 on this VM drifts by 10-20 % from one minute
    to the next. Compared with one fio run a minute or two away, a pair's
    ratio was mostly that drift: 0.89-1.16 over pairs whose exporter had
    120 busy samples each. The fio side of the busy ratio is the mean of
    the runs just before and just after.

    Returns [{"daemon": daemon(...), "fio": {"sync b2b": ..., "sync b2b
    before": ..., "sync b2b after": ..., "read b2b"...: ..., "sync idle":
    ..., "read idle": ..., "sync pattern": ..., "read pattern": ...},
    "order": "df"|"fd"}]; "<what> b2b" holds the mean p50 and p99 of the
    two runs and their summed operations."""
    def b2b(got, when):
        for what in ["sync", "read"]:
            got["fio"][f"{what} b2b {when}"] = fio(d, fio_seconds, what)

    def think_arms(got):
        for what in ["sync", "read"]:
            got["fio"][f"{what} idle"] = fio(d, fio_idle_seconds, what, thinktime=think)
        for what, r in fio_pattern(d, fio_idle_seconds, think).items():
            got["fio"][f"{what} pattern"] = r

    rows = []
    for i in range(pairs):
        order = "df" if i % 2 == 0 else "fd"
        got = {"order": order, "fio": {}}
        if order == "fd":
            think_arms(got)
        b2b(got, "before")
        lf = os.path.join(logdir, f"exporter-fidelity-{i + 1}.log") if logdir else None
        got["daemon"] = daemon(binary, d, daemon_seconds, lf)
        b2b(got, "after")
        if order == "df":
            think_arms(got)
        for what in ["sync", "read"]:
            a, b = got["fio"][f"{what} b2b before"], got["fio"][f"{what} b2b after"]
            got["fio"][f"{what} b2b"] = {"p50": (a["p50"] + b["p50"]) / 2,
                                         "p99": (a["p99"] + b["p99"]) / 2, "n": a["n"] + b["n"]}
        e, f = got["daemon"], got["fio"]
        parts = []
        for op, ph, (what, kind) in RATIOS + ALONE:
            x, y = e[op][ph]["p50"], f[f"{what} {kind}"]["p50"]
            extra = ""
            if kind == "b2b":
                extra = (f" [{f[f'{what} b2b before']['p50'] * 1e6:.1f} before, "
                         f"{f[f'{what} b2b after']['p50'] * 1e6:.1f} after]")
            parts.append(f"{op} {ph} {x * 1e6 if x else float('nan'):.1f} us ({e[op][ph]['samples']})"
                         f" / fio {kind} {y * 1e6:.1f} us{extra} ({f[f'{what} {kind}']['n']})"
                         f" = {x / y if x else float('nan'):.3f}")
        log(f"  pair {i + 1} (order {order}): " + "; ".join(parts))
        rows.append(got)
    return rows


def summary(ratios):
    return (min(ratios), statistics.median(ratios), max(ratios))


def summarize(rows, ratios=RATIOS):
    """{(op, phase): {exporter, fio (medians of the p50s), min, median, max
    (of the per-pair ratios), pairs, samples (median exporter window
    samples), fio_n (median fio samples), fio_arm}}. A pair whose exporter
    published no such p50 is left out of that ratio (pairs says how many
    counted)."""
    out = {}
    for op, ph, (what, kind) in ratios:
        arm = f"{what} {kind}"
        got = [(r["daemon"][op][ph], r["fio"][arm]) for r in rows if r["daemon"][op][ph]["p50"]]
        if not got:
            out[(op, ph)] = None
            continue
        lo, med, hi = summary([e["p50"] / f["p50"] for e, f in got])
        out[(op, ph)] = {
            "exporter": statistics.median(e["p50"] for e, _ in got),
            "fio": statistics.median(f["p50"] for _, f in got),
            "min": lo, "median": med, "max": hi, "pairs": len(got),
            "samples": statistics.median(e["samples"] for e, _ in got),
            "fio_n": statistics.median(f["n"] for _, f in got), "fio_arm": arm,
        }
    return out


def pg_test_fsync(bin_dir, path, seconds=2, env=None):
    """fdatasync ops/s of pg_test_fsync's "one 8kB write" comparison.

    Runs `pg_test_fsync -f PATH -s SECONDS` and stops it (SIGTERM; it
    removes its file on that signal) once that line is printed, so the
    other ~15 comparisons, which nothing here uses, do not take half a
    minute. Returns (ops_per_s, usecs_per_op, the output lines read)."""
    cmd = ["stdbuf", "-oL", os.path.join(bin_dir, "pg_test_fsync"), "-f", path, "-s", str(seconds)]
    if not shutil.which("stdbuf"):
        cmd = cmd[2:]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=env)
    lines, section, result = [], None, None
    try:
        for line in p.stdout:
            lines.append(line.rstrip())
            if line.startswith("Compare file sync methods using"):
                section = line
            m = re.match(r"\s+fdatasync\s+([\d.]+) ops/sec\s+(\d+) usecs/op", line)
            if m and section and "one 8kB write" in section:
                result = (float(m.group(1)), float(m.group(2)))
                break
    finally:
        if p.poll() is None:
            p.terminate()
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    if result is None:
        raise RuntimeError("pg_test_fsync printed no fdatasync line:\n" + "\n".join(lines))
    return result[0], result[1], lines


def _on_signal(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--daemon-seconds", type=int, default=130)
    ap.add_argument("--fio-seconds", type=int, default=4)
    ap.add_argument("--fio-idle-seconds", type=int, default=25)
    ap.add_argument("--dir")
    ap.add_argument("--bin", default="target/release/pg-storage-exporter")
    ap.add_argument("--pg-test-fsync", metavar="PG_BIN_DIR",
                    help="also run pg_test_fsync from this bin dir")
    a = ap.parse_args()
    if not shutil.which("fio"):
        sys.exit("fio not found: apt-get install fio")
    for sig in ["SIGTERM", "SIGHUP"]:
        signal.signal(getattr(signal, sig), _on_signal)
    d = a.dir or tempfile.mkdtemp(prefix="pgse-fidelity-", dir="/var/tmp")
    try:
        rows = run_pairs(os.path.abspath(a.bin), d, a.pairs, a.daemon_seconds, a.fio_seconds,
                         a.fio_idle_seconds)
        tf = None
        if a.pg_test_fsync:
            before = exporter(a.bin, d, 4, "sync")
            ops, _, _ = pg_test_fsync(a.pg_test_fsync, os.path.join(d, "pg_test_fsync.out"))
            after = exporter(a.bin, d, 4, "sync")
            tf = (ops, (before["commits_per_s"] + after["commits_per_s"]) / 2)
    finally:
        if not a.dir:
            shutil.rmtree(d, ignore_errors=True)

    print(f"\nfidelity: {a.pairs} interleaved pairs (exporter at defaults for {a.daemon_seconds} s; "
          f"fio {a.fio_seconds} s back to back, {a.fio_idle_seconds} s with 1 s think time) in {d}")
    print(f"{'exporter p50 / fio p50':<40}{'exporter med':>14}{'fio med':>12}{'ratio min':>11}"
          f"{'median':>9}{'max':>8}")
    both = [(k, "back to back" if k[1] == "busy" else "1 s think, pattern", v)
            for k, v in summarize(rows).items()]
    both += [(k, "1 s think, alone", v) for k, v in summarize(rows, ALONE).items()]
    for (op, ph), ref, s in both:
        name = f"{op} {ph} / fio {ref}"
        if s is None:
            print(f"{name:<40}  (no exporter figure)")
            continue
        print(f"{name:<40}{s['exporter']*1e6:>11.1f} us{s['fio']*1e6:>9.1f} us"
              f"{s['min']:>11.3f}{s['median']:>9.3f}{s['max']:>8.3f}")
    if tf:
        print(f"{'check commits/s vs pg_test_fsync':<40}{tf[1]:>11.0f} /s{tf[0]:>9.0f} /s{'':>11}"
              f"{tf[1]/tf[0]:>9.3f}")


if __name__ == "__main__":
    main()
