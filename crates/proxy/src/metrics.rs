//! A tiny Prometheus text registry: request counts and latency sums per route, method and
//! status, plus in-flight requests and upstream failures. Hand-rolled because two counter
//! families do not justify a metrics framework.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// (route, method, status) → (count, seconds).
type RequestTable = BTreeMap<(String, String, u16), (u64, f64)>;

/// The registry.
#[derive(Debug, Default)]
pub struct Metrics {
    requests: Mutex<RequestTable>,
    in_flight: AtomicI64,
    upstream_errors: AtomicU64,
}

impl Metrics {
    /// A request started.
    pub fn started(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
    }

    /// A request finished (its response head was produced).
    pub fn finished(&self, route: &str, method: &str, status: u16, seconds: f64) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
        let mut requests = self
            .requests
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let entry = requests
            .entry((route.to_owned(), method.to_owned(), status))
            .or_default();
        entry.0 += 1;
        entry.1 += seconds;
    }

    /// An upstream could not be reached.
    pub fn upstream_error(&self) {
        self.upstream_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str(
            "# HELP omabox_http_requests_total HTTP requests by route, method and status.\n",
        );
        out.push_str("# TYPE omabox_http_requests_total counter\n");
        let requests = self
            .requests
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        for ((route, method, status), (count, _)) in &requests {
            let _ = writeln!(
                out,
                "omabox_http_requests_total{{route=\"{}\",method=\"{}\",status=\"{status}\"}} {count}",
                escape(route),
                escape(method)
            );
        }
        out.push_str("# HELP omabox_http_request_duration_seconds_sum Time to response head.\n");
        out.push_str("# TYPE omabox_http_request_duration_seconds_sum counter\n");
        for ((route, method, status), (_, seconds)) in &requests {
            let _ = writeln!(
                out,
                "omabox_http_request_duration_seconds_sum{{route=\"{}\",method=\"{}\",status=\"{status}\"}} {seconds}",
                escape(route),
                escape(method)
            );
        }
        out.push_str(
            "# HELP omabox_http_requests_in_flight Requests without a response head yet.\n",
        );
        out.push_str("# TYPE omabox_http_requests_in_flight gauge\n");
        let _ = writeln!(
            out,
            "omabox_http_requests_in_flight {}",
            self.in_flight.load(Ordering::Relaxed)
        );
        out.push_str("# HELP omabox_upstream_errors_total Upstream requests that failed before a response.\n");
        out.push_str("# TYPE omabox_upstream_errors_total counter\n");
        let _ = writeln!(
            out,
            "omabox_upstream_errors_total {}",
            self.upstream_errors.load(Ordering::Relaxed)
        );
        out
    }
}

fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters() {
        let metrics = Metrics::default();
        metrics.started();
        metrics.finished("/healthz", "GET", 200, 0.5);
        metrics.upstream_error();
        let text = metrics.render();
        assert!(text.contains(
            "omabox_http_requests_total{route=\"/healthz\",method=\"GET\",status=\"200\"} 1"
        ));
        assert!(text.contains("omabox_http_requests_in_flight 0"));
        assert!(text.contains("omabox_upstream_errors_total 1"));
    }
}
