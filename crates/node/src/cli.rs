//! `thaw serve` and `thaw status`.

use std::path::Path;

use clap::Args;

/// Options of `thaw serve`.
#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// Address of the HTTP API.
    #[arg(long, default_value = "127.0.0.1:9000")]
    pub listen: String,
}

/// Options of `thaw status`.
#[derive(Args, Debug, Clone)]
pub struct StatusArgs {
    /// Address of the node's HTTP API.
    #[arg(long, default_value = "127.0.0.1:9000")]
    pub endpoint: String,
}

pub fn serve(_args: ServeArgs, _data_dir: &Path) -> anyhow::Result<()> {
    anyhow::bail!("thaw serve is not implemented yet")
}

pub fn status(_args: StatusArgs, _data_dir: &Path) -> anyhow::Result<()> {
    anyhow::bail!("thaw status is not implemented yet")
}
