//! The placement the master's vectors were imported under, recorded in its
//! data directory (`placement.toml`, written through the engine's
//! [`Directory`]: staged, synced, renamed), so that a cluster file whose
//! `group` differs is refused instead of silently reading every vector from
//! the wrong slaves.

use bitfold_engine::store::Directory;

/// The file, in the master's data directory.
const FILE: &str = "placement.toml";

/// Checks `group` against the one recorded in `dir`, recording it when
/// nothing is recorded yet. A master that already holds vectors
/// (`has_vectors`) but no record placed them before `group` existed, with
/// `group = 1`.
pub(crate) fn check_group(
    dir: &dyn Directory,
    group: u64,
    has_vectors: bool,
) -> Result<(), String> {
    let path = dir.path(FILE);
    let listed = dir.list().map_err(|e| e.to_string())?;
    let recorded = if listed.iter().any(|name| name == FILE) {
        let bytes = dir.read(FILE).map_err(|e| e.to_string())?;
        let parsed = std::str::from_utf8(&bytes).ok().and_then(parse);
        Some(parsed.ok_or_else(|| {
            format!(
                "{} is not `group = N`; restore it (it records how the vectors were placed)",
                path.display()
            )
        })?)
    } else {
        None
    };
    let placed = recorded.or(has_vectors.then_some(1));
    match placed {
        Some(placed) if placed != group => Err(format!(
            "the cluster file says group = {group}, but this master's vectors were placed \
             with group = {placed}: set group = {placed} in the cluster file"
        )),
        Some(_) if recorded.is_some() => Ok(()),
        _ => record(dir, group).map_err(|e| e.to_string()),
    }
}

fn parse(text: &str) -> Option<u64> {
    let value = text.trim().strip_prefix("group")?.trim_start();
    value.strip_prefix('=')?.trim().parse().ok()
}

/// Writes the record durably.
fn record(dir: &dyn Directory, group: u64) -> Result<(), bitfold_engine::store::StoreError> {
    let mut file = dir.create(FILE)?;
    file.write_all(format!("group = {group}\n").as_bytes())?;
    file.commit()
}

#[cfg(test)]
mod tests {
    use super::*;
    use bitfold_engine::store::MemoryDirectory;

    #[test]
    fn the_first_group_is_recorded_and_a_different_one_refused() {
        let dir = MemoryDirectory::new();
        check_group(&dir, 16, false).unwrap();
        check_group(&dir, 16, true).unwrap();
        let refused = check_group(&dir, 1, true).unwrap_err();
        assert!(refused.contains("set group = 16"), "{refused}");
    }

    #[test]
    fn vectors_without_a_record_were_placed_with_group_one() {
        let dir = MemoryDirectory::new();
        let refused = check_group(&dir, 64, true).unwrap_err();
        assert!(refused.contains("set group = 1"), "{refused}");
        check_group(&dir, 1, true).unwrap();
        assert_eq!(&*dir.read(FILE).unwrap(), b"group = 1\n");
        let mut damaged = dir.create(FILE).unwrap();
        damaged.write_all(b"grup = 1").unwrap();
        damaged.commit().unwrap();
        assert!(
            check_group(&dir, 1, true)
                .unwrap_err()
                .contains("restore it")
        );
    }

    #[test]
    fn the_record_survives_a_reopen_on_disk() {
        let root = tempfile::tempdir().unwrap();
        {
            let dir = bitfold_engine::store::MmapDirectory::open(root.path()).unwrap();
            check_group(&dir, 64, false).unwrap();
        }
        let dir = bitfold_engine::store::MmapDirectory::open(root.path()).unwrap();
        assert!(
            check_group(&dir, 1, true)
                .unwrap_err()
                .contains("set group = 64")
        );
    }
}
