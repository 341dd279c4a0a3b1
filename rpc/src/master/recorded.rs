//! The placement the master's vectors were imported under, recorded in its
//! data directory (`placement.toml`), so that a cluster file whose `group`
//! differs is refused instead of silently reading every vector from the
//! wrong slaves.

use std::path::Path;

/// The file, in the master's data directory.
const FILE: &str = "placement.toml";

/// Checks `group` against the one recorded in `dir`, recording it when
/// nothing is recorded yet. A master that already holds vectors
/// (`has_vectors`) but no record placed them before `group` existed, with
/// `group = 1`.
pub(crate) fn check_group(dir: &Path, group: u64, has_vectors: bool) -> Result<(), String> {
    let path = dir.join(FILE);
    let recorded = match std::fs::read_to_string(&path) {
        Ok(text) => Some(parse(&text).ok_or_else(|| {
            format!(
                "{} is not `group = N`; restore it (it records how the vectors were placed)",
                path.display()
            )
        })?),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => None,
        Err(err) => return Err(format!("cannot read {}: {err}", path.display())),
    };
    let placed = recorded.or(has_vectors.then_some(1));
    match placed {
        Some(placed) if placed != group => Err(format!(
            "the cluster file says group = {group}, but this master's vectors were placed \
             with group = {placed}: set group = {placed} in the cluster file"
        )),
        Some(_) if recorded.is_some() => Ok(()),
        _ => record(dir, &path, group),
    }
}

fn parse(text: &str) -> Option<u64> {
    let value = text.trim().strip_prefix("group")?.trim_start();
    value.strip_prefix('=')?.trim().parse().ok()
}

/// Writes the record durably: a temporary file, synced, renamed into place.
fn record(dir: &Path, path: &Path, group: u64) -> Result<(), String> {
    let staged = dir.join(format!("{FILE}.tmp"));
    let write = || -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let file = std::fs::File::create(&staged)?;
        std::io::Write::write_all(&mut &file, format!("group = {group}\n").as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&staged, path)?;
        std::fs::File::open(dir)?.sync_all()
    };
    write().map_err(|err| format!("cannot record the placement in {}: {err}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_group_is_recorded_and_a_different_one_refused() {
        let dir = tempfile::tempdir().unwrap();
        check_group(dir.path(), 16, false).unwrap();
        check_group(dir.path(), 16, true).unwrap();
        let refused = check_group(dir.path(), 1, true).unwrap_err();
        assert!(refused.contains("set group = 16"), "{refused}");
    }

    #[test]
    fn vectors_without_a_record_were_placed_with_group_one() {
        let dir = tempfile::tempdir().unwrap();
        let refused = check_group(dir.path(), 64, true).unwrap_err();
        assert!(refused.contains("set group = 1"), "{refused}");
        check_group(dir.path(), 1, true).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join(FILE)).unwrap(),
            "group = 1\n"
        );
        std::fs::write(dir.path().join(FILE), "grup = 1").unwrap();
        assert!(
            check_group(dir.path(), 1, true)
                .unwrap_err()
                .contains("restore it")
        );
    }
}
