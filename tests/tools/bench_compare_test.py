#!/usr/bin/env python3
"""Tests of bench/cpu_adam_common.py, the shared half of cpu_adam_vs_torch.py
and cpu_adam_vs_deepspeed.py: how it reads our benchmark's JSON, pairs peer
and ours runs, and turns them into the printed and JSON figures (ratio and
ceiling). No peer and no real benchmark: a fake cpu_adam_bench prints fixed
Google Benchmark JSON, and fake peers return fixed figures.

Run: python3 tests/tools/bench_compare_test.py (standard library only).
"""

import json
import os
import stat
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import cpu_adam_common as common  # noqa: E402

NAME = "AdamW/fp32/1048576/iterations:10"


def fake_bench(directory, benchmarks, exit_code=0):
    """An executable that prints `benchmarks` as Google Benchmark JSON."""
    path = os.path.join(directory, "fake_bench")
    doc = json.dumps({"context": {}, "benchmarks": benchmarks})
    with open(path, "w") as f:
        f.write(f"#!{sys.executable}\nimport sys\nprint('log line')\nprint({doc!r})\n"
                f"sys.exit({exit_code})\n")
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return path


class FakePeer:
    def __init__(self, figures):
        self.figures, self.closed = list(figures), False

    def measure(self):
        return self.figures.pop(0)

    def close(self):
        self.closed = True


class RunOursTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.tmp.cleanup()

    def test_reads_params_per_s_and_derives_the_roofline(self):
        bench = fake_bench(self.tmp.name, [
            {"name": NAME, "run_type": "iteration", "threads": 2,
             "params_per_s": 2.0e9, "vs_roofline": 0.8}])
        pps, roof = common.run_ours("t", bench, NAME, 2)
        self.assertEqual(pps, 2.0e9)
        self.assertAlmostEqual(roof, 2.5e9)

    def test_a_benchmark_error_is_an_exit_not_a_figure(self):
        bench = fake_bench(self.tmp.name, [
            {"name": NAME, "run_type": "iteration", "error_occurred": True,
             "error_message": "out of memory"}])
        with self.assertRaises(SystemExit):
            common.run_ours("t", bench, NAME, 2)

    def test_a_missing_row_or_failed_run_is_an_exit(self):
        with self.assertRaises(SystemExit):
            common.run_ours("t", fake_bench(self.tmp.name, []), NAME, 2)
        with self.assertRaises(SystemExit):
            common.run_ours("t", fake_bench(self.tmp.name, [], exit_code=3), NAME, 2)


class CompareTest(unittest.TestCase):
    def test_medians_ratio_and_ceiling(self):
        peer = FakePeer([1.0e8, 3.0e8, 2.0e8])
        ours = iter([(9.0e8, 1.0e9), (7.0e8, 8.0e8), (8.0e8, 1.2e9)])
        row = common.compare(3, peer, lambda: next(ours))
        self.assertTrue(peer.closed)
        self.assertEqual(row["peer"], (2.0e8, [1.0e8, 3.0e8, 2.0e8]))
        self.assertEqual(row["ours"], (8.0e8, [9.0e8, 7.0e8, 8.0e8]))
        # The roofline's median is its own, not the one paired with ours's.
        self.assertEqual(row["roofline"], (1.0e9, [1.0e9, 8.0e8, 1.2e9]))
        flat = common.json_row(row, "ds")
        self.assertAlmostEqual(flat["ratio"], 4.0)
        self.assertAlmostEqual(flat["ceiling"], 5.0)
        self.assertEqual(flat["ds_runs"], [1.0e8, 3.0e8, 2.0e8])
        text = common.row_text("row", 10, row)
        self.assertIn("     4.00      5.00", text)
        self.assertIn("roofline ['1.000', '0.800', '1.200']", text)

    def test_runs_interleave_with_the_order_reversed_on_odd_repeats(self):
        order = []
        got = common.interleave(3, {"a": lambda: order.append("a") or 1,
                                    "b": lambda: order.append("b") or 2})
        self.assertEqual(order, ["a", "b", "b", "a", "a", "b"])
        self.assertEqual(got, {"a": [1, 1, 1], "b": [2, 2, 2]})

    def test_peer_only_rows_have_no_ratio(self):
        row = common.compare(1, FakePeer([5.0e8]), None)
        self.assertNotIn("ours", row)
        flat = common.json_row(row, "peer")
        self.assertIsNone(flat["ratio"])
        self.assertIsNone(flat["ceiling"])
        self.assertIn("-", common.row_text("row", 10, row))


if __name__ == "__main__":
    unittest.main()
