//! One module per subcommand.

pub mod bench;
pub mod catalog;
pub mod config;
pub mod files;
pub mod fsck;
pub mod gc;
pub mod image;
pub mod outputs;
pub mod reap;
pub mod run;
pub mod sandbox;
pub mod serve;
pub mod sessions;
pub mod usage;
pub mod vault;
pub mod workspace;
