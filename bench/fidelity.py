#!/usr/bin/env python3
"""Probe fidelity: pg-storage-exporter `check` against fio, interleaved A/B.

Runs N pairs in one directory, alternating which tool goes first, and
prints p50/p99 of the 8 KiB write+fdatasync sync latency and of the 8 KiB
O_DIRECT random read (QD 1, total latency), each as exporter/fio ratios
with min, median and max. Also compares the io_uring and syscall engines,
and, with --pg-test-fsync, puts pg_test_fsync's fdatasync ops/s beside the
exporter's back-to-back commit rate.

fio is run the way the acceptance criteria state, plus --overwrite=1 for the
sync job: the exporter's WAL probe overwrites a preallocated, zero-written
file (like a recycled WAL segment), and fio's default would instead
fallocate() unwritten extents whose first write costs a metadata journal
commit. Both fio variants are shown.

bench/run imports this module (run_pairs, summarize, pg_test_fsync,
exporter); run alone it prints its own table.

Usage: bench/fidelity.py [--pairs 5] [--seconds 10] [--dir DIR] [--bin PATH]
                         [--pg-test-fsync PG_BIN_DIR]
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def sh(args):
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({r.returncode}):\n{r.stderr}")
    return r.stdout


def exporter(binary, d, seconds, what, engine="auto"):
    """One `check` run, commit probes only (what="sync") or reads only."""
    args = [binary, "check", d, "--duration", f"{seconds}s", "--format", "json",
            "--engine", engine, "--free-space-reserve", "0"]
    args.append("--no-read" if what == "sync" else "--no-commit")
    j = json.loads(sh(args))
    s = j["sync" if what == "sync" else "read"]
    out = {"p50": s["p50"], "p99": s["p99"], "engine": j["engine"], "n": s["count"]}
    if what == "sync":
        # With --no-read the whole duration is commit probes, back to back.
        out["commits_per_s"] = j["commit"]["count"] / j["duration_seconds"]
        out["commit_p50"] = j["commit"]["p50"]
    return out


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


def run_pairs(binary, d, pairs, seconds, fio_default=False, sync_engine=False):
    """Interleaved pairs; the first tool alternates from pair to pair.

    Returns {"sync": [(exporter, fio), ...], "read": [...],
    "sync_fio_default": [fio, ...] (only with fio_default),
    "sync_engine_sync": [(exporter --engine sync, fio), ...] (only with
    sync_engine: a third arm in each sync pair, compared with the same fio
    run; the order of the three rotates)}."""
    rows = {"sync": [], "read": [], "sync_fio_default": [], "sync_engine_sync": []}
    for i in range(pairs):
        first_exporter = i % 2 == 0
        for what in ["sync", "read"]:
            arms = ["e", "f"] if first_exporter else ["f", "e"]
            if what == "sync" and sync_engine:
                arms = ["e", "f", "s"][i % 3:] + ["e", "f", "s"][:i % 3]
            got = {}
            for arm in arms:
                if arm == "e":
                    got[arm] = exporter(binary, d, seconds, what)
                elif arm == "f":
                    got[arm] = fio(d, seconds, what)
                else:
                    got[arm] = exporter(binary, d, seconds, what, engine="sync")
            e, f = got["e"], got["f"]
            rows[what].append((e, f))
            msg = (f"  pair {i+1} {what:5} exporter p50 {e['p50']*1e6:8.1f} us p99 {e['p99']*1e6:8.1f} us"
                   f" | fio p50 {f['p50']*1e6:8.1f} us p99 {f['p99']*1e6:8.1f} us")
            if "s" in got:
                rows["sync_engine_sync"].append((got["s"], f))
                msg += f" | exporter --engine sync p50 {got['s']['p50']*1e6:8.1f} us"
            log(msg + f"  (order {''.join(arms)})")
        if fio_default:
            rows["sync_fio_default"].append(fio(d, seconds, "sync", overwrite=False))
    return rows


def summary(ratios):
    return (min(ratios), statistics.median(ratios), max(ratios))


def summarize(rows):
    """{("sync"|"read", "p50"|"p99"): {exporter, fio (medians), min, median, max}}
    (and ("sync_engine_sync", ...) when run_pairs ran that arm)."""
    out = {}
    for what in ["sync", "read", "sync_engine_sync"]:
        if not rows.get(what):
            continue
        for q in ["p50", "p99"]:
            ratios = [e[q] / f[q] for e, f in rows[what]]
            lo, med, hi = summary(ratios)
            out[(what, q)] = {
                "exporter": statistics.median(e[q] for e, _ in rows[what]),
                "fio": statistics.median(f[q] for _, f in rows[what]),
                "min": lo, "median": med, "max": hi, "pairs": len(ratios),
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--dir")
    ap.add_argument("--bin", default="target/release/pg-storage-exporter")
    ap.add_argument("--pg-test-fsync", metavar="PG_BIN_DIR",
                    help="also run pg_test_fsync from this bin dir")
    a = ap.parse_args()
    if not shutil.which("fio"):
        sys.exit("fio not found: apt-get install fio")
    d = a.dir or tempfile.mkdtemp(prefix="pgse-fidelity-", dir="/var/tmp")
    try:
        rows = run_pairs(a.bin, d, a.pairs, a.seconds, fio_default=True)
        eng = []
        for i in range(a.pairs):
            order = ["io_uring", "sync"] if i % 2 == 0 else ["sync", "io_uring"]
            r = {k: exporter(a.bin, d, a.seconds, "sync", engine=k) for k in order}
            eng.append(r)
            log(f"  pair {i+1} engines sync p50 io_uring {r['io_uring']['p50']*1e6:.1f} us"
                f" syscall {r['sync']['p50']*1e6:.1f} us")
        tf = None
        if a.pg_test_fsync:
            before = exporter(a.bin, d, a.seconds, "sync")
            ops, _, _ = pg_test_fsync(a.pg_test_fsync, os.path.join(d, "pg_test_fsync.out"))
            after = exporter(a.bin, d, a.seconds, "sync")
            tf = (ops, (before["commits_per_s"] + after["commits_per_s"]) / 2)
    finally:
        if not a.dir:
            shutil.rmtree(d, ignore_errors=True)

    print(f"\nfidelity: {a.pairs} interleaved pairs of {a.seconds} s in {d}")
    print(f"{'metric':<28}{'exporter med':>14}{'fio med':>12}{'ratio min':>11}{'median':>9}{'max':>8}")
    for (what, q), s in summarize(rows).items():
        if what == "sync_engine_sync":
            what = "sync (--engine sync)"
        print(f"{what + ' ' + q:<28}{s['exporter']*1e6:>11.1f} us{s['fio']*1e6:>9.1f} us"
              f"{s['min']:>11.3f}{s['median']:>9.3f}{s['max']:>8.3f}")
    fdm = statistics.median(x["p50"] for x in rows["sync_fio_default"])
    print(f"{'fio sync p50, no overwrite':<28}{'':>14}{fdm*1e6:>9.1f} us   (fio's default fallocate layout)")
    ratios = [r["io_uring"]["p50"] / r["sync"]["p50"] for r in eng]
    lo, med, hi = summary(ratios)
    print(f"{'engines sync p50 uring/sys':<28}"
          f"{statistics.median(r['io_uring']['p50'] for r in eng)*1e6:>11.1f} us"
          f"{statistics.median(r['sync']['p50'] for r in eng)*1e6:>9.1f} us{lo:>11.3f}{med:>9.3f}{hi:>8.3f}")
    if tf:
        print(f"{'commits/s vs pg_test_fsync':<28}{tf[1]:>11.0f} /s{tf[0]:>9.0f} /s{'':>11}{tf[1]/tf[0]:>9.3f}")


if __name__ == "__main__":
    main()
