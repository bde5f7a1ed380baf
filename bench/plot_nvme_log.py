"""A strata-nvme-bench --log file as a PNG: GB/s and mean latency over
time, one line per configuration and run; with --vs-fio, fio's runs of a
configuration dashed beside strata's, in the same colour.

    /var/cache/strata/torch-venv/bin/python bench/plot_nvme_log.py \
        LOG.jsonl [--out LOG.png] [--title TEXT]

Each line of the log is one interval of a run (docs/cli.md, --log); a
point is drawn at the interval's end. Needs matplotlib (the torch venv has
it).
"""

import argparse
import json
import sys
from collections import OrderedDict


def human_bytes(n):
    for unit in ("", "K", "M", "G"):
        if n < 1024 or unit == "G":
            return f"{n:g}{unit}"
        n /= 1024
    return str(n)


def read_log(path):
    """{(label, engine): [records]} in the order the runs were made; a
    record without "engine" (a log from before fio's runs were logged) is
    strata's."""
    series = OrderedDict()
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{number}: not a JSON line ({e}); "
                         "pass a strata-nvme-bench --log file")
            label = (f"{r['rw']} bs={human_bytes(r['bs'])} qd={r['qd']} "
                     f"thr={r['threads']}")
            if r["run"] > 1:
                label += f" run {r['run']}"
            series.setdefault((label, r.get("engine", "strata")),
                              []).append(r)
    if not series:
        sys.exit(f"{path}: no records; was the run made with --log?")
    return series


def points(records, shortest=0.1):
    """(t, GB/s, mean us) per interval; an interval shorter than `shortest`
    seconds (the one a run's end closes just after a periodic line) is
    folded into the one before it, whose rates it would only add noise to."""
    merged = []  # [t0, t1, bytes, ios, latency sum in us]
    t0 = 0.0
    for r in records:
        lat = r["lat_mean_us"] * r["ios"]
        if merged and r["t"] - t0 < shortest:
            m = merged[-1]
            m[1], m[2], m[3], m[4] = r["t"], m[2] + r["bytes"], \
                m[3] + r["ios"], m[4] + lat
        else:
            merged.append([t0, r["t"], r["bytes"], r["ios"], lat])
        t0 = r["t"]
    out = []
    for start, end, nbytes, ios, lat in merged:
        secs = end - start
        out.append((end, nbytes / secs / 1e9 if secs > 0 else 0.0,
                    lat / ios if ios else 0.0))
    return out


def plot(series, out, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (bw, lat) = plt.subplots(2, 1, sharex=True, figsize=(10, 7))
    colours = {}
    for (label, engine), records in series.items():
        t, gbps, us = zip(*points(records))
        colour = colours.setdefault(label, f"C{len(colours) % 10}")
        style = dict(marker=".", color=colour,
                     linestyle="--" if engine == "fio" else "-",
                     label=label if engine == "strata" else f"{label} {engine}")
        bw.plot(t, gbps, **style)
        lat.plot(t, us, **style)
    bw.set_ylabel("GB/s (1e9 B/s)")
    bw.set_ylim(bottom=0)
    lat.set_ylabel("mean latency (us)")
    lat.set_ylim(bottom=0)
    lat.set_xlabel("seconds since the run started")
    bw.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1))
    for ax in (bw, lat):
        ax.grid(True, alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110, bbox_inches="tight")
    return fig


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("log", help="a strata-nvme-bench --log file")
    p.add_argument("--out", help="PNG to write (default: LOG with .png)")
    p.add_argument("--title", default="strata-nvme-bench over time")
    a = p.parse_args()
    out = a.out or (a.log.rsplit(".", 1)[0] + ".png")
    plot(read_log(a.log), out, a.title)
    print(out)


if __name__ == "__main__":
    main()
