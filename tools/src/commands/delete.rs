//! `bitfold delete`: delete every existing vector in the given terms.

use crate::cli::DeleteArgs;

/// Runs `bitfold delete`.
pub fn run(args: DeleteArgs) -> anyhow::Result<()> {
    let client = super::connect(&args.master, args.tls.as_deref())?;
    let deleted = client.delete(&args.terms)?;
    println!(
        "deleted {deleted} vector{}",
        if deleted == 1 { "" } else { "s" }
    );
    Ok(())
}
