//! In-memory twins of the durable stores, with exactly the reference's semantics. For tests
//! and for single-process tools that need no durability.

mod fence;
mod journal;
mod orphan;

pub use fence::{MemoryFenceRecord, MemoryFenceStore};
pub use journal::{MemoryLeaseJournal, MemoryUsageLedger};
pub use orphan::MemoryOrphanStore;
