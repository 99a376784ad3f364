//! E2B's routes beyond create/list/kill (`spec/openapi.yml` of e2b-dev/E2B): a running
//! sandbox's metrics (`GET /sandboxes/{id}/metrics`, `GET /sandboxes/metrics`), its network
//! (`PUT /sandboxes/{id}/network`) and its pause (`POST /sandboxes/{id}/pause`; the resume
//! is `connect`'s, in `e2b.rs`, and the deprecated `POST /sandboxes/{id}/resume`). Same key check, body cap and error shape as `e2b.rs`.
//!
//! Must never: accept a network rule the sandbox's policy would not enforce (it is a 400
//! naming the field); accept a memory pause (only the filesystem is kept).

use super::e2b::{
    Answer, E2bError, authorize, is_empty, json_body, not_found_short, sandbox_body, sandbox_call,
    sandbox_id, seconds, shorten,
};
use crate::e2b::{
    CreatedSandbox, DEFAULT_TIMEOUT, MAX_TIMEOUT, NetworkUpdate, SandboxMetrics,
    SandboxServiceError, rfc3339,
};
use crate::state::ProxyState;
use axum::Json;
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::IntoResponse;
use omabox_contract::networking::HostRule;
use serde::Deserialize;
use serde_json::{Map, Value, json};
use std::net::IpAddr;
use std::time::SystemTime;

/// Sandboxes one `GET /sandboxes/metrics` names at most (E2B's `maxItems`).
const MAX_METRICS_IDS: usize = 100;
/// Entries of `allowOut` or `denyOut` at most.
const MAX_NETWORK_ENTRIES: usize = 256;
/// Bytes of one `allowOut` or `denyOut` entry (a DNS name and a port).
const MAX_ENTRY_BYTES: usize = 260;
/// The `denyOut` entry meaning "everything not in `allowOut`" (the SDK's `ALL_TRAFFIC`).
const ALL_TRAFFIC: &str = "0.0.0.0/0";

/// `SandboxMetric`.
fn metric_body(metric: &SandboxMetrics) -> Value {
    let unix = metric
        .timestamp
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    json!({
        "timestamp": rfc3339(metric.timestamp),
        "timestampUnix": unix,
        "cpuCount": metric.cpu_count,
        "cpuUsedPct": metric.cpu_used_pct,
        "memUsed": metric.mem_used,
        "memTotal": metric.mem_total,
        "memCache": metric.mem_cache,
        "diskUsed": metric.disk_used,
        "diskTotal": metric.disk_total,
    })
}

/// `GET /sandboxes/{id}/metrics` → 200 `[SandboxMetric]`: one sample, taken now (no history
/// is kept, so `start` and `end` select nothing else).
pub(crate) async fn metrics(
    State(state): State<ProxyState>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
) -> Answer {
    let service = authorize(&state, &headers)?;
    let id = sandbox_id(id)?;
    let metric = service
        .metrics(&id)
        .await
        .map_err(|e| not_found_short(e, &id))?;
    Ok(Json(vec![metric_body(&metric)]).into_response())
}

/// `GET /sandboxes/metrics?sandbox_ids=a,b` → 200 `{"sandboxes": {id: SandboxMetric}}`:
/// the running ones among those named (at most 100).
pub(crate) async fn metrics_of_many(
    State(state): State<ProxyState>,
    headers: HeaderMap,
    uri: Uri,
) -> Answer {
    let service = authorize(&state, &headers)?;
    let mut ids: Vec<String> = Vec::new();
    for (key, value) in url::form_urlencoded::parse(uri.query().unwrap_or_default().as_bytes()) {
        if key == "sandbox_ids" {
            ids.extend(
                value
                    .split(',')
                    .filter(|id| !id.is_empty())
                    .map(str::to_owned),
            );
        }
        if ids.len() > MAX_METRICS_IDS {
            return Err(E2bError::bad_request(format!(
                "sandbox_ids names more than {MAX_METRICS_IDS} sandboxes"
            )));
        }
    }
    if ids.is_empty() {
        return Err(E2bError::bad_request(
            "sandbox_ids is required (comma-separated sandbox ids)",
        ));
    }
    ids.sort();
    ids.dedup();
    // Sampled side by side: a sample without an earlier reading waits ~100 ms.
    let samples =
        futures::future::join_all(ids.iter().map(|id| service.metrics(id.as_str()))).await;
    let mut sandboxes = Map::new();
    for (id, sample) in ids.iter().zip(samples) {
        match sample {
            Ok(metric) => {
                sandboxes.insert(id.clone(), metric_body(&metric));
            }
            Err(SandboxServiceError::NotFound(_)) => {}
            Err(error) => return Err(not_found_short(error, id)),
        }
    }
    Ok(Json(json!({ "sandboxes": sandboxes })).into_response())
}

/// `SandboxNetworkUpdateConfig` as sent.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NetworkBody {
    allow_out: Option<Vec<String>>,
    deny_out: Option<Vec<String>>,
    egress_proxy: Option<Value>,
    rules: Option<Value>,
    #[serde(alias = "dns_servers")]
    dns_servers: Option<Value>,
    #[serde(rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
}

impl NetworkBody {
    /// What the sandbox's policy can enforce: everything (no deny-all), or only named hosts
    /// (`denyOut: ["0.0.0.0/0"]` or `allow_internet_access: false`, with `allowOut` the
    /// exceptions). IP addresses, CIDR blocks, other deny rules, proxies, transform rules
    /// and DNS servers are not enforceable here: a 400 naming the field.
    fn validate(self) -> Result<NetworkUpdate, E2bError> {
        let unsupported = |field: &str, why: &str| {
            Err(E2bError::bad_request(format!(
                "{field} is not supported by omabox: {why}"
            )))
        };
        if self.egress_proxy.as_ref().is_some_and(|v| !v.is_null()) {
            return unsupported(
                "egressProxy",
                "the sandbox's traffic leaves through omabox's relay",
            );
        }
        if self.rules.as_ref().is_some_and(|v| !is_empty(v)) {
            return unsupported("rules", "requests are not transformed");
        }
        if self.dns_servers.as_ref().is_some_and(|v| !v.is_null()) {
            return unsupported(
                "dnsServers",
                "omabox's own DNS stub answers the sandbox's names",
            );
        }
        let (allow, deny) = (
            self.allow_out.unwrap_or_default(),
            self.deny_out.unwrap_or_default(),
        );
        for (field, list) in [("allowOut", &allow), ("denyOut", &deny)] {
            if list.len() > MAX_NETWORK_ENTRIES {
                return Err(E2bError::bad_request(format!(
                    "{field} has more than {MAX_NETWORK_ENTRIES} entries"
                )));
            }
            if list.iter().any(|entry| entry.len() > MAX_ENTRY_BYTES) {
                return Err(E2bError::bad_request(format!(
                    "{field} has an entry longer than {MAX_ENTRY_BYTES} bytes"
                )));
            }
        }
        if let Some(entry) = deny.iter().find(|entry| entry.trim() != ALL_TRAFFIC) {
            return Err(E2bError::bad_request(format!(
                "denyOut entry {:?} cannot be enforced: only {ALL_TRAFFIC:?} (everything not in allowOut) is",
                shorten(entry)
            )));
        }
        for entry in &allow {
            let host = entry.trim();
            let bare = host.split('/').next().unwrap_or_default();
            if bare.parse::<IpAddr>().is_ok() || host.contains('/') {
                return Err(E2bError::bad_request(format!(
                    "allowOut entry {:?} is an IP address or CIDR block: omabox admits hosts by name only",
                    shorten(entry)
                )));
            }
            HostRule::parse(host).map_err(|e| E2bError::bad_request(format!("allowOut: {e}")))?;
        }
        let deny_all = !deny.is_empty() || self.allow_internet_access == Some(false);
        Ok(if deny_all {
            NetworkUpdate::Only(allow.iter().map(|e| e.trim().to_owned()).collect())
        } else {
            NetworkUpdate::Internet
        })
    }
}

/// `PUT /sandboxes/{id}/network` → 204: the sandbox's egress rules replaced (see
/// [`NetworkBody::validate`]).
pub(crate) async fn update_network(
    State(state): State<ProxyState>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
    body: Body,
) -> Answer {
    let service = authorize(&state, &headers)?;
    let id = sandbox_id(id)?;
    let body: NetworkBody = json_body(&state, &headers, body)
        .await?
        .ok_or_else(|| E2bError::bad_request("a JSON body is required"))?;
    let update = body.validate()?;
    service
        .update_network(&id, update)
        .await
        .map_err(|e| not_found_short(e, &id))?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `SandboxPauseRequest` as sent.
#[derive(Debug, Deserialize)]
struct PauseBody {
    memory: Option<bool>,
}

/// `POST /sandboxes/{id}/pause` → 204 (409: paused already). Where the service keeps memory
/// (`omabox serve --backend gvisor`) a pause is E2B's full one unless the body says
/// `"memory": false`: processes go on after the resume. Elsewhere only the filesystem mode:
/// the files are kept, processes end; `{"memory": true}` is a 400 (an absent `memory`, E2B's
/// default of a full snapshot, is served as a filesystem pause).
pub(crate) async fn pause(
    State(state): State<ProxyState>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
    body: Body,
) -> Answer {
    let (service, id, body) = sandbox_call::<PauseBody>(&state, &headers, id, body).await?;
    let memory = body.and_then(|b| b.memory);
    let keep_memory = service.pauses_memory() && memory != Some(false);
    if memory == Some(true) && !keep_memory {
        return Err(E2bError::bad_request(
            "only filesystem pause is served (memory: false, the SDK's mode=\"filesystem\"): a paused sandbox keeps its files, not its processes",
        ));
    }
    let paused = service
        .pause(&id, keep_memory)
        .await
        .map_err(|e| not_found_short(e, &id))?;
    if !paused {
        return Err(E2bError::new(
            StatusCode::CONFLICT,
            format!("sandbox \"{}\" is already paused", shorten(&id)),
        ));
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `ResumedSandbox` as sent.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ResumeBody {
    timeout: Option<i64>,
    auto_pause: Option<bool>,
}

/// `POST /sandboxes/{id}/resume` (deprecated by E2B for `connect`) `{"timeout": s}` → 201
/// `Sandbox`: the paused sandbox resumed to live `s` (default 15) seconds; 409 when it runs,
/// 404 unknown.
pub(crate) async fn resume(
    State(state): State<ProxyState>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
    body: Body,
) -> Answer {
    let (service, id, body) = sandbox_call::<ResumeBody>(&state, &headers, id, body).await?;
    let (timeout, auto_pause) = body.map_or((None, None), |b| (b.timeout, b.auto_pause));
    if auto_pause == Some(true) {
        return Err(E2bError::bad_request(
            "autoPause is not supported by omabox yet",
        ));
    }
    let timeout = match timeout {
        Some(secs) => seconds("timeout", secs, MAX_TIMEOUT)?,
        None => DEFAULT_TIMEOUT,
    };
    match service
        .resume(&id, timeout)
        .await
        .map_err(|e| not_found_short(e, &id))?
    {
        Some(CreatedSandbox { info, access_token }) => Ok((
            StatusCode::CREATED,
            Json(sandbox_body(&info, &access_token)),
        )
            .into_response()),
        None if service.get(&id).is_some() => Err(E2bError::new(
            StatusCode::CONFLICT,
            format!("sandbox \"{}\" is already running", shorten(&id)),
        )),
        None => Err(not_found_short(
            SandboxServiceError::NotFound(id.clone()),
            &id,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn network(json: &str) -> Result<NetworkUpdate, E2bError> {
        serde_json::from_str::<NetworkBody>(json)
            .unwrap()
            .validate()
    }

    #[test]
    fn a_network_update_is_what_the_policy_enforces_or_a_400_naming_the_field() {
        assert_eq!(network("{}").unwrap(), NetworkUpdate::Internet);
        assert_eq!(
            network(
                r#"{"allowOut":["api.example.com","*.example.org:8443"],"denyOut":["0.0.0.0/0"]}"#
            )
            .unwrap(),
            NetworkUpdate::Only(vec!["api.example.com".into(), "*.example.org:8443".into()])
        );
        assert_eq!(
            network(r#"{"allow_internet_access":false}"#).unwrap(),
            NetworkUpdate::Only(Vec::new())
        );
        for (bad, field) in [
            (
                r#"{"allowOut":["8.8.8.8"],"denyOut":["0.0.0.0/0"]}"#,
                "allowOut",
            ),
            (
                r#"{"allowOut":["10.0.0.0/8"],"denyOut":["0.0.0.0/0"]}"#,
                "allowOut",
            ),
            (
                r#"{"allowOut":["::1"],"denyOut":["0.0.0.0/0"]}"#,
                "allowOut",
            ),
            (
                r#"{"allowOut":["http://x.com/"],"denyOut":["0.0.0.0/0"]}"#,
                "allowOut",
            ),
            (r#"{"denyOut":["1.2.3.4/32"]}"#, "denyOut"),
            (r#"{"egressProxy":{"address":"p:1"}}"#, "egressProxy"),
            (r#"{"rules":{"a.com":[{}]}}"#, "rules"),
            (r#"{"dnsServers":["1.1.1.1"]}"#, "dnsServers"),
        ] {
            let error = network(bad).unwrap_err();
            let text = format!("{error:?}");
            assert!(
                text.contains(field) && text.contains("400"),
                "{bad}: {text}"
            );
        }
    }
}
