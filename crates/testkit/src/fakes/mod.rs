//! Hand-written fakes for every port the managed runtime host drives, with call recording and
//! fault injection per step.
//!
//! - Each fake method is a [`Step`]: it records its input and answers with a scriptable
//!   behaviour (value, error, `lost`, block until aborted, or any closure).
//! - Every fake of a [`Fixture`] appends to one [`CallLog`], so tests assert the exact order
//!   the host called ports in.
//! - [`Fixture::fault_matrix`] is the reference fault-matrix fixture (§8.1).
//!
//! Following the reference's version caveat (§8.0), fakes give the newest host what the
//! indexed tests' fakes lack: `isCurrent` answers true and `synchronize` is a no-op.
//!
//! Fakes never see a real secret: tests grep every artifact for the fixture's token.

mod checkpoint;
mod egress;
mod fence;
mod fixture;
mod harness;
mod log;
mod observer;
mod orphans;
mod outputs;
mod sandbox;
mod scheduler;
mod session_inputs;
mod step;
mod workspace;

pub use checkpoint::{FakeRuntimeCheckpoint, RestoreCall, compatible_ref};
pub use egress::{
    EgressAttachCall, EgressReleaseCall, EgressRevokeCall, FakeCredentialEgress,
    egress_capabilities, enforced_binding,
};
pub use fence::{FakeFence, FenceReleaseCall, RenewCall};
pub use fixture::{
    Fixture, FixtureSpec, ama_worker, lease, profile, resource, session, supervised_driver,
};
pub use harness::{FakeHarness, live_checkpoint, request_checkpoint};
pub use log::{CallLog, names};
pub use observer::RecordingObserver;
pub use orphans::{FakeOrphans, OrphanFailedCall};
pub use outputs::{
    FakeOutputs, OutputsAbortCall, OutputsReleaseCall, manifest_candidate, outputs_binding,
};
pub use sandbox::{
    FakeSandbox, HeartbeatCall, ReapCall, SuspendCall, TerminateCall, default_sandbox_capabilities,
};
pub use scheduler::{FakeScheduler, SleepCall};
pub use session_inputs::{FakeSessionAccess, FakeSessionInputs, SynchronizeCall};
pub use step::{Gate, Reply, Step, WithSignal};
pub use workspace::{FakeWorkspace, WorkspaceReleaseCall, workspace_binding, workspace_candidate};
