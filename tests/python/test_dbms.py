"""A DBMS in Python: the `bitfold_client` package (clients/python), and the
schema alone.

The tests start a real cluster, import vectors with `bitfold import`, and
check every answer against sets computed here:

- through `bitfold_client.Client`: point and range queries as a count, a
  pyroaring `BitMap` and a numpy array of positions; the error kinds and
  the master's messages; imports, clears and deletes; masters tried in turn;
  a client shared between threads; and (over plain TCP only) a master
  restarted under a client, and masters that answer `notLeader` (fakes
  served here) skipped for the leader they name, or, while none leads, the
  call failing as `unavailable` after the failover window;
- with pycapnp loading `schema/bitfold.capnp` directly (nothing generated,
  nothing from the Rust side, no package): one test, so that the interface
  stays usable by a DBMS that has only the schema.

The rest runs twice: over plain TCP, and over mutual TLS to a cluster
started by `bitfold up --tls`: queries with a `reader` certificate
(`DIR/tls/reader`), imports, clears and deletes with an `admin` one
(`DIR/tls/admin`), OpenSSL on the client side; the cluster refuses a
reader's writes as `forbidden`, a client without a certificate and a plain
client.

The cluster (slaves + master) is started from the `bitfold` binary named by
$BITFOLD_BIN (default: target/debug/bitfold) on free loopback ports and
stopped at the end, whatever happens. `scripts/setup` installs the package.
"""

import asyncio
import contextlib
import os
import random
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import unittest
from pathlib import Path
from unittest import mock

import capnp
import numpy as np
from pyroaring import BitMap

import bitfold_client
import bitfold_client._schema
import bitfold_client._vectors as bitfold_vectors
from bitfold_client._loop import Runner

ROOT = Path(__file__).resolve().parents[2]
BINARY = Path(os.environ.get("BITFOLD_BIN", ROOT / "target" / "debug" / "bitfold"))
# The largest vid a cluster that cuts vectors into pieces (the default)
# stores (docs/protocol.md §1); terms may still name any u64.
TOP = 2**48 - 1
U64_MAX = 2**64 - 1
# Where the write tests put their vectors, away from the imported ones.
WRITES = 2**40


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


@contextlib.contextmanager
def hanging_up_listener():
    """The address of a loopback listener that accepts every connection and
    closes it at once, unanswered: a master that is down but whose port
    still takes connections. Stopped on leaving."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.1)
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield "127.0.0.1:%d" % listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(10)
        listener.close()


def refused_address():
    """A loopback address nothing listens on (now)."""
    return f"127.0.0.1:{free_ports(1)}"


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

    # The `--tls` folder of the client that queries (the cluster runs mutual
    # TLS), or None.
    tls = None
    # The `--tls` folder of the client that writes, or None.
    admin_tls = None

    @classmethod
    def setUpClass(cls):
        cls.servers = []
        cls.client = None
        cls.writer = None
        cls.tmp = tempfile.TemporaryDirectory()
        try:
            tmp = Path(cls.tmp.name)
            cls._start_servers(tmp)
            cls._import(tmp)
            cls.client = bitfold_client.Client(cls.master, tls=cls.tls)
            cls.writer = bitfold_client.Client(cls.master, tls=cls.admin_tls or cls.tls)
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
        admin = cls.admin_tls or cls.tls
        tls = ["--tls", str(admin)] if admin else []
        run = subprocess.run(
            [str(BINARY), "import", "--master", cls.master, *tls, str(tmp / "vectors.csv")],
            capture_output=True,
            text=True,
        )
        if run.returncode != 0:
            raise RuntimeError(f"import failed: {run.stderr}")

    @classmethod
    def tearDownClass(cls):
        for client in [cls.client, cls.writer]:
            if client is not None:
                client.close()
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

    def check(self, message, expected, client=None):
        """Asks `message` in all three outputs and compares each with `expected`."""
        client = client or self.client
        self.assertEqual(client.query(message), len(expected), message)
        self.assertEqual(client.query(message, output="count"), len(expected), message)
        bitmap = client.query(message, output="bitmap")
        self.assertIsInstance(bitmap, BitMap)
        self.assertEqual(set(bitmap), expected, message)
        positions = client.query(message, output="positions")
        self.assertIsInstance(positions, np.ndarray)
        self.assertEqual(positions.dtype, np.uint32)
        np.testing.assert_array_equal(positions, np.array(sorted(expected), dtype=np.uint32))

    def assert_fails(self, kind, call, *args, **kwargs):
        """Runs `call(*args, **kwargs)`, checks it raises a `bitfold_client.Error`
        of `kind`, and returns the error."""
        with self.assertRaises(bitfold_client.Error) as caught:
            call(*args, **kwargs)
        self.assertEqual(caught.exception.kind, kind, str(caught.exception))
        return caught.exception

    def new_client(self, masters, **options):
        return bitfold_client.Client(masters, tls=self.tls, **options)

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
            [(TOP - 1, U64_MAX), (0, U64_MAX)],
            [(30, 40)],
        ]:
            message = "R:" + "&".join(f"{a}-{b}" for a, b in terms)
            self.check(message, self.expected(terms))

    def test_errors(self):
        bad = self.assert_fails("badQuery", self.client.query, "R:5-")
        self.assertIn("at byte 4", bad.message)
        self.assertEqual(str(bad), bad.message)
        missing = self.assert_fails("notFound", self.client.query, "P:4", output="bitmap")
        self.assertIn("4", missing.message)
        # The client goes on answering after errors.
        self.assertEqual(self.client.query("P:0"), len(self.vectors[0]))
        unknown = self.assert_fails("badArgument", self.client.query, "P:0", output="words")
        self.assertIn("'count', 'bitmap' or 'positions'", unknown.message)

    def test_imports_clears_and_deletes(self):
        client = self.writer
        rng = random.Random(11)
        dense = set(range(0, 70_000, 3))  # two containers of over 256 bits
        spread = set(rng.sample(range(1 << 32), 300))  # sparse containers, up to 2^32
        new = {WRITES: dense, WRITES + 1: spread, WRITES + 2: {2**32 - 1}}
        imported = client.import_vectors(
            {**{vid: BitMap(bits) for vid, bits in new.items()}, WRITES + 3: BitMap()}
        )
        self.assertEqual(imported, 3)
        self.vectors.update(new)
        for vid in new:
            self.check(f"P:{vid}", self.vectors[vid])
        # An empty bitmap creates nothing.
        self.assert_fails("notFound", client.query, f"P:{WRITES + 3}")
        self.check(f"R:{WRITES}-{WRITES + 9}&0-{TOP}", self.expected([(WRITES, WRITES + 9)]))

        # An import ORs; plain lists of positions and (vid, bits) pairs work too.
        self.assertEqual(client.import_vectors([(WRITES + 2, [5, 6])]), 1)
        self.vectors[WRITES + 2] |= {5, 6}
        self.check(f"P:{WRITES + 2}", self.vectors[WRITES + 2])

        # A clear counts the vectors that lost a bit: not a bit it lacked,
        # nor a vector that does not exist.
        gone = set(range(0, 30_000, 3))
        changed = client.clear({WRITES: BitMap(gone), WRITES + 2: [7], WRITES + 5: [1]})
        self.assertEqual(changed, 1)
        self.vectors[WRITES] -= gone
        self.check(f"P:{WRITES}", self.vectors[WRITES])
        self.check(f"P:{WRITES + 2}", self.vectors[WRITES + 2])
        # Cleared of every bit, a vector still exists, empty.
        self.assertEqual(client.clear({WRITES + 2: [5, 6, 2**32 - 1]}), 1)
        self.vectors[WRITES + 2] = set()
        self.check(f"P:{WRITES + 2}", set())

        # A delete counts the vectors it deleted.
        self.assertEqual(client.delete([WRITES + 1, (WRITES + 2, WRITES + 10)]), 2)
        del self.vectors[WRITES + 1], self.vectors[WRITES + 2]
        for vid in [WRITES + 1, WRITES + 2]:
            self.assert_fails("notFound", client.query, f"P:{vid}")
        self.assertEqual(client.delete([(WRITES + 1, WRITES + 2)]), 0)
        self.check(f"R:{WRITES}-{WRITES + 9}", self.expected([(WRITES, WRITES + 9)]))

        # The master's refusals arrive with its kind and message.
        reversed_span = self.assert_fails("badQuery", client.delete, [(WRITES + 5, WRITES + 4)])
        self.assertIn(f"{WRITES + 5}-{WRITES + 4}", reversed_span.message)
        # What the client cannot send never leaves it.
        self.assert_fails("badArgument", client.import_vectors, {2**64: BitMap([1])})
        self.assert_fails("badArgument", client.import_vectors, {1: [2**32]})
        self.assert_fails("badArgument", client.delete, 7)

    def test_large_writes_are_cut(self):
        """Vectors of several parts and batches of several messages, as the
        client cuts larger ones (made small here), import and clear whole."""
        vectors = {WRITES + 100 + i: set(range(i, 300_000, 2 + i)) for i in range(5)}
        with mock.patch.object(bitfold_vectors, "PART_MAX_DENSE", 2), mock.patch.object(
            bitfold_vectors, "MESSAGE_BYTES", 40_000
        ):
            parts = bitfold_vectors.vector_parts(BitMap(vectors[WRITES + 100]))
            self.assertEqual(len(parts), 3)  # 5 dense containers
            self.assertEqual(len(bitfold_vectors.batches(bitfold_vectors.encode_vectors(vectors))), 5)
            self.assertEqual(self.writer.import_vectors(vectors), 5)
            self.vectors.update(vectors)
            for vid in vectors:
                self.check(f"P:{vid}", self.vectors[vid])
            gone = set(range(0, 300_000, 6))
            changed = self.writer.clear({vid: gone for vid in vectors})
        losing = [vid for vid in vectors if vectors[vid] & gone]
        for vid in vectors:
            self.vectors[vid] = vectors[vid] - gone
            self.check(f"P:{vid}", self.vectors[vid])
        self.assertEqual(changed, len(losing))
        self.assertEqual(len(losing), 3)
        span = (WRITES + 100, WRITES + 104)
        self.check(f"R:{span[0]}-{span[1]}", self.expected([span]))

    def test_masters_are_tried_in_turn(self):
        with hanging_up_listener() as down:
            # One refuses connections, one takes them and hangs up: both skipped.
            for masters in [[refused_address(), down, self.master], f"{down}, {self.master}"]:
                with self.new_client(masters) as client:
                    self.check("P:13", self.vectors[13], client)
                    self.assertEqual(client.query("R:0-10"), len(self.expected([(0, 10)])))

    def test_no_master_answers(self):
        refused = refused_address()
        failed = self.assert_fails("connection", self.new_client, refused)
        self.assertIn(f"{refused}: connection refused", failed.message)

        def first_query(masters):
            with self.new_client(masters, failover=0.5) as client:
                client.query("P:0")

        # A plain client connects to `down` and fails at its first call; a
        # TLS one fails its handshake there already. Neither answers, so
        # both are tried for the failover window.
        with hanging_up_listener() as down:
            failed = self.assert_fails("connection", first_query, [refused, down])
        self.assertIn(refused, failed.message)
        self.assertIn(down, failed.message)
        self.assert_fails("badArgument", self.new_client, "localhost")
        # A closed client says so.
        client = self.new_client(self.master)
        client.close()
        closed = self.assert_fails("connection", client.query, "P:0")
        self.assertIn("closed", closed.message)

    def test_a_client_is_shared_between_threads(self):
        messages = ["P:0", "P:13", "R:0-10&5-2000", "R:0-21", "P:4"]
        answers = {}

        def ask(worker):
            for i in range(10):
                message = messages[(worker + i) % len(messages)]
                try:
                    answers[(worker, i)] = (message, self.client.query(message))
                except bitfold_client.Error as err:
                    answers[(worker, i)] = (message, err.kind)

        threads = [threading.Thread(target=ask, args=(w,)) for w in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        self.assertEqual(len(answers), 40)
        for message, answer in answers.values():
            if message == "P:4":
                self.assertEqual(answer, "notFound")
            elif message.startswith("P:"):
                self.assertEqual(answer, len(self.vectors[int(message[2:])]), message)
            else:
                terms = [tuple(map(int, t.split("-"))) for t in message[2:].split("&")]
                self.assertEqual(answer, len(self.expected(terms)), message)

    # ---------------------------------------------------------------------
    # The schema alone: what a DBMS without this package does.

    def ssl_context(self, certificate=True):
        """Trusts the cluster's CA and presents the client's certificate (if
        `certificate`); None on a plain cluster."""
        if self.tls is None:
            return None
        context = ssl.create_default_context(cafile=str(self.tls / "ca.pem"))
        if certificate:
            context.load_cert_chain(self.tls / "cert.pem", self.tls / "key.pem")
        return context

    def test_the_schema_alone_is_enough(self):
        """pycapnp loads `schema/bitfold.capnp` itself and asks the master for
        every result form (`words` decoded here), and for its errors."""
        schema = capnp.load(str(ROOT / "schema" / "bitfold.capnp"))
        terms = [(0, 10), (5, 2000)]
        asked = [("P:13", self.vectors[13]), ("R:0-10&5-2000", self.expected(terms))]

        async def run():
            host, port = self.master.rsplit(":", 1)
            sock = socket.create_connection((host, int(port)))
            context = self.ssl_context()
            if context is None:
                stream = await capnp.AsyncIoStream.create_connection(sock=sock)
            else:
                # Every certificate of a cluster names the server `bitfold`.
                stream = await capnp.AsyncIoStream.create_connection(
                    sock=sock, ssl=context, server_hostname="bitfold"
                )
            try:
                master = capnp.TwoPartyClient(stream).bootstrap().cast_as(schema.Master)
                answers = []
                for message, _ in asked + [("R:5-", None), ("P:4", None)]:
                    for form in ["count", "words", "roaring"]:
                        response = await master.query(message=message, format=form)
                        answers.append(response.result)
                return answers
            finally:
                # pycapnp's `close` only starts a TLS shutdown: wait for the socket.
                stream.close()
                for _ in range(100):
                    if sock.fileno() == -1:
                        break
                    await asyncio.sleep(0.01)
                sock.close()

        answers = asyncio.run(capnp.run(run()))
        for i, (message, expected) in enumerate(asked):
            count, words, roaring = answers[3 * i : 3 * i + 3]
            self.assertEqual(count.which(), "count", message)
            self.assertEqual(count.count, len(expected), message)
            self.assertEqual(words.which(), "words", message)
            self.assertEqual(words_to_bits(bytes(words.words)), expected, message)
            self.assertEqual(roaring.which(), "roaring", message)
            self.assertEqual(set(BitMap.deserialize(bytes(roaring.roaring))), expected, message)
        bad, missing = answers[6], answers[9]
        self.assertEqual(bad.which(), "error")
        self.assertEqual(bad.error.kind, "badQuery")
        self.assertIn("at byte 4", bad.error.message)
        self.assertEqual(missing.which(), "error")
        self.assertEqual(missing.error.kind, "notFound")


def one_slave(test):
    """Starts one slave for `test` in a temporary directory, both stopped and
    removed when it ends (its servers are `test.servers`): the directory and
    the slave's address."""
    test.servers = []
    test.tmp = tempfile.TemporaryDirectory()
    test.addCleanup(test.tmp.cleanup)
    test.addCleanup(lambda: [server.stop() for server in test.servers])
    tmp = Path(test.tmp.name)
    slave = start(
        ["slave", "--listen", "127.0.0.1:0", "--data-dir", str(tmp / "s0")],
        "slave",
        test.servers,
        tmp / "s0.log",
    )
    return tmp, slave


class OneSlaveTest(unittest.TestCase):
    """A master and one slave, started for each test."""

    def setUp(self):
        tmp, slave = one_slave(self)
        (tmp / "cluster.toml").write_text(f'[[slaves]]\nname = "s0"\naddr = "{slave}"\n')
        self.master_args = ["master", "--cluster", str(tmp / "cluster.toml"), "--listen"]
        self.master = start(
            [*self.master_args, "127.0.0.1:0"], "master", self.servers, tmp / "master.log"
        )


class MasterRestartTest(OneSlaveTest):
    """A client outlives its master: once the master is back (on the same
    address), the next call connects again."""

    def test_a_restarted_master_is_reached_again(self):
        with bitfold_client.Client(self.master) as client:
            self.assertEqual(client.import_vectors({3: BitMap([1, 2, 3])}), 1)
            self.assertEqual(client.query("P:3"), 3)
            master = self.servers.pop()
            master.stop()
            down = None
            for _ in range(50):  # until the client has seen the connection close
                try:
                    client.query("P:3")
                except bitfold_client.Error as err:
                    down = err
                    break
                time.sleep(0.1)
            self.assertIsNotNone(down, "the killed master still answered")
            self.assertEqual(down.kind, "connection")
            self.assertIn(self.master, down.message)
            start(
                [*self.master_args, self.master],
                "master",
                self.servers,
                Path(self.tmp.name) / "master-again.log",
            )
            self.assertEqual(set(client.query("P:3", output="bitmap")), {1, 2, 3})


class ThreeMastersTest(unittest.TestCase):
    """Three masters replicating their records (docs/protocol.md §12), each
    its own process: the leader is killed, and the client carries on with
    the one elected next, every acknowledged write still there."""

    def setUp(self):
        tmp, slave = one_slave(self)
        first = free_ports(3)
        self.addrs = [f"127.0.0.1:{first + i}" for i in range(3)]
        masters = "".join(
            f'\n[[masters]]\nname = "m{i}"\naddr = "{addr}"\n' for i, addr in enumerate(self.addrs)
        )
        cluster = tmp / "cluster.toml"
        cluster.write_text(f'[[slaves]]\nname = "s0"\naddr = "{slave}"\n{masters}')
        for i in range(3):
            start(
                ["master", "--cluster", str(cluster), "--name", f"m{i}"],
                "master",
                self.servers,
                tmp / f"m{i}.log",
            )
        self.masters = ",".join(self.addrs)

    def leader(self):
        """The address of the master that leads, once `bitfold status` says
        all three vote (one started last may still be joining as a new
        member, and a fault before it has would leave no majority)."""
        for _ in range(600):
            run = subprocess.run(
                [str(BINARY), "status", "--master", self.masters],
                capture_output=True,
                text=True,
            )
            masters = [line.split() for line in run.stdout.splitlines() if line.startswith("master ")]
            states = [words[3] for words in masters]
            voting = [state for state in states if state in ("leader", "follower")]
            if len(states) == 3 and len(voting) == 3 and states.count("leader") == 1:
                return next(words[2] for words in masters if words[3] == "leader")
            time.sleep(0.1)
        self.fail(f"the masters do not all vote: {run.stdout}{run.stderr}")

    def test_a_killed_leader_is_replaced_and_nothing_acknowledged_is_lost(self):
        # An election may take up to about 6 s on a busy machine.
        with bitfold_client.Client(self.masters, failover=20.0) as client:
            leader = self.leader()
            self.assertEqual(client.import_vectors({3: BitMap([1, 2, 3])}), 1)
            self.servers[1 + self.addrs.index(leader)].stop()
            self.assertEqual(set(client.query("P:3", output="bitmap")), {1, 2, 3})
            self.assertEqual(client.import_vectors({4: BitMap([7])}), 1)
            self.assertEqual(client.query("R:3-4"), 4)


NO_LEADER = "not the leader: no master leads now (an election is under way)"


@contextlib.contextmanager
def fake_master(says, refusals=None):
    """The address of a master served here that is not the leader: it
    answers every query and import `notLeader` with the message `says`
    (after `refusals` calls, if given, it leads: it answers `notFound`).
    Yields the address and a list that gets one entry per call."""
    calls = []

    def refuse(error):
        calls.append(None)
        if refusals is not None and len(calls) > refusals:
            error.kind = "notFound"
            error.message = "vector 3 not found"
            return
        error.kind = "notLeader"
        error.message = says

    class Fake(bitfold_client._schema.SCHEMA.Master.Server):
        async def query(self, _context, **kwargs):
            refuse(_context.results.result.init("error"))

        async def import_(self, _context, **kwargs):
            refuse(_context.results.outcome.init("error"))

    # `import` is a Python keyword: pycapnp looks the method up by its schema name.
    setattr(Fake, "import", Fake.import_)
    servers = []

    async def serve():
        async def serve_connection(stream):
            await capnp.TwoPartyServer(stream, bootstrap=Fake()).on_disconnect()

        server = await capnp.AsyncIoStream.create_server(serve_connection, "127.0.0.1", 0)
        servers.append(server)
        return "127.0.0.1:%d" % server.sockets[0].getsockname()[1]

    async def stop():
        for server in servers:
            server.close()

    runner = Runner(stop)
    try:
        yield runner.run(serve()), calls
    finally:
        runner.stop()


class NotLeaderTest(OneSlaveTest):
    """Several masters, some not the leader (fakes served here), the leader
    a real master."""

    def test_a_master_that_is_not_the_leader_sends_calls_to_the_one_it_names(self):
        named = f"not the leader: master m2 at {self.master} leads"
        with fake_master(named) as (follower, asked), fake_master(NO_LEADER) as (other, skipped):
            with bitfold_client.Client([follower, other, self.master]) as client:
                self.assertEqual(client.import_vectors({3: BitMap([1, 2, 3])}), 1)
                self.assertEqual(client.query("P:3"), 3)
            self.assertEqual(len(asked), 1, "the follower is asked once, then left")
            self.assertEqual(skipped, [], "the leader named is asked next")

    def test_while_no_master_leads_a_call_fails_unavailable(self):
        refused = refused_address()
        with fake_master(NO_LEADER) as (follower, asked):
            with bitfold_client.Client([refused, follower], failover=0.8) as client:
                began = time.monotonic()
                with self.assertRaises(bitfold_client.Error) as caught:
                    client.query("P:3")
                took = time.monotonic() - began
            with bitfold_client.Client(follower, failover=0.8) as alone:
                asked.clear()
                began = time.monotonic()
                with self.assertRaises(bitfold_client.Error) as single:
                    alone.query("P:3")
                alone_took = time.monotonic() - began
        failed = caught.exception
        self.assertEqual(failed.kind, "unavailable", failed.message)
        self.assertTrue(failed.message.startswith("unavailable: no master leads: "), failed.message)
        self.assertIn(f"{refused}: connection refused", failed.message)
        self.assertIn(f"{follower}: {NO_LEADER}", failed.message)
        self.assertEqual(failed.failed_machines, [refused, follower])
        self.assertGreaterEqual(len(asked), 2, "the masters were tried again")
        self.assertTrue(0.8 <= took < 30, took)
        # A single master is asked again for the failover window; then its
        # answer is the caller's to see.
        refusal = single.exception
        self.assertEqual((refusal.kind, refusal.message), ("notLeader", NO_LEADER))
        self.assertGreaterEqual(len(asked), 2, "the single master was asked again")
        self.assertTrue(0.8 <= alone_took < 30, alone_took)

    def test_a_single_master_is_asked_again_until_one_leads(self):
        """A DBMS given one master of several (which sends calls on to the
        leader) gets the leader's answer once one leads, not `notLeader`."""
        with fake_master(NO_LEADER, refusals=3) as (master, asked):
            with bitfold_client.Client(master, failover=20) as client:
                with self.assertRaises(bitfold_client.Error) as caught:
                    client.query("P:3")
        self.assertEqual(caught.exception.kind, "notFound", caught.exception.message)
        self.assertEqual(len(asked), 4, "asked until it answered as the leader")


class TlsDbmsTest(DbmsTest):
    """The same over mutual TLS to a cluster of `bitfold up --tls`, whose
    every link (master to slaves, slave to slave) runs TLS too."""

    @classmethod
    def _start_servers(cls, tmp):
        port = free_ports(4)
        cls.master = start(
            ["up", "--tls", "--dir", str(tmp / "cluster"), "--port", str(port), "--replicas", "2"],
            "master",
            cls.servers,
            tmp / "up.log",
        )
        cls.tls = tmp / "cluster" / "tls" / "reader"
        cls.admin_tls = tmp / "cluster" / "tls" / "admin"

    def test_a_reader_may_query_but_not_write(self):
        """A `reader` certificate queries; its imports, clears and deletes
        are refused as `forbidden`, naming the role they need, and change
        nothing."""
        vid = WRITES + 900
        refused = self.assert_fails("forbidden", self.client.import_vectors, {vid: [1]})
        self.assertIn("needs an admin certificate", refused.message)
        self.assertIn('the reader certificate "reader"', refused.message)
        self.assert_fails("forbidden", self.client.clear, {0: [1]})
        self.assert_fails("forbidden", self.client.delete, [(0, TOP)])
        self.assert_fails("notFound", self.client.query, f"P:{vid}")
        self.check("P:0", self.vectors[0])

    def test_a_client_without_a_certificate_is_refused(self):
        """A TLS client that trusts the CA but presents no certificate
        completes its side of the handshake (TLS 1.3), then the master
        closes the connection, within 10 s, answering nothing."""
        host, port = self.master.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            try:
                with self.ssl_context(certificate=False).wrap_socket(
                    sock, server_hostname="bitfold"
                ) as tls:
                    tls.sendall(b"\0" * 8)
                    received = tls.recv(1)  # a timeout fails the test
            except (ssl.SSLError, ConnectionError) as err:
                received = err
        self.assertTrue(received == b"" or isinstance(received, Exception), received)

    def test_a_plain_client_is_refused(self):
        # Asked at once, or once the master's close has arrived.
        for wait in [0, 0.5]:
            with bitfold_client.Client(self.master) as client:
                time.sleep(wait)
                refused = self.assert_fails("connection", client.query, "P:0")
            self.assertIn("tls=DIR", refused.message)

    def test_a_tls_folder_lacks_a_file(self):
        folder = Path(self.tmp.name) / "no-key"
        shutil.copytree(self.tls, folder, dirs_exist_ok=True)
        (folder / "key.pem").unlink()
        lacking = self.assert_fails("badArgument", bitfold_client.Client, self.master, tls=folder)
        self.assertIn(str(folder / "key.pem"), lacking.message)


if __name__ == "__main__":
    unittest.main()
