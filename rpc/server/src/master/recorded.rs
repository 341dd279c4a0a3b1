//! The layout the master's vectors were placed under (docs/protocol.md §4,
//! §9): the slaves in placement order with their addresses, `replicas`,
//! `group` and `piece`. It is recorded in the master's data directory
//! (`placement.toml`, written through the engine's [`Directory`]: staged,
//! synced, renamed), so that editing the cluster file never silently moves
//! where vectors are read from.
//!
//! Once vectors exist, the allowed edits of the cluster file are: append
//! slaves, change a slave's address (a new machine in its place), remove
//! slaves from the end, and change `replicas`. A new address is used at
//! once; the other edits change no placement by themselves (the master goes
//! on placing by the recorded layout until the vectors are moved). Any other
//! edit (renaming, reordering, removing from the middle, a new `group` or
//! `piece`) is refused with an error saying what is allowed. A record
//! written before pieces existed placed whole vectors (`piece = 2^32`).

use bitfold_engine::store::Directory;

use crate::cluster::{ClusterConfig, group_name};
use crate::pieces::WHOLE;
use crate::placement::GROUP_ALL;

/// The file, in the master's data directory.
const FILE: &str = "placement.toml";

/// The record of a move in progress (`rebalance`): the layout being moved
/// to and how far the move has gone.
const MOVE_FILE: &str = "move.toml";

/// What the allowed edits are, for error messages.
const ALLOWED: &str = "once vectors exist, the allowed edits of the cluster file are: append \
                       [[slaves]] entries, change a slave's addr, remove entries from the end, \
                       and change replicas";

/// The layout to place by, given the cluster `file` and what `dir`
/// records (recording it when it changed). A master that already holds
/// vectors (`has_vectors`) without a record placed them before `group`
/// existed, with `group = 1`, whole, on the file's slaves.
pub(crate) fn layout(
    dir: &dyn Directory,
    file: &ClusterConfig,
    has_vectors: bool,
) -> Result<ClusterConfig, String> {
    let path = dir.path(FILE);
    let recorded = if holds(dir, FILE)? {
        let bytes = dir.read(FILE).map_err(|e| e.to_string())?;
        let parsed = std::str::from_utf8(&bytes).ok().and_then(parse);
        Some(parsed.ok_or_else(|| {
            format!(
                "{} is not a placement record; restore it (it records how the vectors were \
                 placed)",
                path.display()
            )
        })?)
    } else {
        None
    };
    let layout = match &recorded {
        _ if !has_vectors => file.clone(),
        None | Some(Recorded::Group(_)) => {
            let placed = match recorded {
                Some(Recorded::Group(group)) => group,
                _ => 1,
            };
            check_group(file.group, placed)?;
            check_piece(file.piece, WHOLE)?;
            file.clone()
        }
        Some(Recorded::Layout(recorded)) => {
            check_group(file.group, recorded.group)?;
            check_piece(file.piece, recorded.piece)?;
            edited(recorded, file)?
        }
    };
    let unchanged = matches!(&recorded, Some(Recorded::Layout(r)) if *r == layout);
    if !unchanged {
        record(dir, &layout).map_err(|e| e.to_string())?;
    }
    Ok(layout)
}

/// Whether `dir` holds a file named `name`.
pub(crate) fn holds(dir: &dyn Directory, name: &str) -> Result<bool, String> {
    let names = dir.list().map_err(|e| e.to_string())?;
    Ok(names.iter().any(|n| n == name))
}

fn check_group(group: u64, placed: u64) -> Result<(), String> {
    if group == placed {
        return Ok(());
    }
    let written = |group: u64| match group {
        GROUP_ALL => "\"all\"".to_owned(),
        group => group_name(group),
    };
    let (group, placed) = (written(group), written(placed));
    Err(format!(
        "the cluster file says group = {group}, but this master's vectors were placed with \
         group = {placed}: set group = {placed} in the cluster file"
    ))
}

fn check_piece(piece: u64, placed: u64) -> Result<(), String> {
    if piece == placed {
        return Ok(());
    }
    Err(format!(
        "the cluster file says piece = {piece}, but this master's vectors were cut into pieces \
         of {placed} bits: set piece = {placed} in the cluster file"
    ))
}

/// A layout read from a record, which holds no `piece` if written before
/// pieces existed: those vectors were placed whole.
fn recorded_layout(mut table: toml::Table) -> Option<ClusterConfig> {
    table
        .entry("piece")
        .or_insert(toml::Value::Integer(WHOLE as i64));
    table.try_into().ok()
}

/// The recorded layout with the addresses of `file` (whose edit of it must
/// be allowed).
fn edited(recorded: &ClusterConfig, file: &ClusterConfig) -> Result<ClusterConfig, String> {
    for (i, (was, now)) in recorded.slaves.iter().zip(&file.slaves).enumerate() {
        if was.name != now.name {
            return Err(format!(
                "the cluster file has slave {:?} at position {}, where the vectors were placed \
                 on slave {:?}: {ALLOWED}",
                now.name,
                i + 1,
                was.name
            ));
        }
    }
    let mut layout = recorded.clone();
    for (slave, now) in layout.slaves.iter_mut().zip(&file.slaves) {
        slave.addr.clone_from(&now.addr);
    }
    layout
        .validate()
        .map_err(|why| format!("with the cluster file's addresses, {why}"))?;
    Ok(layout)
}

/// What a placement record says.
enum Recorded {
    /// A record written before layouts were recorded: only `group = N`.
    Group(u64),
    /// The whole layout.
    Layout(ClusterConfig),
}

fn parse(text: &str) -> Option<Recorded> {
    if let Some(layout) = toml::from_str(text).ok().and_then(recorded_layout) {
        return layout
            .validate()
            .is_ok()
            .then_some(Recorded::Layout(layout));
    }
    let value = text.trim().strip_prefix("group")?.trim_start();
    value
        .strip_prefix('=')?
        .trim()
        .parse()
        .ok()
        .map(Recorded::Group)
}

/// Writes the record durably.
pub(crate) fn record(
    dir: &dyn Directory,
    layout: &ClusterConfig,
) -> Result<(), bitfold_engine::store::StoreError> {
    let mut file = dir.create(FILE)?;
    file.write_all(layout.to_toml().as_bytes())?;
    file.commit()
}

/// The layout `file` asks vectors to move to from `current`, if its edit of
/// `current` is allowed: the file itself (its slaves, addresses, replicas).
pub(crate) fn target(
    current: &ClusterConfig,
    file: &ClusterConfig,
) -> Result<ClusterConfig, String> {
    check_group(file.group, current.group)?;
    check_piece(file.piece, current.piece)?;
    edited(current, file)?;
    Ok(file.clone())
}

/// A move in progress: the layout vectors move to, and the first vid not
/// yet copied.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Move {
    pub(crate) next: u64,
    pub(crate) target: ClusterConfig,
}

/// A move record as read: its target may be from before pieces existed.
#[derive(serde::Deserialize)]
struct MoveRecord {
    next: u64,
    target: toml::Table,
}

/// The move in progress, if `dir` records one. Its target must extend the
/// `current` layout as an allowed edit does (the same `group`, the same
/// slave at every position both have), or the record is refused as damaged;
/// it takes the cluster `file`'s addresses, as the current layout does, so
/// that a slave given a new machine while vectors move is reached there.
pub(crate) fn read_move(
    dir: &dyn Directory,
    current: &ClusterConfig,
    file: &ClusterConfig,
) -> Result<Option<Move>, String> {
    if !holds(dir, MOVE_FILE)? {
        return Ok(None);
    }
    let damaged = |why: &str| {
        format!(
            "{} is not a move record{why}; restore it, or remove it and run `bitfold \
             rebalance` again",
            dir.path(MOVE_FILE).display()
        )
    };
    let bytes = dir.read(MOVE_FILE).map_err(|e| e.to_string())?;
    let parsed = std::str::from_utf8(&bytes)
        .ok()
        .and_then(|text| toml::from_str::<MoveRecord>(text).ok())
        .and_then(|record| {
            Some(Move {
                next: record.next,
                target: recorded_layout(record.target)?,
            })
        });
    let Some(mut moving) = parsed.filter(|m| m.target.validate().is_ok()) else {
        return Err(damaged(""));
    };
    let extended = target(current, &moving.target)
        .map_err(|why| damaged(&format!(" of this master's placement ({why})")))?;
    moving.target = edited(&extended, file)
        .map_err(|why| format!("while vectors move (`bitfold rebalance`), {why}"))?;
    Ok(Some(moving))
}

/// Records the move's progress durably.
pub(crate) fn record_move(
    dir: &dyn Directory,
    moving: &Move,
) -> Result<(), bitfold_engine::store::StoreError> {
    let mut file = dir.create(MOVE_FILE)?;
    let text = toml::to_string(moving).expect("a move record always serialises");
    file.write_all(text.as_bytes())?;
    file.commit()
}

/// Forgets the move (it is complete), durably: a move record that came back
/// would move vectors again onto a layout already in force.
pub(crate) fn end_move(dir: &dyn Directory) -> Result<(), bitfold_engine::store::StoreError> {
    dir.delete(MOVE_FILE)?;
    dir.sync()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::SlaveEntry;
    use bitfold_engine::store::MemoryDirectory;

    fn cluster(slaves: &[(&str, &str)], replicas: usize, group: u64) -> ClusterConfig {
        ClusterConfig {
            replicas,
            piece: crate::pieces::DEFAULT_PIECE,
            group,
            slaves: slaves
                .iter()
                .map(|&(name, addr)| SlaveEntry {
                    name: name.into(),
                    addr: addr.into(),
                })
                .collect(),
        }
    }

    const THREE: [(&str, &str); 3] = [("s0", "h:1"), ("s1", "h:2"), ("s2", "h:3")];

    #[test]
    fn allowed_edits_keep_the_recorded_placement_and_take_new_addresses() {
        let dir = MemoryDirectory::new();
        let first = cluster(&THREE, 2, 16);
        assert_eq!(layout(&dir, &first, false).unwrap(), first);
        let appended = cluster(&[THREE[0], THREE[1], THREE[2], ("s3", "h:4")], 3, 16);
        assert_eq!(layout(&dir, &appended, true).unwrap(), first);
        let moved = cluster(&[THREE[0], ("s1", "elsewhere:2")], 1, 16);
        let placed = layout(&dir, &moved, true).unwrap();
        assert_eq!(
            placed.slaves.len(),
            3,
            "removed from the end, still placed on"
        );
        assert_eq!(placed.slaves[1].addr, "elsewhere:2");
        assert_eq!(placed.replicas, 2);
        let reread = layout(&dir, &first, true).unwrap();
        assert_eq!(
            reread.slaves[1].addr, "h:2",
            "the file's address is used again"
        );
    }

    #[test]
    fn other_edits_are_refused_saying_what_is_allowed() {
        let dir = MemoryDirectory::new();
        layout(&dir, &cluster(&THREE, 1, 16), false).unwrap();
        for refused in [
            cluster(&[THREE[1], THREE[0], THREE[2]], 1, 16),
            cluster(&[THREE[0], THREE[2]], 1, 16),
            cluster(&[THREE[0], ("t1", "h:2"), THREE[2]], 1, 16),
        ] {
            let why = layout(&dir, &refused, true).unwrap_err();
            assert!(why.contains("the allowed edits"), "{why}");
        }
        let why = layout(&dir, &cluster(&THREE, 1, 1), true).unwrap_err();
        assert!(why.contains("set group = 16"), "{why}");
        let clash = cluster(&[THREE[0], ("s1", "h:1"), THREE[2]], 1, 16);
        assert!(layout(&dir, &clash, true).unwrap_err().contains("unique"));
    }

    #[test]
    fn a_master_without_vectors_takes_any_file() {
        let dir = MemoryDirectory::new();
        layout(&dir, &cluster(&THREE, 1, 16), false).unwrap();
        let other = cluster(&[("a", "h:9")], 1, 4);
        assert_eq!(layout(&dir, &other, false).unwrap(), other);
    }

    #[test]
    fn a_group_only_record_and_no_record_are_read_as_before() {
        let dir = MemoryDirectory::new();
        let refused = layout(&dir, &cluster(&THREE, 1, 64), true).unwrap_err();
        assert!(refused.contains("set group = 1"), "{refused}");
        let mut old = dir.create(FILE).unwrap();
        old.write_all(b"group = 16\n").unwrap();
        old.commit().unwrap();
        assert!(
            layout(&dir, &cluster(&THREE, 1, 1), true)
                .unwrap_err()
                .contains("set group = 16")
        );
        let why = layout(&dir, &cluster(&THREE, 1, 16), true).unwrap_err();
        assert!(why.contains("set piece = 4294967296"), "{why}");
        let file = ClusterConfig {
            piece: WHOLE,
            ..cluster(&THREE, 1, 16)
        };
        assert_eq!(layout(&dir, &file, true).unwrap(), file);
        assert!(
            std::str::from_utf8(&dir.read(FILE).unwrap())
                .unwrap()
                .contains("[[slaves]]")
        );
        let mut damaged = dir.create(FILE).unwrap();
        damaged.write_all(b"grup = 1").unwrap();
        damaged.commit().unwrap();
        assert!(
            layout(&dir, &file, true)
                .unwrap_err()
                .contains("restore it")
        );
    }

    #[test]
    fn a_record_from_before_pieces_placed_whole_vectors_and_piece_is_kept() {
        let dir = MemoryDirectory::new();
        let cut = cluster(&THREE, 1, 16);
        layout(&dir, &cut, false).unwrap();
        let text = String::from_utf8(dir.read(FILE).unwrap().to_vec()).unwrap();
        assert!(text.contains("piece = 1048576"), "{text}");
        let why = layout(
            &dir,
            &ClusterConfig {
                piece: 1 << 16,
                ..cut.clone()
            },
            true,
        )
        .unwrap_err();
        assert!(why.contains("set piece = 1048576"), "{why}");
        let mut old = dir.create(FILE).unwrap();
        old.write_all(text.replace("piece = 1048576\n", "").as_bytes())
            .unwrap();
        old.commit().unwrap();
        let why = layout(&dir, &cut, true).unwrap_err();
        assert!(why.contains("set piece = 4294967296"), "{why}");
        let whole = ClusterConfig {
            piece: WHOLE,
            ..cut
        };
        assert_eq!(layout(&dir, &whole, true).unwrap(), whole);
    }

    #[test]
    fn a_move_record_reads_back_and_damage_is_refused() {
        let dir = MemoryDirectory::new();
        let current = cluster(&THREE, 1, 16);
        assert_eq!(read_move(&dir, &current, &current).unwrap(), None);
        let moving = Move {
            next: 77,
            target: cluster(&THREE, 2, 16),
        };
        record_move(&dir, &moving).unwrap();
        assert_eq!(read_move(&dir, &current, &current).unwrap(), Some(moving));
        // Vids are any u64, past what a TOML integer holds.
        let far = Move {
            next: u64::MAX - 1,
            target: cluster(&THREE, 2, 16),
        };
        record_move(&dir, &far).unwrap();
        assert_eq!(read_move(&dir, &current, &current).unwrap(), Some(far));
        end_move(&dir).unwrap();
        assert_eq!(read_move(&dir, &current, &current).unwrap(), None);
        let mut damaged = dir.create(MOVE_FILE).unwrap();
        damaged.write_all(b"next = 1").unwrap();
        damaged.commit().unwrap();
        assert!(
            read_move(&dir, &current, &current)
                .unwrap_err()
                .contains("rebalance")
        );
        let current = cluster(&THREE, 1, 16);
        let reordered = cluster(&[THREE[1], THREE[0]], 1, 16);
        assert!(
            target(&current, &reordered)
                .unwrap_err()
                .contains("allowed edits")
        );
        let grown = cluster(&[THREE[0], THREE[1], THREE[2], ("s3", "h:4")], 2, 16);
        assert_eq!(target(&current, &grown).unwrap(), grown);
    }

    #[test]
    fn a_move_takes_the_files_addresses_and_must_extend_the_placement() {
        let dir = MemoryDirectory::new();
        let current = cluster(&THREE, 1, 16);
        let grown = cluster(&[THREE[0], THREE[1], THREE[2], ("s3", "h:4")], 1, 16);
        record_move(
            &dir,
            &Move {
                next: 5,
                target: grown.clone(),
            },
        )
        .unwrap();
        // A new machine for s1 while vectors move to s3: both layouts reach it.
        let file = cluster(&[THREE[0], ("s1", "new:2"), THREE[2], ("s3", "h:4")], 1, 16);
        let moving = read_move(&dir, &current, &file).unwrap().unwrap();
        assert_eq!(moving.target.slaves[1].addr, "new:2");
        assert_eq!(moving.target.slaves[3].addr, "h:4");
        assert_eq!(moving.next, 5);
        let renamed = cluster(&[THREE[0], THREE[1], THREE[2], ("t3", "h:4")], 1, 16);
        let why = read_move(&dir, &current, &renamed).unwrap_err();
        assert!(
            why.contains("while vectors move") && why.contains("\"t3\""),
            "{why}"
        );
        // Records that do not extend the placement: another group, another slave.
        for target in [
            cluster(&[THREE[0], THREE[1], THREE[2], ("s3", "h:4")], 1, 64),
            cluster(&[THREE[0], ("x1", "h:2"), THREE[2]], 1, 16),
        ] {
            record_move(&dir, &Move { next: 0, target }).unwrap();
            let why = read_move(&dir, &current, &current).unwrap_err();
            assert!(
                why.contains("move.toml is not a move record of this master"),
                "{why}"
            );
            assert!(why.contains("run `bitfold rebalance` again"), "{why}");
        }
    }

    #[test]
    fn the_record_survives_a_reopen_on_disk() {
        let root = tempfile::tempdir().unwrap();
        {
            let dir = bitfold_engine::store::MmapDirectory::open(root.path()).unwrap();
            layout(&dir, &cluster(&THREE, 1, 64), false).unwrap();
        }
        let dir = bitfold_engine::store::MmapDirectory::open(root.path()).unwrap();
        let why = layout(&dir, &cluster(&THREE[..1], 1, 1), true).unwrap_err();
        assert!(why.contains("set group = 64"), "{why}");
    }
}
