#!/usr/bin/env python3
"""Probe fidelity: pg-storage-exporter `check` against fio, interleaved A/B.

Runs N pairs in one directory, alternating which tool goes first, and
prints p50/p99 of the 8 KiB write+fdatasync sync latency and of the 8 KiB
O_DIRECT random read (QD 1, total latency), each as exporter/fio ratios
with min, median and max. Also compares the io_uring and syscall engines.

fio is run the way the acceptance criteria state, plus --overwrite=1 for the
sync job: the exporter's WAL probe overwrites a preallocated, zero-written
file (like a recycled WAL segment), and fio's default would instead
fallocate() unwritten extents whose first write costs a metadata journal
commit. Both fio variants are shown.

Usage: bench/fidelity.py [--pairs 5] [--seconds 10] [--dir DIR] [--bin PATH]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile


def sh(args):
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(args)} failed ({r.returncode}):\n{r.stderr}")
    return r.stdout


def exporter(binary, d, seconds, what, engine="auto"):
    args = [binary, "check", d, "--duration", f"{seconds}s", "--format", "json",
            "--engine", engine, "--free-space-reserve", "0"]
    args.append("--no-read" if what == "sync" else "--no-commit")
    j = json.loads(sh(args))
    s = j["sync" if what == "sync" else "read"]
    return {"p50": s["p50"], "p99": s["p99"], "engine": j["engine"], "n": s["count"]}


def fio(d, seconds, what, overwrite=True):
    common = ["fio", "--directory", d, "--bs=8k", "--time_based", f"--runtime={seconds}",
              "--output-format=json"]
    if what == "sync":
        args = common + ["--name=sync", "--rw=write", "--ioengine=sync", "--fdatasync=1",
                         "--size=16M"] + (["--overwrite=1"] if overwrite else [])
    else:
        args = common + ["--name=read", "--rw=randread", "--direct=1", "--ioengine=io_uring",
                         "--iodepth=1", "--size=64M", "--lat_percentiles=1"]
    j = json.loads(sh(args))["jobs"][0]
    lat = j["sync"]["lat_ns"] if what == "sync" else j["read"]["lat_ns"]
    for f in os.listdir(d):
        if f.startswith(("sync.", "read.")):
            os.unlink(os.path.join(d, f))
    return {"p50": lat["percentile"]["50.000000"] / 1e9,
            "p99": lat["percentile"]["99.000000"] / 1e9,
            "n": lat.get("N", 0)}


def summary(ratios):
    return (min(ratios), statistics.median(ratios), max(ratios))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--dir")
    ap.add_argument("--bin", default="target/release/pg-storage-exporter")
    a = ap.parse_args()
    if not shutil.which("fio"):
        sys.exit("fio not found: apt-get install fio")
    d = a.dir or tempfile.mkdtemp(prefix="pgse-fidelity-", dir="/var/tmp")
    rows = {k: [] for k in ["sync", "read", "sync_fio_default"]}
    raw = []
    for i in range(a.pairs):
        first_exporter = i % 2 == 0
        for what in ["sync", "read"]:
            if first_exporter:
                e = exporter(a.bin, d, a.seconds, what)
                f = fio(d, a.seconds, what)
            else:
                f = fio(d, a.seconds, what)
                e = exporter(a.bin, d, a.seconds, what)
            rows[what].append((e, f))
            raw.append((i, what, e, f))
            print(f"pair {i+1} {what:5} exporter p50 {e['p50']*1e6:8.1f} us p99 {e['p99']*1e6:8.1f} us"
                  f" | fio p50 {f['p50']*1e6:8.1f} us p99 {f['p99']*1e6:8.1f} us", file=sys.stderr)
        fd = fio(d, a.seconds, "sync", overwrite=False)
        rows["sync_fio_default"].append(fd)
    eng = []
    for i in range(a.pairs):
        order = ["io_uring", "sync"] if i % 2 == 0 else ["sync", "io_uring"]
        r = {k: exporter(a.bin, d, a.seconds, "sync", engine=k) for k in order}
        eng.append(r)
        print(f"pair {i+1} engines sync p50 io_uring {r['io_uring']['p50']*1e6:.1f} us"
              f" syscall {r['sync']['p50']*1e6:.1f} us", file=sys.stderr)

    print(f"\nfidelity: {a.pairs} interleaved pairs of {a.seconds} s in {d}")
    print(f"{'metric':<28}{'exporter med':>14}{'fio med':>12}{'ratio min':>11}{'median':>9}{'max':>8}")
    for what in ["sync", "read"]:
        for q in ["p50", "p99"]:
            ratios = [e[q] / f[q] for e, f in rows[what]]
            em = statistics.median(e[q] for e, _ in rows[what])
            fm = statistics.median(f[q] for _, f in rows[what])
            lo, med, hi = summary(ratios)
            print(f"{what + ' ' + q:<28}{em*1e6:>11.1f} us{fm*1e6:>9.1f} us{lo:>11.3f}{med:>9.3f}{hi:>8.3f}")
    fdm = statistics.median(x["p50"] for x in rows["sync_fio_default"])
    print(f"{'fio sync p50, no overwrite':<28}{'':>14}{fdm*1e6:>9.1f} us   (fio's default fallocate layout)")
    ratios = [r["io_uring"]["p50"] / r["sync"]["p50"] for r in eng]
    lo, med, hi = summary(ratios)
    print(f"{'engines sync p50 uring/sys':<28}"
          f"{statistics.median(r['io_uring']['p50'] for r in eng)*1e6:>11.1f} us"
          f"{statistics.median(r['sync']['p50'] for r in eng)*1e6:>9.1f} us{lo:>11.3f}{med:>9.3f}{hi:>8.3f}")
    if not a.dir:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
