# bitfold's wire protocol.
#
# The first part is the DBMS interface (docs/protocol.md §5): its names, ordinals and
# types are fixed; a DBMS in any language needs this file and nothing else.
# Everything after it (more `Master` methods, the `Slave` interface and the
# structures they use) is bitfold's own and may change between versions.

@0xb2e5f52968aba00a;

# ---------------------------------------------------------------------------
# The DBMS interface (fixed).

interface Master {
  query @0 (message :Text, format :Format) -> (result :Result);
  # Answers a `P:vid` or `R:t1&t2&...` query message in `format`.

  import @1 (vectors :List(VidVector)) -> (outcome :Outcome);
  # Sets the bits of every vector on all of its owners, then records the
  # vids durably; `ok` means every owner and the catalog hold them.

  status @2 () -> (slaves :List(SlaveStatus), certificateNotAfter :Int64,
                   masters :List(MasterStatus));
  # The state of every slave of the cluster, in cluster file order, and
  # when the master's TLS certificate expires (Unix seconds; 0 without TLS).
  # `masters` lists every master of a replicated cluster as the one that
  # answers sees them (empty with a single master).

  clear @3 (vectors :List(VidVector)) -> (outcome :UpdateOutcome);
  # Clears the listed bits of every vector that exists (docs/protocol.md §8):
  # the vector keeps existing, possibly empty. `changed` counts the vectors
  # that lost a bit.

  delete @4 (spans :List(VidSpan)) -> (outcome :UpdateOutcome);
  # Deletes every existing vector whose vid lies in one of the spans;
  # `changed` counts them.

  rebalance @5 (most :UInt32) -> (outcome :MoveOutcome);
  # Moves up to `most` vectors towards the layout of the master's cluster
  # file (docs/protocol.md §9); call it until `finished`.

  placement @6 () -> (report :PlacementReport);
  # How well the vectors are placed: copies missing, a move in progress.

  raft @7 (request :Data) -> (reply :Data);
  # One Raft message from another master of a replicated cluster (a vote,
  # entries to append or a snapshot's chunk) and its answer, both encoded
  # by `bitfold-quorum` (docs/protocol.md §12). Masters only.

  forwarding @8 () -> ();
  # Marks this connection as one another master forwards its own clients'
  # calls on (docs/protocol.md §12): they are never forwarded again, and
  # their callers' roles were checked where they arrived. Masters only.
}

enum Format { words @0; roaring @1; count @2; }

struct Result {
  union {
    words   @0 :Data;
    roaring @1 :Data;
    count   @2 :UInt64;
    error   @3 :Error;
  }
}

struct Error {
  kind @0 :ErrorKind;
  message @1 :Text;
  failedMachines @2 :List(Text);
}

enum ErrorKind { badQuery @0; notFound @1; unavailable @2; internal @3; tooLarge @4; forbidden @5; notLeader @6; }
# `notLeader`: the master called is one of several and does not lead now;
# nothing was done. Its message names the leader when it knows one; a
# client tries the next master.

# ---------------------------------------------------------------------------
# bitfold's own structures.

struct Part {
  # A piece of a vector: roaring-style containers, dense ones as 64-bit
  # words. Every field is little-endian and read in place (zero-copy).
  denseKeys @0 :Data;     # u16 per dense container, ascending
  denseWords @1 :Data;    # u64, 1024 per dense container, in key order
  sparseKeys @2 :Data;    # u16 per sparse container, ascending
  sparseEnds @3 :Data;    # u32 end offset of each sparse container in sparseValues
  sparseValues @4 :Data;  # u16 positions, ascending within a container
  fullKeys @5 :Data;      # u16 per all-ones container, ascending; only in
                          # partial results and term vectors, and then the
                          # part holds no other container
  holeKeys @6 :Data;      # u16 per nearly-full container, ascending; only in
                          # partial results and term vectors, and then the
                          # part holds no other container
  holeEnds @7 :Data;      # u32 end offset of each nearly-full container in holeValues
  holeValues @8 :Data;    # u16 positions of its zero bits, ascending within a container
}

struct VidVector {
  # One vector and its vid. The parts of a vector have ascending,
  # key-disjoint ranges.
  vid @0 :UInt64;
  parts @1 :List(Part);
}

struct Outcome {
  union {
    ok @0 :Void;
    error @1 :Error;
  }
}

struct VidSpan {
  # The vids `first ..= last` (inclusive; `first <= last`).
  first @0 :UInt64;
  last @1 :UInt64;
}

struct UpdateOutcome {
  union {
    changed @0 :UInt64;   # how many vectors the update changed
    error @1 :Error;
  }
}

struct MoveProgress {
  done @0 :UInt64;          # vids of the catalog the move has gone through
  total @1 :UInt64;         # vids in the catalog
  copied @2 :UInt64;        # vectors this call copied to a new owner
  copiedBytes @3 :UInt64;   # their bytes
  removed @4 :UInt64;       # surplus copies this call removed
  finished @5 :Bool;        # every vector is on exactly its owners under the cluster file
}

struct MoveOutcome {
  union {
    progress @0 :MoveProgress;
    error @1 :Error;
  }
}

struct PlacementReport {
  vectors @0 :UInt64;           # vectors in the catalog
  underReplicated @1 :UInt64;   # vectors with fewer than `replicas` copies a query may read
  lost @2 :UInt64;              # vectors no live owner holds
  misplaced @3 :UInt64;         # vectors not yet on their owners under the cluster file
  moving @4 :Bool;              # a move (`rebalance`) is in progress
  moveDone @5 :UInt64;          # vids the move has gone through
}

struct SlaveStatus {
  name @0 :Text;
  addr @1 :Text;
  up @2 :Bool;
  sinceUnixMillis @3 :Int64;   # when the slave was last seen going up or down
  vectors @4 :UInt64;
  bytes @5 :UInt64;
  reason @6 :Text;             # why it is down; empty when up
  readBytes @7 :UInt64;        # bytes of vectors its folds read since it started
  sentBytes @8 :UInt64;        # bytes it sent to other processes since it started
  certificateNotAfter @9 :Int64;  # when its TLS certificate expires (Unix seconds;
                                  # 0 without TLS or not known yet)
}

struct MasterStatus {
  # One master of a replicated cluster, as the master answering sees it.
  name @0 :Text;
  addr @1 :Text;
  state @2 :Text;      # "leader", "follower", "learner" or "down"
  logIndex @3 :UInt64; # the last log entry it holds (the leader's own; a
                       # follower's as far as the leader knows it matches)
  applied @4 :UInt64;  # the last entry the answering master applied (its own only)
  term @5 :UInt64;     # the term the answering master is in
  reason @6 :Text;     # why it is down; empty otherwise
}

struct Machine {
  # An entry of a chain's machine table.
  name @0 :Text;
  addr @1 :Text;
  session @2 :UInt64;  # the slave process the master checked there (`StoreState`):
                       # a slave refuses a call meant for another, so that a
                       # restarted one (perhaps wiped, replaced or restored from
                       # a backup) is read only once the master has checked its store
}

struct MachineVecNode {
  # machine_vec_node (docs/slave-protocol.md S3): vector `vid` held by `machines[machine]`,
  # and the `more` vectors after it: the run of vids `vid ..= vid + more`.
  machine @0 :UInt32;
  vid @1 :UInt64;
  more @2 :UInt32;
}

struct FailedMachine {
  # failed_machine (docs/slave-protocol.md S5): a machine that did not answer, and why.
  name @0 :Text;
  addr @1 :Text;
  reason @2 :Text;
}

struct QueryReturnValue {
  # query_return_value (docs/slave-protocol.md S1): the chain's vector, or the machine that failed.
  union {
    vector @0 :List(Part);
    failedMachine @1 :FailedMachine;
  }
}

enum Want { vector @0; count @1; }

struct CoordinateResult {
  union {
    vector @0 :List(Part);
    count @1 :UInt64;
    failedMachines @2 :List(FailedMachine);
  }
}

enum PlanKind {
  # How a coordinator gathers each term's vector.
  chain @0;   # one handler chain per term, machine to machine (the design document's plan)
  fanOut @1;  # each machine ORs its vids of every term and answers the coordinator
}

struct GatherResult {
  union {
    terms @0 :List(List(Part));  # per term asked, the OR of this machine's vectors of it
    missing @1 :UInt64;          # a vid asked for that this machine does not hold
  }
}

struct Change {
  # One change to one vector, as the master sends it to an owner.
  vid @0 :UInt64;
  union {
    clear @1 :List(Part);     # remove these bits; the vector keeps existing
    delete @2 :Void;          # remove the vector
    replace @3 :List(Part);   # make the vector exactly these bits (a repair's copy)
    set @4 :List(Part);       # set these bits (an import, as the master's journal
                              # holds it; it travels to a slave as `import`)
  }
}

struct ChangeResult {
  union {
    changed @0 :Data;    # the vids this slave changed, u64 little-endian, ascending
    error @1 :Text;
    refused @2 :Text;    # not applied, by the fence: the write is for another
                         # session, or a master of a later epoch has written here
  }
}

struct Stamp {
  # A master's write as a slave's fence sees it (docs/slave-protocol.md S7): the
  # slave process it is for, the master's epoch and the write's place in
  # the master's order.
  session @0 :UInt64;
  epoch @1 :UInt64;
  write @2 :UInt64;   # grows with every write, across the master's restarts
  piece @3 :UInt64;   # the piece of a write sent in several, from 0
}

struct StoreState {
  # Who a slave is and how far the master's writes have reached its store.
  store @0 :UInt64;    # made when its data directory was created
  session @1 :UInt64;  # made when the process started
  epoch @2 :UInt64;    # the newest master epoch whose write it applied
  write @3 :UInt64;    # the last write it applied, and its piece
  piece @4 :UInt64;
}

struct PendingUpdate {
  # An update the master has recorded and some owners have not yet
  # acknowledged: its journal entry in the master's data directory.
  id @0 :UInt64;
  waiting @1 :List(UInt32);   # the owners (cluster file index) still to apply it
  changes @2 :List(Change);   # every change, in order, for every owner
}

struct Ledger {
  # The master's record of its epoch, of the write numbers it has given out
  # and of the store it checked on each slave: its data directory's `ledger`.
  epoch @0 :UInt64;            # the epoch of the master that wrote it
  nextWrite @1 :UInt64;        # no write was given this number or a later one
  slaves @2 :List(SlaveStore);
}

struct SlaveStore {
  name @0 :Text;       # the slave, by its name in the cluster file
  store @1 :UInt64;    # the store it holds every vector it owns in
  applied @2 :UInt64;  # a write that store is known to have applied
}

struct MissedWrites {
  # The vectors a failed import may have left different on some of their
  # owners, until they are copied back to them: the master's record in its
  # data directory, so that a restarted master does not read them there.
  slaves @0 :List(MissedBy);
}

struct MissedBy {
  name @0 :Text;          # the slave, by its name in the cluster file
  vids @1 :List(UInt64);  # the vectors it may hold without a failed import's bits
}

enum HopKind {
  # What a machine did for a query, in a hop report.
  handle @0;  # a hop of a term's chain: ORed its run of vids into the partial result
  gather @1;  # its part of a fan-out: ORed its vids of every term
  and @2;     # the coordinator's AND (or count) of the term vectors
}

struct Hop {
  # One machine's work for one query, reported back with the answer when
  # the call asks for it (`report`), for the master's slow-query log.
  machine @0 :UInt32;     # the machine: an index into the query's machine table
                          # (a `gather` reply leaves it 0; the coordinator knows whom it asked)
  kind @1 :HopKind;
  term @2 :UInt32;        # for a `handle` hop, its term's chain: an index into
                          # `coordinate`'s `chains` (the coordinator sets it); else 0
  vids @3 :UInt64;        # vids it was asked to read (0 for `and`)
  readBytes @4 :UInt64;   # bytes of vectors it read: stored ones, or for `and` the term vectors
  sentBytes @5 :UInt64;   # bytes of the vector (or count) it sent on: to the next
                          # machine, the coordinator, or the master
  micros @6 :UInt64;      # its own time, from the call's arrival (or the step's
                          # start) until it sent on, in microseconds
}

struct FetchResult {
  union {
    vector @0 :List(Part);
    count @1 :UInt64;
    notFound @2 :Void;
  }
}

struct PullOutcome {
  # How a `pull` ended.
  union {
    done @0 :Void;
    sourceFailed @1 :Text;   # `from` did not answer, or not as asked
    storeFailed @2 :Text;    # this slave could not store the copies
    refused @3 :Text;        # not stored, by the fence (see `ChangeResult.refused`)
    stale @4 :UInt64;        # not stored: this slave has applied a later write (this
                             # one) since the call was stamped; ask again, stamped anew
  }
}

struct FetchedCopies {
  # A reply of `fetchMany`: the first `answered` vids asked, each either in
  # `vectors` (in the order asked) or in `missing` (not held here).
  answered @0 :UInt32;
  vectors @1 :List(VidVector);
  missing @2 :Data;           # u64 little-endian, ascending
}

# ---------------------------------------------------------------------------
# The slave interface: what the master and other slaves call.

interface Slave {
  handle @0 (machines :List(Machine), chain :List(MachineVecNode), partial :List(Part),
             budgetMicros :UInt64, report :Bool) -> (result :QueryReturnValue, hops :List(Hop));
  # Handler: ORs the leading nodes of `chain` (those on the receiver, the
  # machine of the first node) into `partial`, forwards the rest of the chain
  # to the next machine and returns its answer; answers within `budgetMicros`.
  # With `report`, `hops` holds this hop and every hop after it, in chain order.

  coordinate @1 (machines :List(Machine), you :UInt32, chains :List(List(MachineVecNode)),
                 want :Want, budgetMicros :UInt64, plan :PlanKind, report :Bool)
                 -> (result :CoordinateResult, hops :List(Hop));
  # Coordinator (`machines[you]`): gets every term's vector, by one handler
  # chain per term in parallel or by one `gather` per machine (`plan`), and
  # ANDs the term vectors (or only counts the AND); returns every failed
  # machine. With `report`, `hops` holds every hop of the query: each chain's
  # (or each machine's gather), then the coordinator's AND.

  fetch @2 (vid :UInt64, want :Want, session :UInt64) -> (result :FetchResult);
  # Point query: the vector `vid` as this slave holds it, or its count.
  # Refused unless this slave's session is `session`.

  import @3 (vectors :List(VidVector), stamp :Stamp, stage :Bool)
      -> (outcome :Outcome, state :StoreState);
  # Sets the bits of every vector; `ok` once durable on this slave. Fenced:
  # an `error` unless `stamp.session` is this slave's and `stamp.epoch` is
  # not older than the newest it has applied; `ok` without applying it
  # again if this write (or a later one) is applied already. `state` is
  # the slave's after the call. With `stage`, the vectors are only written
  # (durably, but not yet read or counted as applied) until `commit` of
  # their write: the master writes its journal meanwhile.

  health @4 () -> (vectors :UInt64, bytes :UInt64, readBytes :UInt64, sentBytes :UInt64,
                   state :StoreState, certificateNotAfter :Int64);
  # Answers when the slave is alive: how many vectors and data bytes it
  # holds, and since it started, the bytes of vectors its folds read and
  # the bytes it sent to other processes; who it is and the last write it
  # applied; when its TLS certificate expires (Unix seconds; 0 without TLS).

  catalog @5 () -> (vids :Data);
  # Every vid this slave holds, ascending, as u64 little-endian.

  gather @6 (terms :List(Data), report :Bool, session :UInt64) -> (result :GatherResult, hop :Hop);
  # Fan-out: for each term, the OR of the vectors this slave holds among
  # the term's vids, one vector per term. A term's vids are runs, each two
  # u64 little-endian, `first` and `last`: ascending and disjoint. A reply
  # holds the first terms asked, in order: all of them, or as many as fit
  # in 64 MiB of vectors (at least one); the caller asks again for the rest.
  # With `report`, `hop` says what it read and sent, and its time.
  # Refused unless this slave's session is `session`.

  update @7 (changes :List(Change), stamp :Stamp) -> (result :ChangeResult, state :StoreState);
  # Applies every change, in order, atomically and durably; changes to
  # vectors this slave does not hold change nothing. Fenced as `import` is
  # (`refused`, or `changed` empty for a write applied already).

  fetchMany @8 (vids :Data, maxBytes :UInt64, session :UInt64) -> (copies :FetchedCopies);
  # Copies for a move or a refill: the vectors `vids` (u64 little-endian,
  # at most 65,536) as this slave holds them, in the order asked, until
  # the reply holds `maxBytes` of vector data (cut to 64 MiB; at least one
  # vector). Ask again with the vids after `answered` for the rest.
  # Refused unless this slave's session is `session`.

  pull @9 (from :Text, vids :Data, maxBytes :UInt64, stamp :Stamp, fromSession :UInt64)
      -> (answered :UInt32, vectors :UInt64, bytes :UInt64, outcome :PullOutcome,
          state :StoreState);
  # A move or a refill, copied straight from slave to slave: this slave
  # asks the slave at address `from` for the vectors `vids` with one
  # `fetchMany` (`vids` and `maxBytes` as there) and stores the first
  # `answered` exactly as `from` holds them (a replace; a vid `from` does
  # not hold is deleted here), durably, before it answers. Ask again with
  # the vids after `answered` for the rest. `vectors` and `bytes` count
  # what it stored, as the copies travelled. The copies are a write of the
  # master (`stamp`, fenced as `import` is) read from session `fromSession`.

  commit @10 (stamp :Stamp, pieces :UInt32) -> (outcome :Outcome, state :StoreState);
  # Applies, at once, the `pieces` pieces of write `stamp.write` staged
  # (`import` with `stage`, pieces 0 to `pieces - 1`), as the write
  # `stamp` (its piece 0), fenced as `import` is; an `error` unless every
  # one of them is staged.
}
