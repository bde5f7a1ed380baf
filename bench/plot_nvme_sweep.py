"""A strata-nvme-bench sweep (its --json records) as a PNG: GB/s per
configuration, strata beside fio, each bar the median run with the
slowest and fastest runs as its whiskers, and what the device saw (mean
request size) written under each pair.

    /var/cache/strata/torch-venv/bin/python bench/plot_nvme_sweep.py \
        SWEEP.json [--out SWEEP.png] [--title TEXT]

The records are the ones docs/cli.md describes (--json); fio's bars come
with --vs-fio. Needs matplotlib (the torch venv has it).
"""

import argparse
import json
import sys

from plot_nvme_log import human_bytes


def read_sweep(path):
    """The records of a --json file, with the path named on a bad one."""
    try:
        with open(path) as f:
            records = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        sys.exit(f"{path}: {e}; pass a strata-nvme-bench --json file")
    if not isinstance(records, list) or not records:
        sys.exit(f"{path}: no records; was the sweep run with --json?")
    return records


def label(r):
    text = f"{r['rw']} {human_bytes(r['bs'])}\nqd {r['qd']} x{r['threads']}"
    device = r.get("device")
    if device:
        text += f"\ndev {device['mean_request_bytes'] / 1024:.0f} KiB"
    return text


def bar(ax, x, figures, color, name):
    """One bar: the median run, whiskers to the slowest and fastest."""
    runs = figures.get("runs_gb_per_s") or [figures["gb_per_s"]]
    mid = figures["gb_per_s"]
    ax.bar(x, mid, width=0.38, color=color, label=name,
           yerr=[[mid - min(runs)], [max(runs) - mid]], capsize=3)


def plot(records, out, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(records)), 5))
    for i, r in enumerate(records):
        bar(ax, i - 0.2, r, "tab:blue", "strata" if i == 0 else None)
        if "fio" in r:
            bar(ax, i + 0.2, r["fio"], "tab:gray", "fio" if i == 0 else None)
            top = max(r.get("runs_gb_per_s", []) + [r["gb_per_s"]] +
                      r["fio"].get("runs_gb_per_s", []))
            ax.text(i, top, f"{r['strata_over_fio']:.2f}x", ha="center",
                    va="bottom", fontsize="small")
    ax.set_xticks(range(len(records)), [label(r) for r in records],
                  fontsize="small")
    ax.set_ylabel("GB/s (1e9 B/s)")
    ax.set_ylim(bottom=0)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend()
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sweep", help="a strata-nvme-bench --json file")
    p.add_argument("--out", help="PNG to write (default: SWEEP with .png)")
    p.add_argument("--title", default="strata-nvme-bench against fio")
    a = p.parse_args()
    out = a.out or (a.sweep.rsplit(".", 1)[0] + ".png")
    plot(read_sweep(a.sweep), out, a.title)
    print(out)


if __name__ == "__main__":
    main()
