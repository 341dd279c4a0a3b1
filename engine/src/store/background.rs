//! Store work that can wait, such as storing the copies of a move: run on a
//! thread of its own at a lower CPU priority than queries, so that when both
//! want the cores the queries get most of them, and the work alone still
//! takes all it can use.

use std::io;

/// The nice value of a background thread (Linux; elsewhere threads keep the
/// usual priority). The default is 0; 19 is the lowest.
pub const BACKGROUND_NICE: i32 = 10;

/// Runs `work` on a new thread named `name`, at [`BACKGROUND_NICE`]. A new
/// thread each time because a thread's priority, once lowered, cannot be
/// raised again without privileges: a pooled thread would carry it into
/// the work it runs later.
pub fn spawn_background(name: &str, work: impl FnOnce() + Send + 'static) -> io::Result<()> {
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            lower_priority();
            work();
        })
        .map(drop)
}

/// Lowers the calling thread's priority; only a hint: if it fails, the work
/// runs at the usual priority.
#[cfg(target_os = "linux")]
fn lower_priority() {
    // SAFETY: plain system calls about the calling thread itself; no memory
    // is passed.
    unsafe {
        libc::setpriority(
            libc::PRIO_PROCESS,
            libc::gettid() as libc::id_t,
            BACKGROUND_NICE,
        );
    }
}

#[cfg(not(target_os = "linux"))]
fn lower_priority() {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn background_work_runs_at_the_background_priority() {
        let (tx, rx) = std::sync::mpsc::channel();
        spawn_background("test-background", move || {
            // SAFETY: reads the calling thread's own priority.
            let nice =
                unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) };
            tx.send(nice).unwrap();
        })
        .unwrap();
        let nice = rx.recv().unwrap();
        if cfg!(target_os = "linux") {
            assert_eq!(nice, BACKGROUND_NICE);
        }
    }
}
