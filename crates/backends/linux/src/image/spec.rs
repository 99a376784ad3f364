//! The few OCI image-spec documents an image layout is read through: an index, a
//! manifest, and the descriptors in them, with only the fields this backend uses
//! (unknown fields are ignored, as the spec asks). Not a general OCI library: the
//! `oci-spec` crate it replaces pulled `regex` with its Unicode tables into every
//! `omabox` binary, ~190 KB of pointers the dynamic loader relocates at each start.
//! A digest is kept as its text; `digest::sha256_hex_of` is the one place that accepts
//! it as a blob name.

use serde::Deserialize;

/// `application/vnd.oci.image.manifest.v1+json`.
pub(super) const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// `application/vnd.oci.image.index.v1+json`.
pub(super) const INDEX: &str = "application/vnd.oci.image.index.v1+json";
/// Docker's manifest, which an OCI layout may list.
pub(super) const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
/// Docker's manifest list.
pub(super) const DOCKER_MANIFEST_LIST: &str =
    "application/vnd.docker.distribution.manifest.list.v2+json";
/// The zstd-compressed layer types (not supported by the unpacker).
pub(super) const ZSTD_LAYERS: [&str; 2] = [
    "application/vnd.oci.image.layer.v1.tar+zstd",
    "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd",
];

/// A content descriptor.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Descriptor {
    pub(super) media_type: String,
    /// `algorithm:encoded`, as written.
    pub(super) digest: String,
    pub(super) size: u64,
    #[serde(default)]
    pub(super) platform: Option<Platform>,
}

/// The platform an index entry is for.
#[derive(Debug, Clone, Deserialize)]
pub(super) struct Platform {
    pub(super) os: String,
    pub(super) architecture: String,
}

/// An image index (`index.json`, or a nested one).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ImageIndex {
    /// Required by the spec (2); its value is not checked, as before.
    #[allow(dead_code)]
    schema_version: u32,
    pub(super) manifests: Vec<Descriptor>,
}

/// An image manifest.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ImageManifest {
    /// Required by the spec (2); its value is not checked, as before.
    #[allow(dead_code)]
    schema_version: u32,
    /// Required by the spec; this backend builds no container config from it.
    #[allow(dead_code)]
    config: Descriptor,
    pub(super) layers: Vec<Descriptor>,
}

/// This host's architecture as the image spec names it (Go's `GOARCH`).
pub(super) fn host_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        "loongarch64" => "loong64",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_index_reads_with_unknown_fields_and_without_platforms() {
        let index: ImageIndex = serde_json::from_str(
            r#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json",
                "manifests":[
                  {"mediaType":"application/vnd.oci.image.manifest.v1+json",
                   "digest":"sha256:aa","size":7,
                   "platform":{"architecture":"arm64","os":"linux","variant":"v8"},
                   "annotations":{"a":"b"}},
                  {"mediaType":"application/vnd.oci.image.index.v1+json","digest":"sha256:bb","size":1}
                ]}"#,
        )
        .unwrap();
        assert_eq!(index.manifests.len(), 2);
        let p = index.manifests[0].platform.as_ref().unwrap();
        assert_eq!((p.os.as_str(), p.architecture.as_str()), ("linux", "arm64"));
        assert!(index.manifests[1].platform.is_none());
    }

    #[test]
    fn required_fields_and_sizes_are_checked() {
        for bad in [
            r#"{"manifests":[]}"#,
            r#"{"schemaVersion":2}"#,
            r#"{"schemaVersion":2,"manifests":[{"digest":"sha256:aa","size":1}]}"#,
            r#"{"schemaVersion":2,"manifests":[{"mediaType":"x","digest":"sha256:aa","size":-1}]}"#,
        ] {
            assert!(serde_json::from_str::<ImageIndex>(bad).is_err(), "{bad}");
        }
    }
}
