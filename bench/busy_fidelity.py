#!/usr/bin/env python3
"""bench/busy_fidelity.py: the daemon at default settings against fio, busy
and after idle, in interleaved pairs (the acceptance measurement of the busy
and after-idle probes in short; BENCHMARKS.md, "Other benchmarks").

Run as root from anywhere, after `cargo build --release`:

    bench/busy_fidelity.py [PAIRS]        # default 5; about 2 minutes a pair

Per pair, in one directory (/var/tmp/fid), order alternating: the exporter
with only --probe.path and a 1 s --probe.interval for 65 s (two bursts: 24 busy commit samples and
the reads of two 8 ms spans, about 150; about 60 lone ones), its window p50s read from /metrics; then
fio: write + fdatasync back to back (4 s, sync p50) and with --thinktime=1s
(25 s), 8 KiB O_DIRECT random reads with io_uring at QD 1 back to back (4 s)
and with --thinktime=1s (25 s), total-latency p50s. Prints each pair and the
min / median / max of the four ratios.
"""
import json, subprocess, time, os, signal, statistics, urllib.request, sys
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
B = os.path.join(REPO, "target/release/pg-storage-exporter"); D = "/var/tmp/fid"; PORT = 19901
os.makedirs(D, exist_ok=True)
def fio(args, secs):
    out=subprocess.run(["fio","--name=j","--directory="+D,"--output-format=json","--runtime=%d"%secs,"--time_based"]+args,capture_output=True,text=True).stdout
    j=json.loads(out)["jobs"][0]; return j
def p50(lat): return lat["percentile"]["50.000000"]/1e3
def daemon(secs):
    p=subprocess.Popen([B,"--probe.path",D,"--probe.interval","1s","--web.listen-address","127.0.0.1:%d"%PORT,"--collector.probes.split"],stdout=subprocess.DEVNULL,stderr=subprocess.DEVNULL)
    time.sleep(secs)
    m=urllib.request.urlopen("http://127.0.0.1:%d/metrics"%PORT).read().decode()
    p.send_signal(signal.SIGTERM); p.wait()
    r={}
    for l in m.splitlines():
        if l.startswith("pgstorage_probe_window_seconds{") and 'quantile="0.5"' in l:
            op=l.split('op="')[1].split('"')[0]; ph=l.split('phase="')[1].split('"')[0]
            r[(op,ph)]=float(l.split()[-1])*1e6
    return r
res=[]
for i in range(int(sys.argv[1]) if len(sys.argv) > 1 else 5):
    def f():
        return dict(sbb=p50(fio(["--rw=write","--bs=8k","--ioengine=sync","--fdatasync=1","--size=16M","--overwrite=1"],4)["sync"]["lat_ns"]),
          stt=p50(fio(["--rw=write","--bs=8k","--ioengine=sync","--fdatasync=1","--size=16M","--overwrite=1","--thinktime=1s","--thinktime_blocks=1"],25)["sync"]["lat_ns"]),
          rbb=p50(fio(["--rw=randread","--bs=8k","--direct=1","--ioengine=io_uring","--iodepth=1","--size=64M","--lat_percentiles=1"],4)["read"]["lat_ns"]),
          rtt=p50(fio(["--rw=randread","--bs=8k","--direct=1","--ioengine=io_uring","--iodepth=1","--size=64M","--lat_percentiles=1","--thinktime=1s","--thinktime_blocks=1"],25)["read"]["lat_ns"]))
    if i%2==0: d=daemon(65); fr=f()
    else: fr=f(); d=daemon(65)
    row=dict(fr, dsb=d.get(("sync","busy")), dsa=d.get(("sync","after_idle")), drb=d.get(("read","busy")), dra=d.get(("read","after_idle")))
    row["r_sync_busy"]=row["dsb"]/row["sbb"]; row["r_sync_idle"]=row["dsa"]/row["stt"]; row["r_read_busy"]=row["drb"]/row["rbb"]; row["r_read_idle"]=row["dra"]/row["rtt"]
    print(i, {k:round(v,3) for k,v in row.items()}, flush=True); res.append(row)
for k in ["r_sync_busy","r_sync_idle","r_read_busy","r_read_idle"]:
    v=[r[k] for r in res]; print(k, "min %.3f median %.3f max %.3f"%(min(v),statistics.median(v),max(v)))

# fio leaves its job files; the exporter removed its own at SIGTERM.
import shutil
shutil.rmtree(D, ignore_errors=True)
