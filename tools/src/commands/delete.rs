//! `bitfold delete`: delete every existing vector in the given terms.

use bitfold_rpc::client::Client;

use crate::cli::DeleteArgs;

/// Runs `bitfold delete`.
pub fn run(args: DeleteArgs) -> anyhow::Result<()> {
    let client = Client::connect(&args.master)?;
    let deleted = client.delete(&args.terms)?;
    println!(
        "deleted {deleted} vector{}",
        if deleted == 1 { "" } else { "s" }
    );
    Ok(())
}
