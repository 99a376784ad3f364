//! What a materialize could not restore, carried in the workspace binding's metadata so the
//! caller (the CLI's timeline and report) can name it: a damaged revision never stops a
//! session silently (see `restore`'s `tolerate_lost`).
//!
//! `materialize` restores what it can of a damaged revision: a file whose blob is missing or
//! does not match its hash (and every hard link to it) is left out, and a lost manifest
//! starts `/workspace` empty; each loss is named here (`omabox.workspace.lost.v1`).
//! `export_candidate` stays strict: it fails on the first loss.
//!
//! Must never: carry anything but paths, blob ids and fixed problem texts (binding metadata
//! reaches the backend), or grow without bound (at most [`LOST_LISTED`] entries, then a count).

use crate::verify::Damage;
use omabox_contract::{Meta, MetaValue};

/// Binding metadata key: what the restore could not bring back (JSON array of
/// [`Damage`], at most [`LOST_LISTED`]); the count is under [`LOST_COUNT_METADATA_KEY`].
pub const LOST_METADATA_KEY: &str = "omabox.workspace.lost.v1";
/// Binding metadata key: how many entries were lost.
pub const LOST_COUNT_METADATA_KEY: &str = "omabox.workspace.lostCount";
/// Lost entries listed in the binding metadata (the count says how many there were).
pub const LOST_LISTED: usize = 100;

pub(crate) fn record_losses(metadata: &mut Meta, lost: &[Damage]) {
    let listed: Vec<&Damage> = lost.iter().take(LOST_LISTED).collect();
    if let Ok(json) = serde_json::to_string(&listed) {
        metadata.insert(LOST_METADATA_KEY.into(), MetaValue::String(json));
    }
    metadata.insert(LOST_COUNT_METADATA_KEY.into(), (lost.len() as u64).into());
}

/// What a binding's restore lost, from its metadata: the listed entries and the count.
pub fn binding_losses(metadata: Option<&Meta>) -> (Vec<Damage>, u64) {
    let Some(metadata) = metadata else {
        return (Vec::new(), 0);
    };
    let listed: Vec<Damage> = metadata
        .get(LOST_METADATA_KEY)
        .and_then(|value| value.as_str())
        .and_then(|json| serde_json::from_str(json).ok())
        .unwrap_or_default();
    let count = metadata
        .get(LOST_COUNT_METADATA_KEY)
        .and_then(|value| match value {
            MetaValue::Number(number) => number.as_u64(),
            _ => None,
        })
        .unwrap_or(listed.len() as u64);
    (listed, count)
}
