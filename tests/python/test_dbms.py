"""A DBMS in another language needs only schema/bitfold.capnp.

This test loads the schema with pycapnp (nothing generated, nothing from the
Rust side), connects to a real bitfold master over Cap'n Proto RPC, runs point
and range queries in all three result forms, decodes `roaring` with pyroaring,
and checks every answer against sets computed here. It does so twice: over
plain TCP, and over mutual TLS (Python's `ssl` module under pycapnp's asyncio
stream) to a cluster started by `bitfold up --tls`, which also refuses a
client without a certificate and a plain client.

The cluster (slaves + master) is started from the `bitfold` binary named by
$BITFOLD_BIN (default: target/debug/bitfold) on free loopback ports and
stopped at the end, whatever happens.
"""

import asyncio
import contextlib
import os
import random
import socket
import ssl
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


class Server:
    """A `bitfold` process: its stdout read by a thread (so it never fills its
    pipe) for the line `<what> listening on ADDR`, its stderr written to the
    file `log` (read back when it fails to start)."""

    def __init__(self, args, what, log):
        self.what = what
        self.log = open(log, "w+")
        self.process = subprocess.Popen(
            [str(BINARY), *args], stdout=subprocess.PIPE, stderr=self.log, text=True
        )
        self.addr = None
        self.ready = threading.Event()
        self.reader = threading.Thread(target=self.read, daemon=True)
        self.reader.start()

    def read(self):
        for line in self.process.stdout:
            if line.startswith(f"{self.what} listening on ") and not self.ready.is_set():
                self.addr = line.split()[-1]
                self.ready.set()
        self.ready.set()

    def address(self):
        """The address it listens on, once it says so (60 s at most)."""
        if not self.ready.wait(60) or self.addr is None:
            self.log.seek(0)
            raise RuntimeError(f"bitfold {self.what} did not start: {self.log.read()}")
        return self.addr

    def stop(self):
        """Kills the process and closes its pipe and log."""
        self.process.kill()
        self.process.wait()
        self.reader.join(10)
        self.process.stdout.close()
        self.log.close()


def start(args, what, servers, log):
    """Starts `bitfold ARGS` (its stderr into the file `log`), adds it to
    `servers` and returns its address once it prints `<what> listening on ADDR`."""
    server = Server(args, what, log)
    servers.append(server)
    return server.address()


class Connection:
    """A Cap'n Proto stream and the socket under it. pycapnp's `close` only
    starts a TLS shutdown, which finishes on later turns of the event loop:
    `close` waits (up to a second) for the socket to be closed, so that no
    connection outlives its test."""

    def __init__(self, stream, sock):
        self.stream = stream
        self.sock = sock

    async def close(self):
        self.stream.close()
        for _ in range(100):
            if self.sock.fileno() == -1:
                return
            await asyncio.sleep(0.01)
        self.sock.close()


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
    """Over plain TCP, to a master and slaves started one by one."""

    # The `--tls` folder of the client (the cluster runs mutual TLS), or None.
    tls = None

    @classmethod
    def setUpClass(cls):
        cls.servers = []
        cls.tmp = tempfile.TemporaryDirectory()
        try:
            tmp = Path(cls.tmp.name)
            cls._start_servers(tmp)
            cls._import(tmp)
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def _start_servers(cls, tmp):
        slaves = []
        for i in range(3):
            addr = start(
                ["slave", "--listen", "127.0.0.1:0", "--data-dir", str(tmp / f"s{i}")],
                "slave",
                cls.servers,
                tmp / f"s{i}.log",
            )
            slaves.append(addr)
        cluster = "replicas = 2\n" + "".join(
            f'[[slaves]]\nname = "s{i}"\naddr = "{addr}"\n' for i, addr in enumerate(slaves)
        )
        (tmp / "cluster.toml").write_text(cluster)
        cls.master = start(
            ["master", "--listen", "127.0.0.1:0", "--cluster", str(tmp / "cluster.toml")],
            "master",
            cls.servers,
            tmp / "master.log",
        )

    @classmethod
    def _import(cls, tmp):
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
        tls = ["--tls", str(cls.tls)] if cls.tls else []
        run = subprocess.run(
            [str(BINARY), "import", "--master", cls.master, *tls, str(tmp / "vectors.csv")],
            capture_output=True,
            text=True,
        )
        if run.returncode != 0:
            raise RuntimeError(f"import failed: {run.stderr}")

    @classmethod
    def tearDownClass(cls):
        for server in cls.servers:
            server.stop()
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
            async with self.master_over(self.ssl_context()) as master:
                answers = []
                for message, form in queries:
                    response = await master.query(message=message, format=form)
                    answers.append(response.result)
                return answers

        return asyncio.run(capnp.run(run()))

    def ssl_context(self, certificate=True):
        """Trusts the cluster's CA and presents the client's certificate (if
        `certificate`); None on a plain cluster."""
        if self.tls is None:
            return None
        context = ssl.create_default_context(cafile=str(self.tls / "ca.pem"))
        if certificate:
            context.load_cert_chain(self.tls / "cert.pem", self.tls / "key.pem")
        return context

    async def connect(self, context):
        """A connection to the master: TLS with `context` (every certificate
        names the server `bitfold`), plain TCP without."""
        host, port = self.master.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)))
        if context is None:
            stream = await capnp.AsyncIoStream.create_connection(sock=sock)
        else:
            stream = await capnp.AsyncIoStream.create_connection(
                sock=sock, ssl=context, server_hostname="bitfold"
            )
        return Connection(stream, sock)

    @contextlib.asynccontextmanager
    async def master_over(self, context):
        """The master's capability over a new connection (see `connect`),
        closed on leaving."""
        connection = await self.connect(context)
        try:
            client = capnp.TwoPartyClient(connection.stream)
            yield client.bootstrap().cast_as(SCHEMA.Master)
        finally:
            await connection.close()

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



def free_ports(count):
    """A port P of this machine such that P..P+count-1 are free now."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            first = probe.getsockname()[1]
        if first + count > 65535:
            continue
        taken = []
        try:
            for port in range(first, first + count):
                s = socket.socket()
                taken.append(s)
                s.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for s in taken:
                s.close()
    raise RuntimeError(f"no {count} consecutive free ports")


class TlsDbmsTest(DbmsTest):
    """The same queries over mutual TLS to a cluster of `bitfold up --tls`,
    whose every link (master to slaves, slave to slave) runs TLS too."""

    @classmethod
    def _start_servers(cls, tmp):
        port = free_ports(4)
        cls.master = start(
            ["up", "--tls", "--dir", str(tmp / "cluster"), "--port", str(port), "--replicas", "2"],
            "master",
            cls.servers,
            tmp / "up.log",
        )
        cls.tls = tmp / "cluster" / "tls" / "client"

    def refused(self, context):
        """Asks a query over a connection made with `context` and checks that
        the master cut the connection instead of answering, within 10 s."""

        async def run():
            async with self.master_over(context) as master:
                await master.query(message="P:0", format="count")

        with self.assertRaises(Exception) as refused:
            asyncio.run(asyncio.wait_for(capnp.run(run()), 10))
        self.assertNotIsInstance(refused.exception, asyncio.TimeoutError)
        self.assertIn("disconnected", str(refused.exception).lower())

    def test_a_client_without_a_certificate_is_refused(self):
        self.refused(self.ssl_context(certificate=False))

    def test_a_plain_client_is_refused(self):
        self.refused(None)


if __name__ == "__main__":
    unittest.main()
