"""The client: one connection to a bitfold master, over Cap'n Proto RPC."""

import asyncio
import concurrent.futures
import os
import re
import socket
import ssl
import weakref
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

import capnp
import numpy as np
from pyroaring import BitMap

from . import _vectors
from ._errors import SERVER_KINDS, Error
from ._loop import Runner
from ._schema import SCHEMA

#: The name every certificate of a bitfold cluster carries, and the one a
#: client checks (docs/protocol.md §11).
SERVER_NAME = "bitfold"

#: The files of a TLS folder, as `bitfold ... --tls DIR` reads them.
CA_FILE, CERT_FILE, KEY_FILE = "ca.pem", "cert.pem", "key.pem"

#: How long a connection (and its TLS handshake) may take.
CONNECT_TIMEOUT = 10.0

#: How long a call may wait for its answer, as the Rust client's default.
DEFAULT_TIMEOUT = 60.0

#: How long a client given several masters tries them in turn while none
#: leads, from a call's first failure, as the Rust client's default.
DEFAULT_FAILOVER = 5.0

#: The pause after every master has been tried once in turn.
PAUSE = 0.15

#: How a master that is not the leader begins its message, in an error of
#: kind ``notLeader`` or a failed call (docs/protocol.md §5).
NOT_LEADER = "not the leader"

#: The most words pycapnp reads of one answer: the protocol's message bound
#: (2**27 words, docs/protocol.md §7) twice over, since reading a field
#: twice counts twice; pycapnp's default (64 MiB) is below large answers.
TRAVERSAL_LIMIT_WORDS = 2**28

OUTPUTS = {"count": "count", "bitmap": "roaring", "positions": "roaring"}


def parse_masters(masters: Union[str, Sequence[str]]) -> List[str]:
    """`masters` (one `HOST:PORT`, several separated by commas, or a list of
    them) as a list of addresses."""
    if isinstance(masters, str):
        items = masters.split(",")
    else:
        try:
            items = list(masters)
        except TypeError:
            raise Error(
                "badArgument",
                f"masters is a 'HOST:PORT' string, several separated by commas, or a list, "
                f"not {masters!r}",
            ) from None
    addresses = []
    for item in items:
        if not isinstance(item, str):
            raise Error("badArgument", f"a master's address is a 'HOST:PORT' string, not {item!r}")
        item = item.strip()
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise Error(
                "badArgument", f"bad master address {item!r}: give it as HOST:PORT, e.g. 127.0.0.1:7100"
            )
        addresses.append(item)
    if not addresses:
        raise Error("badArgument", "no master address given: pass e.g. '127.0.0.1:7100'")
    return addresses


def tls_context(folder: Union[str, os.PathLike]) -> ssl.SSLContext:
    """A context for mutual TLS with the files of a TLS folder: trusts its
    `ca.pem`, presents its `cert.pem` and `key.pem`, TLS 1.3 only."""
    folder = Path(folder)
    files = {name: folder / name for name in (CA_FILE, CERT_FILE, KEY_FILE)}
    for path in files.values():
        if not path.is_file():
            raise Error(
                "badArgument",
                f"cannot read {path}: no such file (a TLS folder holds {CA_FILE}, {CERT_FILE} "
                f"and {KEY_FILE}; `bitfold up --tls` writes DIR/tls/admin and DIR/tls/reader "
                "for clients)",
            )
    try:
        context = ssl.create_default_context(cafile=str(files[CA_FILE]))
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.load_cert_chain(files[CERT_FILE], files[KEY_FILE])
    except (ssl.SSLError, OSError) as err:
        raise Error(
            "badArgument",
            f"the certificate {files[CERT_FILE]}, its key {files[KEY_FILE]} and the CA "
            f"{files[CA_FILE]} are not usable together: {err}",
        ) from None
    return context


class _Lost(Exception):
    """A master that could not be reached or dropped the call: try the next."""


class _NotLeader(Exception):
    """A master that does not lead (its message): try the leader it names,
    or the next; a single master, again. ``answer`` is what the call gets
    if no master leads within the failover window: the ``notLeader``
    :class:`Error`, or None for a refused call."""

    def __init__(self, message: str, answer=None):
        super().__init__(message)
        self.answer = answer


class _Connection:
    """One connection to one master: the socket, pycapnp's stream on it, the
    RPC system and the master's capability."""

    def __init__(self, index, sock, stream, rpc, master):
        self.index = index
        self.sock = sock
        self.stream = stream
        self.rpc = rpc
        self.master = master
        # Whether the master answered a call on it: a plain connection cut
        # before any answer is what a master running TLS does to it.
        self.answered = False
        # Whether the master closed it (it stopped or restarted): the next
        # call connects again instead of failing on it.
        self.closed = False
        self.watch = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        try:
            await self.rpc.on_disconnect()
        except Exception:  # disconnected all the same
            pass
        self.closed = True

    def close(self) -> None:
        self.closed = True
        self.watch.cancel()
        for close in (self.rpc.close, self.stream.close):
            try:
                close()
            except Exception:  # closing what is already closed
                pass


class _Link:
    """The client's state on its loop thread: the masters, which one it
    uses, and its connection. Tries the masters in turn."""

    def __init__(self, masters: List[str], context: Optional[ssl.SSLContext], tls_folder):
        self.masters = masters
        self.context = context
        self.tls_folder = tls_folder
        self.current = 0
        self.connection: Optional[_Connection] = None
        self.lock: Optional[asyncio.Lock] = None

    async def connect(self, index: int) -> _Connection:
        addr = self.masters[index]
        host, _, port = addr.rpartition(":")
        host = host.strip("[]")
        loop = asyncio.get_running_loop()
        try:
            sock = await asyncio.wait_for(
                loop.run_in_executor(
                    None, lambda: socket.create_connection((host, int(port)), CONNECT_TIMEOUT)
                ),
                CONNECT_TIMEOUT + 1,
            )
        except asyncio.TimeoutError:
            raise _Lost(f"no answer within {CONNECT_TIMEOUT:g} s") from None
        except OSError as err:
            raise _Lost(describe_os_error(err)) from None
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            if self.context is None:
                stream = await capnp.AsyncIoStream.create_connection(sock=sock)
            else:
                stream = await asyncio.wait_for(
                    capnp.AsyncIoStream.create_connection(
                        sock=sock, ssl=self.context, server_hostname=SERVER_NAME
                    ),
                    CONNECT_TIMEOUT,
                )
        except asyncio.TimeoutError:
            sock.close()
            raise _Lost(f"the TLS handshake did not finish within {CONNECT_TIMEOUT:g} s") from None
        except ssl.SSLCertVerificationError as err:
            sock.close()
            raise _Lost(
                f"the TLS handshake failed: the master's certificate is not one the CA in "
                f"{Path(self.tls_folder) / CA_FILE} signed for the name {SERVER_NAME!r} "
                f"({err.verify_message})"
            ) from None
        except (ssl.SSLError, OSError) as err:
            sock.close()
            raise _Lost(f"the TLS handshake failed: {err}") from None
        rpc = capnp.TwoPartyClient(stream, traversal_limit_in_words=TRAVERSAL_LIMIT_WORDS)
        master = rpc.bootstrap().cast_as(SCHEMA.Master)
        return _Connection(index, sock, stream, rpc, master)

    def drop(self, connection: _Connection) -> None:
        if self.connection is connection:
            self.connection = None
        connection.close()

    async def close(self) -> None:
        if self.connection is not None:
            self.drop(self.connection)

    def lost_reason(self, connection: _Connection, err: "capnp.KjException") -> str:
        text = getattr(err, "description", None) or str(err)
        if connection.answered:
            return f"the connection was lost (did the master stop?): {text}"
        if self.context is None:
            return (
                f"the master closed the connection without answering (if it runs with --tls, "
                f"pass tls=DIR): {text}"
            )
        return f"the connection was lost: {text}"

    async def attempt(self, index: int, send, timeout: float):
        """`await send(master)` on a connection to master `index`. Raises
        :class:`_Lost` when it cannot be reached or drops the call, and
        :class:`_NotLeader` when it does not lead."""
        async with self.lock:
            connection = self.connection
            if connection is None or connection.index != index or connection.closed:
                if connection is not None:
                    self.drop(connection)
                connection = await self.connect(index)
                self.connection = connection
        try:
            answer = await asyncio.wait_for(send(connection.master), timeout)
        except asyncio.TimeoutError:
            self.drop(connection)
            raise _Lost(f"no answer within {timeout:g} s") from None
        except capnp.KjException as err:
            if err.type in ("DISCONNECTED",) or "disconnected" in str(err).lower():
                self.drop(connection)
                raise _Lost(self.lost_reason(connection, err)) from None
            text = getattr(err, "description", None) or str(err)
            refusal = text.removeprefix("remote exception: ")
            if refusal.startswith(NOT_LEADER):
                raise _NotLeader(refusal) from None
            raise Error(
                "protocol",
                f"the master at {self.masters[index]} failed the call: {text}",
            ) from None
        connection.answered = connection.answered or send is not _no_call
        if isinstance(answer, Error) and answer.kind == "notLeader":
            raise _NotLeader(answer.message, answer)
        return answer

    async def call(self, send, timeout: float, failover: float):
        """`await send(master)` on the master in use. When it cannot be
        reached, drops the call or is not the leader, the call goes to the
        next master (or the leader a `notLeader` message names); once each
        has failed in turn they are tried again after a short pause, until
        `failover` seconds have passed since the first failure. Then a
        `connection` error naming every master and why when none answered,
        or `unavailable` when one answered but none leads. A single master
        (which sends calls on to the leader) is tried once when it cannot be
        reached, and asked again while it answers that none leads, until
        `failover` has passed: then the call gets its `notLeader` answer."""
        if self.lock is None:
            self.lock = asyncio.Lock()
        loop = asyncio.get_running_loop()
        failures: Dict[int, str] = {}
        answered = False
        deadline = None
        attempts = 0
        while True:
            index = self.current
            try:
                return await self.attempt(index, send, timeout)
            except _Lost as lost:
                failures[index] = str(lost)
                leader = None
            except _NotLeader as refusal:
                failures[index] = str(refusal)
                answered = True
                leader = self.named_leader(str(refusal))
                # A leader named that has failed this call already (a
                # follower that still names a dead leader): the next in turn.
                if leader in failures:
                    leader = None
                if len(self.masters) == 1:
                    if deadline is None:
                        deadline = loop.time() + failover
                    if loop.time() < deadline:
                        await asyncio.sleep(PAUSE)
                        continue
                    if refusal.answer is not None:
                        return refusal.answer
            if deadline is None:
                deadline = loop.time() + (failover if len(self.masters) > 1 else 0)
            attempts += 1
            if self.current == index:
                following = (index + 1) % len(self.masters)
                self.current = leader if leader not in (None, index) else following
            if attempts >= len(self.masters) and loop.time() >= deadline:
                raise self.none_leads(failures, answered)
            if attempts % len(self.masters) == 0:
                await asyncio.sleep(min(PAUSE, max(0.0, deadline - loop.time())))

    def named_leader(self, message: str) -> Optional[int]:
        """The master whose address a `notLeader` message names as the leader."""
        for word in re.split(r"[\s,;()]+", message):
            if word in self.masters:
                return self.masters.index(word)
        return None

    def none_leads(self, failures: Dict[int, str], answered: bool) -> Error:
        """The error of a call no master answered as the leader."""
        where = "; ".join(f"{self.masters[i]}: {failures[i]}" for i in sorted(failures))
        if not answered:
            return Error(
                "connection",
                f"cannot reach a bitfold master ({where}); start one (`bitfold up`) or pass the "
                f"address it listens on",
            )
        return Error(
            "unavailable",
            f"unavailable: no master leads: {where} (start the masters that are down, or retry "
            f"once one leads)",
            [self.masters[i] for i in sorted(failures)],
        )


def describe_os_error(err: OSError) -> str:
    """Why a connection failed, in a few words."""
    if isinstance(err, ConnectionRefusedError):
        return "connection refused (is the master running there?)"
    if isinstance(err, socket.gaierror):
        return f"cannot resolve the host ({err.strerror})"
    if isinstance(err, socket.timeout):
        return f"no answer within {CONNECT_TIMEOUT:g} s"
    return err.strerror or str(err)


def _server_error(error) -> Error:
    """The `Error` struct the master answered as an :class:`Error`."""
    try:
        kind = str(error.kind)
    except Exception:  # an enumerant the bundled schema lacks: a newer master
        kind = f"#{getattr(error.kind, 'raw', error.kind)}"
    if kind not in SERVER_KINDS:
        return Error(
            "protocol",
            f"the master answered an error of a kind this client does not know ({kind}; "
            f"upgrade bitfold_client): {error.message}",
        )
    return Error(kind, str(error.message), [str(m) for m in error.failedMachines])


class Client:
    """A connection to a bitfold master (docs/protocol.md §5).

    ``masters`` is one ``"HOST:PORT"``, several separated by commas, or a
    list of them (the masters of a replicated cluster): the client connects
    to the first that answers and, when a connection fails, the master drops
    it or answers that it is not the leader, tries the next ones in turn (or
    the leader one names), again and again after a short pause while none
    leads, for up to ``failover`` seconds from the call's first failure.
    ``tls`` is a TLS folder as ``bitfold ... --tls DIR``
    takes it (``ca.pem``, ``cert.pem``, ``key.pem``; ``bitfold up --tls``
    writes ``DIR/tls/admin`` and ``DIR/tls/reader``) for a cluster that runs mutual TLS;
    without it the connection is plain TCP. ``timeout`` bounds each call
    to one master, in seconds.

    The constructor connects (TCP, then the TLS handshake) to the first
    master that takes the connection, and raises :class:`Error` (kind
    ``"connection"``) when none does; a master that takes connections but
    drops the first call is found out, and skipped, at that call. A client may be shared
    between threads; its connection runs on a thread of its own. Close it
    with :meth:`close` or use it in a ``with`` block.

    Writes are safe to run again after any failure (an import is an OR, a
    clear and a delete do nothing the second time), so a call whose
    connection was lost is sent again to the next master.
    """

    def __init__(
        self,
        masters: Union[str, Sequence[str]],
        tls: Optional[Union[str, os.PathLike]] = None,
        timeout: float = DEFAULT_TIMEOUT,
        failover: float = DEFAULT_FAILOVER,
    ):
        self.masters = parse_masters(masters)
        self.tls = None if tls is None else Path(tls)
        self.timeout = timeout
        self.failover = failover
        context = None if tls is None else tls_context(tls)
        self._link = _Link(self.masters, context, self.tls)
        self._runner = Runner(self._link.close)
        self._closer = weakref.finalize(self, self._runner.stop)
        try:
            self._runner.run(self._link.call(_no_call, self.timeout, self.failover))
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Closes the connection and stops the client's thread. Later calls fail."""
        self._closer()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _run(self, send):
        if not self._closer.alive or not self._runner.running():
            raise Error("connection", "this bitfold Client is closed: make a new one")
        try:
            return self._runner.run(self._link.call(send, self.timeout, self.failover))
        except concurrent.futures.CancelledError:
            raise Error("connection", "this bitfold Client was closed during the call") from None

    def query(self, q: str, output: str = "count"):
        """Runs the query message ``q`` (``"P:vid"`` or ``"R:t1&t2&..."``,
        docs/protocol.md §2) and answers it as ``output`` says:
        ``"count"`` the number of set bits (an ``int``), ``"bitmap"`` a
        pyroaring ``BitMap``, ``"positions"`` a numpy ``uint32`` array of the
        set bit positions, ascending."""
        if output not in OUTPUTS:
            raise Error(
                "badArgument",
                f"unknown output {output!r}: use 'count', 'bitmap' or 'positions'",
            )
        if not isinstance(q, str):
            raise Error("badArgument", f"a query is a str such as 'P:7' or 'R:0-9&20', not {q!r}")
        form = OUTPUTS[output]

        async def send(master):
            response = await master.query(message=q, format=form)
            result = response.result
            which = result.which()
            if which == "error":
                return _server_error(result.error)
            if which != form:
                return Error("protocol", f"asked for {form}, the master answered {which}")
            return int(result.count) if which == "count" else bytes(result.roaring)

        answer = self._run(send)
        if isinstance(answer, Error):
            raise answer
        if output == "count":
            return answer
        try:
            bitmap = BitMap.deserialize(answer)
        except Exception as err:
            raise Error("protocol", f"the master's roaring answer cannot be read: {err}") from None
        if output == "bitmap":
            return bitmap
        return np.asarray(bitmap.to_array(), dtype=np.uint32)

    def import_vectors(self, vectors: _vectors.VectorsArg) -> int:
        """Sets the bits of every vector: ``{vid: BitMap}`` (or ``(vid,
        BitMap)`` pairs; a set or list of bit positions works as a
        ``BitMap``). Each vector becomes the union of what it held and these
        bits, durably on all of its owners once this returns.

        Returns the number of vectors imported: the vids given at least one
        bit. The master's ``import`` answers only that it is done, so this
        does not say whether the bits were new. A large batch travels as
        several messages; if one fails, the earlier ones stay applied
        (importing again is harmless)."""
        return self._write("import", _vectors.encode_vectors(vectors))

    def clear(self, vectors: _vectors.VectorsArg) -> int:
        """Clears the given bits of every vector that exists (``{vid:
        BitMap}``, as for :meth:`import_vectors`); a vector keeps existing,
        possibly empty. Returns the number of vectors that lost a bit, as the
        master counts them (docs/protocol.md §8)."""
        return self._write("clear", _vectors.encode_vectors(vectors))

    def delete(self, spans: Iterable[Union[int, Tuple[int, int]]]) -> int:
        """Deletes every existing vector whose vid lies in one of ``spans``:
        vids and ``(first, last)`` pairs, inclusive (``[7, (10, 19)]``).
        Returns the number of vectors deleted, as the master counts them;
        deleting what does not exist is not an error."""
        spans = _vectors.encode_spans(spans)
        changed = 0
        for i in range(0, len(spans), _vectors.MAX_DELETE_SPANS):
            chunk = spans[i : i + _vectors.MAX_DELETE_SPANS]

            async def send(master, chunk=chunk):
                request = master.delete_request()
                listed = request.init("spans", len(chunk))
                for entry, (first, last) in zip(listed, chunk):
                    entry.first = first
                    entry.last = last
                return _changed(await request.send())

            changed += self._answer(self._run(send))
        return changed

    def _write(self, method: str, encoded) -> int:
        imported = len({vid for vid, _ in encoded})
        changed = 0
        for batch in _vectors.batches(encoded):

            async def send(master, batch=batch):
                request = getattr(master, f"{method}_request")()
                _fill_vectors(request.init("vectors", len(batch)), batch)
                response = await request.send()
                if method == "import":
                    return _imported(response)
                return _changed(response)

            changed += self._answer(self._run(send))
        return imported if method == "import" else changed

    @staticmethod
    def _answer(answer):
        if isinstance(answer, Error):
            raise answer
        return answer

    def __repr__(self) -> str:
        tls = f", tls={str(self.tls)!r}" if self.tls is not None else ""
        return f"bitfold_client.Client({','.join(self.masters)!r}{tls})"


async def _no_call(master):
    """The constructor's call: only connects."""
    return None


def _fill_vectors(listed, batch) -> None:
    for entry, (vid, parts) in zip(listed, batch):
        entry.vid = vid
        for built, part in zip(entry.init("parts", len(parts)), parts):
            built.denseKeys = part.dense_keys
            built.denseWords = part.dense_words
            built.sparseKeys = part.sparse_keys
            built.sparseEnds = part.sparse_ends
            built.sparseValues = part.sparse_values


def _imported(response):
    outcome = response.outcome
    which = outcome.which()
    if which == "ok":
        return 0
    if which == "error":
        return _server_error(outcome.error)
    return Error("protocol", f"the master answered an import with {which!r}")


def _changed(response):
    outcome = response.outcome
    which = outcome.which()
    if which == "changed":
        return int(outcome.changed)
    if which == "error":
        return _server_error(outcome.error)
    return Error("protocol", f"the master answered an update with {which!r}")
