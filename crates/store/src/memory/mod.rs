//! In-memory twins of the durable stores, with exactly the reference's semantics. For tests
//! and for single-process tools that need no durability.

mod fence;
mod orphan;

pub use fence::{MemoryFenceRecord, MemoryFenceStore};
pub use orphan::MemoryOrphanStore;
