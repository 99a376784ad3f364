//! omabox on one machine — the node: where its state lives ([`data_dir`]), and (as they
//! move here from the CLI) how it is configured, the local services a run needs and the one
//! runner of a work item.

#![forbid(unsafe_code)]

pub mod data_dir;
