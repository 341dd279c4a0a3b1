"""A DBMS in another language needs only schema/bitfold.capnp.

This test loads the schema with pycapnp (nothing generated, nothing from the
Rust side), connects to a real bitfold master over Cap'n Proto RPC, runs point
and range queries in all three result forms, decodes `roaring` with pyroaring,
and checks every answer against sets computed here.

The cluster (slaves + master) is started from the `bitfold` binary named by
$BITFOLD_BIN (default: target/debug/bitfold) on free loopback ports and
stopped at the end, whatever happens.
"""

import asyncio
import os
import random
import subprocess
import tempfile
import threading
import unittest
from pathlib import Path

import capnp
from pyroaring import BitMap

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = capnp.load(str(ROOT / "schema" / "bitfold.capnp"))
BINARY = Path(os.environ.get("BITFOLD_BIN", ROOT / "target" / "debug" / "bitfold"))
TOP = 2**64 - 1


def start(args, what, cleanups):
    """Starts `bitfold ARGS` and returns its address once it prints `<what> listening on ADDR`."""
    process = subprocess.Popen(
        [str(BINARY), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    cleanups.append(process)
    found = {}
    ready = threading.Event()

    def read():
        for line in process.stdout:
            if line.startswith(f"{what} listening on ") and not ready.is_set():
                found["addr"] = line.split()[-1]
                ready.set()
        ready.set()

    threading.Thread(target=read, daemon=True).start()
    if not ready.wait(60) or "addr" not in found:
        raise RuntimeError(f"bitfold {what} did not start: {process.stderr.read()}")
    return found["addr"]


def words_to_bits(data):
    """The `words` form: little-endian u64 words, bit b is bit b%64 of word b//64."""
    assert len(data) % 8 == 0
    bits = set()
    for i in range(0, len(data), 8):
        word = int.from_bytes(data[i : i + 8], "little")
        while word:
            low = word & -word
            bits.add(i * 8 + low.bit_length() - 1)
            word ^= low
    return bits


class DbmsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.processes = []
        cls.tmp = tempfile.TemporaryDirectory()
        try:
            cls._start_cluster(Path(cls.tmp.name))
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def _start_cluster(cls, tmp):
        slaves = []
        for i in range(3):
            addr = start(
                ["slave", "--listen", "127.0.0.1:0", "--data-dir", str(tmp / f"s{i}")],
                "slave",
                cls.processes,
            )
            slaves.append(addr)
        cluster = "replicas = 2\n" + "".join(
            f'[[slaves]]\nname = "s{i}"\naddr = "{addr}"\n' for i, addr in enumerate(slaves)
        )
        (tmp / "cluster.toml").write_text(cluster)
        cls.master = start(
            ["master", "--listen", "127.0.0.1:0", "--cluster", str(tmp / "cluster.toml")],
            "master",
            cls.processes,
        )
        rng = random.Random(7)
        cls.vectors = {}
        for vid in [0, 1, 2, 3, 5, 8, 13, 21, 1000, TOP - 1, TOP]:
            if vid % 2:
                bits = {rng.randrange(1 << 20) for _ in range(3000)}
            else:
                bits = {b for b in range(1 << 16) if rng.random() < 0.5}
            if vid == TOP:
                bits.add(3_000_000)
            cls.vectors[vid] = bits
        lines = ["# vid,bit"] + [f"{v},{b}" for v, bits in cls.vectors.items() for b in sorted(bits)]
        (tmp / "vectors.csv").write_text("\n".join(lines) + "\n")
        run = subprocess.run(
            [str(BINARY), "import", "--master", cls.master, str(tmp / "vectors.csv")],
            capture_output=True,
            text=True,
        )
        if run.returncode != 0:
            raise RuntimeError(f"import failed: {run.stderr}")

    @classmethod
    def tearDownClass(cls):
        for process in cls.processes:
            process.kill()
            process.wait()
        cls.tmp.cleanup()

    def expected(self, terms):
        result = None
        for first, last in terms:
            union = set()
            for vid, bits in self.vectors.items():
                if first <= vid <= last:
                    union |= bits
            result = union if result is None else result & union
        return result

    def ask(self, queries):
        """Sends every (message, format) over one connection; returns the Result structs."""

        async def run():
            host, port = self.master.rsplit(":", 1)
            connection = await capnp.AsyncIoStream.create_connection(host=host, port=int(port))
            client = capnp.TwoPartyClient(connection)
            master = client.bootstrap().cast_as(SCHEMA.Master)
            answers = []
            for message, form in queries:
                response = await master.query(message=message, format=form)
                answers.append(response.result)
            return answers

        return asyncio.run(capnp.run(run()))

    def check(self, message, expected):
        count, words, roaring = self.ask(
            [(message, "count"), (message, "words"), (message, "roaring")]
        )
        self.assertEqual(count.which(), "count", message)
        self.assertEqual(count.count, len(expected), message)
        self.assertEqual(roaring.which(), "roaring", message)
        self.assertEqual(set(BitMap.deserialize(bytes(roaring.roaring))), expected, message)
        self.assertEqual(words.which(), "words", message)
        self.assertEqual(words_to_bits(bytes(words.words)), expected, message)

    def test_point_queries(self):
        for vid in [0, 13, TOP]:
            self.check(f"P:{vid}", self.vectors[vid])

    def test_range_queries(self):
        for terms in [
            [(0, 10)],
            [(0, 10), (5, 2000)],
            [(0, TOP)],
            [(1, 1), (0, TOP), (3, 21)],
            [(TOP - 1, TOP), (0, TOP)],
            [(30, 40)],
        ]:
            message = "R:" + "&".join(f"{a}-{b}" for a, b in terms)
            self.check(message, self.expected(terms))

    def test_errors(self):
        bad, missing = self.ask([("R:5-", "count"), ("P:4", "words")])
        self.assertEqual(bad.which(), "error")
        self.assertEqual(bad.error.kind, "badQuery")
        self.assertIn("at byte 4", bad.error.message)
        self.assertEqual(missing.which(), "error")
        self.assertEqual(missing.error.kind, "notFound")
        self.assertIn("4", missing.error.message)


if __name__ == "__main__":
    unittest.main()
