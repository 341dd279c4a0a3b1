//! Writing folders and files that hold keys without any moment at which
//! others could read them, and reading files with errors that name them;
//! dates as the index and the command line write them.

use std::fs::{self, DirBuilder, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use time::{Date, Month, OffsetDateTime, PrimitiveDateTime, Time};

use crate::Error;

/// The mode of a key file: its owner's only.
pub(crate) const PRIVATE: u32 = 0o600;
/// The mode of a certificate or a list: anyone may read it (its folder
/// decides who can reach it).
pub(crate) const PUBLIC: u32 = 0o644;

/// The error of writing `path`.
pub(crate) fn write_error(path: &Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |cause| Error::Write {
        path: path.to_owned(),
        cause: bitfold_net::describe_io(&cause),
    }
}

/// Makes `dir` (and its parents) a folder only its owner can enter: a new
/// one is created with mode 0700, an existing one narrowed to it.
pub(crate) fn private_dir(dir: &Path) -> Result<(), Error> {
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(parent).map_err(write_error(parent))?;
    }
    match DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && dir.is_dir() => {
            fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).map_err(write_error(dir))
        }
        Err(e) => Err(write_error(dir)(e)),
    }
}

/// Writes `text` to the new file `path`, created with `mode`; an existing
/// file is an error (`AlreadyExists`), not overwritten.
pub(crate) fn create_new(path: &Path, text: &str, mode: u32) -> std::io::Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()
}

/// Replaces `path` with `text` at once: written to a temporary file beside
/// it, created with `mode`, then renamed over it, so that a reader finds
/// the old file or the new one, whole, and a key is never readable by others.
pub(crate) fn replace(path: &Path, text: &str, mode: u32) -> Result<(), Error> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    let temp = path.with_file_name(format!(
        ".{}.{}.tmp",
        name.as_deref().unwrap_or("file"),
        std::process::id()
    ));
    // One left by a process of the same id that died while writing.
    let _ = fs::remove_file(&temp);
    let written = create_new(&temp, text, mode).and_then(|()| fs::rename(&temp, path));
    if written.is_err() {
        let _ = fs::remove_file(&temp);
    }
    written.map_err(write_error(path))
}

/// The text of `path`.
pub(crate) fn read(path: &Path) -> Result<String, Error> {
    fs::read_to_string(path).map_err(|cause| Error::Read {
        path: path.to_owned(),
        cause: bitfold_net::describe_io(&cause),
    })
}

/// `path` made absolute (and its links resolved), or as it is if that fails.
pub(crate) fn absolute(path: &Path) -> PathBuf {
    fs::canonicalize(path)
        .or_else(|_| std::path::absolute(path))
        .unwrap_or_else(|_| path.to_owned())
}

/// `t` in UTC to the second, as the index and `bitfold certs list` write
/// it: `2027-05-01T12:00:00Z`.
pub fn utc(t: SystemTime) -> String {
    let secs = match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(after) => i64::try_from(after.as_secs()).unwrap_or(i64::MAX),
        Err(before) => -i64::try_from(before.duration().as_secs()).unwrap_or(i64::MAX),
    };
    let Ok(t) = OffsetDateTime::from_unix_timestamp(secs) else {
        return format!("{secs} seconds from 1970 (UTC)");
    };
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// The time [`utc`] wrote as `text`.
pub(crate) fn parse_utc(text: &str) -> Option<SystemTime> {
    let (date, time) = text.strip_suffix('Z')?.split_once('T')?;
    let numbers = |text: &str, sep: char| -> Option<Vec<i32>> {
        text.split(sep).map(|n| n.parse().ok()).collect()
    };
    let (date, time) = (numbers(date, '-')?, numbers(time, ':')?);
    let [year, month, day] = date[..] else {
        return None;
    };
    let [hour, minute, second] = time[..] else {
        return None;
    };
    let byte = |n: i32| u8::try_from(n).ok();
    let date =
        Date::from_calendar_date(year, Month::try_from(byte(month)?).ok()?, byte(day)?).ok()?;
    let time = Time::from_hms(byte(hour)?, byte(minute)?, byte(second)?).ok()?;
    Some(PrimitiveDateTime::new(date, time).assume_utc().into())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn dates_read_back_as_written_to_the_second() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        assert_eq!(utc(t), "2027-01-15T08:00:00Z");
        assert_eq!(parse_utc(&utc(t)), Some(t));
        assert_eq!(parse_utc("2027-02-30T00:00:00Z"), None);
        assert_eq!(parse_utc("2027-01-15 08:00:00"), None);
    }

    #[test]
    fn a_replaced_file_takes_the_mode_it_is_written_with() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key.pem");
        fs::write(&path, "old").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        replace(&path, "new", PRIVATE).unwrap();
        assert_eq!(fs::read_to_string(&path).unwrap(), "new");
        let mode = fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no temporary file left"
        );
    }
}
