//! omabox on one machine — the node: where its state lives ([`data_dir`]), how it is
//! configured ([`config`]: flags ∪ environment ∪ files, each value with its source), the local
//! services a run needs (agent cache, in-process inference proxy, environments, session
//! inputs, leftovers and collection, backend wiring) and the one runner of a work item that
//! `omabox run` uses and `omabox serve` will use.
//!
//! The CLI is a front end over this crate: it parses arguments, builds the configuration,
//! calls in here and prints. This crate must never assume a terminal (progress and events go
//! through observer traits), and is the only place below the CLI that reads the process
//! environment (once, into the configuration; the test-only hooks excepted).

#![forbid(unsafe_code)]

pub mod agent_cache;
pub mod checkpoint_limits;
pub mod config;
pub mod credential_reach;
pub mod data_dir;
pub mod environment;
pub mod gc;
pub mod harness_env;
pub mod images;
pub mod inference_server;
pub mod input_file;
pub mod leftovers;
pub mod oma_agent;
pub mod pause_point;
pub mod profile_hint;
pub mod registry_credentials;
pub mod revision;
pub mod runner;
pub mod runs;
pub mod sandboxes;
pub mod session;
pub mod session_inputs;
pub mod store_choice;
pub mod temp_workspace;
pub mod warm;
pub mod wiring;
pub mod work_profile;

pub use config::NodeConfig;
pub use data_dir::DataDir;
pub use runner::{RunRequest, Runner};
