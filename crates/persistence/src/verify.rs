//! Verifying a published revision end to end (`omabox fsck`): its workspace manifest and every
//! blob it names, its outputs manifest and every output blob, each hash re-computed.
//!
//! Verification only reads. It reports every problem it finds (a missing manifest, a manifest
//! that does not parse, a blob that is missing or whose bytes do not hash to its name) as a
//! [`Damage`] naming the object and, for content, the path that needs it; it never stops at the
//! first one and never repairs anything. Blobs shared by several revisions are read once per
//! [`BlobVerifier`].

use crate::blob::{BlobStore, COPY_BUFFER};
use crate::error::{PersistenceError, Result};
use crate::hash::{BlobHash, candidate_manifest_hash};
use crate::manifest::WorkspaceManifest;
use crate::outputs::SessionOutputManifest;
use omabox_contract::RuntimePublicationCandidate;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::io::{self, Read};

/// One problem of a published revision (or one thing a restore lost to it).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Damage {
    /// The object: a candidate id (`wcp_…`, `out_…`) or `blob <hex>`.
    pub object: String,
    /// The workspace path or output logical path that needs it, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// What is wrong.
    pub problem: String,
}

/// What a blob turned out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlobState {
    /// Present, and its bytes hash to its name.
    Intact {
        /// Its size.
        size: u64,
    },
    /// Not in the store.
    Missing,
    /// Present, but its bytes do not hash to its name.
    Corrupt,
}

/// Verifies blobs, each once.
#[derive(Debug)]
pub struct BlobVerifier<'a> {
    store: &'a BlobStore,
    seen: HashMap<BlobHash, BlobState>,
    /// Blobs read (for reports).
    pub blobs_read: u64,
    /// Bytes read (for reports).
    pub bytes_read: u64,
}

impl<'a> BlobVerifier<'a> {
    /// A verifier over `store`.
    pub fn new(store: &'a BlobStore) -> Self {
        Self {
            store,
            seen: HashMap::new(),
            blobs_read: 0,
            bytes_read: 0,
        }
    }

    /// Reads `hash` whole and re-computes its hash (once per verifier).
    pub fn check(&mut self, hash: &BlobHash) -> Result<BlobState> {
        if let Some(state) = self.seen.get(hash) {
            return Ok(*state);
        }
        let state = match self.store.open(hash)? {
            None => BlobState::Missing,
            Some(mut file) => {
                let mut digest = Sha256::new();
                let mut buffer = vec![0u8; COPY_BUFFER];
                let mut size = 0u64;
                loop {
                    let read = match file.read(&mut buffer) {
                        Ok(0) => break,
                        Ok(read) => read,
                        Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                        Err(error) => {
                            return Err(PersistenceError::io(
                                format!("Cannot read blob {hash}"),
                                error,
                            ));
                        }
                    };
                    digest.update(&buffer[..read]);
                    size += read as u64;
                }
                self.blobs_read += 1;
                self.bytes_read += size;
                if BlobHash::from_digest(digest) == *hash {
                    BlobState::Intact { size }
                } else {
                    BlobState::Corrupt
                }
            }
        };
        self.seen.insert(*hash, state);
        Ok(state)
    }

    /// The bytes of a small blob, verified; `Err(damage)` when missing or corrupt.
    fn manifest_bytes(
        &mut self,
        object: &str,
        hash: &BlobHash,
    ) -> Result<std::result::Result<Vec<u8>, Damage>> {
        let damage = |problem: &str| Damage {
            object: object.to_owned(),
            path: None,
            problem: problem.to_owned(),
        };
        match self.store.get(hash) {
            Ok(Some(bytes)) => Ok(Ok(bytes)),
            Ok(None) => Ok(Err(damage("the manifest blob is not in the blob store"))),
            Err(PersistenceError::CorruptBlob(_)) => Ok(Err(damage(
                "the manifest blob's bytes do not hash to its name",
            ))),
            Err(error) => Err(error),
        }
    }

    /// Checks one content blob a manifest entry needs.
    fn content(
        &mut self,
        hash: &BlobHash,
        size: u64,
        path: &str,
        damages: &mut Vec<Damage>,
    ) -> Result<()> {
        let problem = match self.check(hash)? {
            BlobState::Intact { size: actual } if actual == size => return Ok(()),
            BlobState::Intact { size: actual } => {
                format!("the blob has {actual} bytes, the manifest says {size}")
            }
            BlobState::Missing => "the blob is not in the blob store".to_owned(),
            BlobState::Corrupt => "the blob's bytes do not hash to its name".to_owned(),
        };
        damages.push(Damage {
            object: format!("blob {hash}"),
            path: Some(path.to_owned()),
            problem,
        });
        Ok(())
    }
}

/// Every problem of a published workspace candidate (a `wcp_` checkpoint; an ephemeral
/// candidate has nothing to verify).
pub fn verify_workspace(
    verifier: &mut BlobVerifier<'_>,
    candidate: &RuntimePublicationCandidate,
) -> Result<Vec<Damage>> {
    if !candidate.id.starts_with("wcp_") {
        return Ok(Vec::new());
    }
    let invalid = |problem: String| {
        vec![Damage {
            object: candidate.id.clone(),
            path: None,
            problem,
        }]
    };
    let Ok(hash) = candidate_manifest_hash(candidate, "wcp_") else {
        return Ok(invalid(
            "the candidate's id and content hash do not name one manifest".to_owned(),
        ));
    };
    let bytes = match verifier.manifest_bytes(&candidate.id, &hash)? {
        Ok(bytes) => bytes,
        Err(damage) => return Ok(vec![damage]),
    };
    let manifest = match WorkspaceManifest::parse(&bytes) {
        Ok(manifest) => manifest,
        Err(error) => return Ok(invalid(error.to_string())),
    };
    let mut damages = Vec::new();
    for entry in &manifest.entries {
        if let Some(hash) = &entry.hash {
            verifier.content(hash, entry.stored_size(), &entry.path, &mut damages)?;
        }
    }
    Ok(damages)
}

/// Every problem of a published outputs candidate (`out_`).
pub fn verify_outputs(
    verifier: &mut BlobVerifier<'_>,
    candidate: &RuntimePublicationCandidate,
) -> Result<Vec<Damage>> {
    let invalid = |problem: String| {
        vec![Damage {
            object: candidate.id.clone(),
            path: None,
            problem,
        }]
    };
    let Ok(hash) = candidate_manifest_hash(candidate, "out_") else {
        return Ok(invalid(
            "the candidate's id and content hash do not name one manifest".to_owned(),
        ));
    };
    let bytes = match verifier.manifest_bytes(&candidate.id, &hash)? {
        Ok(bytes) => bytes,
        Err(damage) => return Ok(vec![damage]),
    };
    let manifest: SessionOutputManifest = match serde_json::from_slice(&bytes) {
        Ok(manifest) => manifest,
        Err(error) => return Ok(invalid(format!("the manifest does not parse: {error}"))),
    };
    let mut damages = Vec::new();
    for entry in &manifest.entries {
        match BlobHash::from_content_hash(&entry.content_hash) {
            Some(hash) => {
                verifier.content(&hash, entry.size, &entry.logical_path, &mut damages)?;
            }
            None => damages.push(Damage {
                object: candidate.id.clone(),
                path: Some(entry.logical_path.clone()),
                problem: format!("invalid content hash {:?}", entry.content_hash),
            }),
        }
    }
    Ok(damages)
}

/// Adds every blob a publication needs to `into`: its manifests and their content, for `gc`.
/// Returns the candidate ids whose manifest could not be read (missing, corrupt, invalid):
/// their content is unknown, so a collector must not remove anything then.
pub fn referenced_blobs(
    store: &BlobStore,
    workspace: &RuntimePublicationCandidate,
    outputs: Option<&RuntimePublicationCandidate>,
    into: &mut std::collections::HashSet<BlobHash>,
) -> Vec<String> {
    let mut unreadable = Vec::new();
    if workspace.id.starts_with("wcp_") {
        let manifest = candidate_manifest_hash(workspace, "wcp_")
            .ok()
            .inspect(|hash| {
                into.insert(*hash);
            })
            .and_then(|hash| store.get(&hash).ok().flatten())
            .and_then(|bytes| WorkspaceManifest::parse(&bytes).ok());
        match manifest {
            Some(manifest) => into.extend(manifest.file_hashes()),
            None => unreadable.push(workspace.id.clone()),
        }
    }
    if let Some(outputs) = outputs {
        let manifest = candidate_manifest_hash(outputs, "out_")
            .ok()
            .inspect(|hash| {
                into.insert(*hash);
            })
            .and_then(|hash| store.get(&hash).ok().flatten())
            .and_then(|bytes| serde_json::from_slice::<SessionOutputManifest>(&bytes).ok());
        match manifest {
            Some(manifest) => into.extend(
                manifest
                    .entries
                    .iter()
                    .filter_map(|entry| BlobHash::from_content_hash(&entry.content_hash)),
            ),
            None => unreadable.push(outputs.id.clone()),
        }
    }
    unreadable
}
