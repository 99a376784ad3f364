//! In-memory twins of the durable stores, with exactly the reference's semantics. For tests
//! and for single-process tools that need no durability.

mod credentials;
mod fence;
mod journal;
mod orphan;
mod run_queue;

pub use credentials::{MemorySessionTokens, MemoryVault};
pub(crate) use credentials::{check_vault_name, superseded};
pub use fence::{MemoryFenceRecord, MemoryFenceStore};
pub use journal::{MemoryLeaseJournal, MemoryUsageLedger};
pub use orphan::MemoryOrphanStore;
pub use run_queue::MemoryRunQueue;
