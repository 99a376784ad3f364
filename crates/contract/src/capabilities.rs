//! Capability enums and records: what a composition can do, as data.

use serde::{Deserialize, Serialize};

macro_rules! wire_enum {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident = $lit:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, ::serde::Serialize, ::serde::Deserialize)]
        pub enum $name {
            $($(#[$vmeta])* #[serde(rename = $lit)] $variant),+
        }

        impl $name {
            /// Every value, in the contract's order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The wire literal.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $lit),+ }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $name {
            type Err = String;
            fn from_str(value: &str) -> Result<Self, Self::Err> {
                match value {
                    $($lit => Ok($name::$variant),)+
                    other => Err(format!("unknown {}: {other}", stringify!($name))),
                }
            }
        }
    };
}
pub(crate) use wire_enum;

wire_enum! {
    /// How `/workspace` persists across work items.
    WorkspaceStrategy {
        /// A durable volume mounted into the sandbox.
        DurableMount = "durable_mount",
        /// The provider keeps the runtime (and its filesystem) between work items.
        RetainedRuntime = "retained_runtime",
        /// A portable checkpoint is taken after the harness and restored before the next one.
        CheckpointRestore = "checkpoint_restore",
        /// Nothing persists.
        Ephemeral = "ephemeral",
    }
}

wire_enum! {
    /// How `/mnt/session/outputs` reaches durable storage.
    OutputStrategy {
        /// A durable volume mounted into the sandbox.
        DurableMount = "durable_mount",
        /// Files are uploaded as they appear.
        WatchAndUpload = "watch_and_upload",
        /// Files are collected once the harness finished.
        FinalCollect = "final_collect",
    }
}

wire_enum! {
    /// What a runtime checkpoint captures.
    RuntimeCheckpointKind {
        /// The filesystem only.
        Filesystem = "filesystem",
        /// Process memory too.
        Process = "process",
    }
}

wire_enum! {
    /// The harness driver lanes.
    HarnessDriverType {
        /// An unmodified AMA worker process.
        AmaWorker = "ama_worker",
        /// A supervisor speaking `openma-harness-supervisor-v1`.
        OpenmaSupervised = "openma_supervised",
    }
}

wire_enum! {
    /// Whether a sandbox can be suspended and resumed.
    SuspendResume {
        /// Implemented.
        Supported = "supported",
        /// Not implemented.
        Unsupported = "unsupported",
    }
}

wire_enum! {
    /// How reliably terminate destroys compute.
    HardTerminate {
        /// Terminate destroys the runtime.
        Supported = "supported",
        /// Terminate tries; the provider may keep it.
        BestEffort = "best_effort",
    }
}

wire_enum! {
    /// How durable Session outputs are.
    OutputDurability {
        /// Durable once finalized.
        Durable = "durable",
        /// May be lost.
        BestEffort = "best_effort",
    }
}

/// Compute lifecycle capabilities of a [`crate::ManagedSandboxPort`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxResourceCapabilities {
    /// Suspend/resume support.
    pub suspend_resume: SuspendResume,
    /// Terminate reliability.
    pub hard_terminate: HardTerminate,
    /// Runtime checkpoint kinds the composition can create.
    pub runtime_checkpoints: Vec<RuntimeCheckpointKind>,
}

/// Workspace strategies a [`crate::WorkspacePersistencePort`] implements.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkspacePersistenceCapabilities {
    /// The strategies.
    pub strategies: Vec<WorkspaceStrategy>,
}

/// One output strategy and its durability.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionOutputCapability {
    /// The strategy.
    pub strategy: OutputStrategy,
    /// Its durability.
    pub durability: OutputDurability,
}

/// Output strategies a [`crate::SessionOutputPort`] implements.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionOutputCapabilities {
    /// The strategies.
    pub strategies: Vec<SessionOutputCapability>,
}

/// Driver lanes a [`crate::SandboxHarnessDriverPort`] runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxHarnessDriverCapabilities {
    /// The lanes.
    pub drivers: Vec<HarnessDriverType>,
}

/// Everything admission compares against a profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManagedRuntimeResourceCapabilities {
    /// Compute lifecycle.
    pub sandbox: SandboxResourceCapabilities,
    /// Workspace persistence.
    pub workspace: WorkspacePersistenceCapabilities,
    /// Session outputs.
    pub outputs: SessionOutputCapabilities,
    /// Harness lanes.
    pub harness: SandboxHarnessDriverCapabilities,
}
