//! Fuzzes the DNS stub: any datagram must give a response of at most `MAX_RESPONSE` bytes
//! or none, without a panic, and the resolver must only ever be asked names the policy
//! answers (a refused name reaching it would be an exfiltration channel).

#![no_main]

use std::io;
use std::net::IpAddr;
use std::sync::{Arc, OnceLock};

use omabox_contract::networking::{NetworkPolicy, NetworkingConfig};
use omabox_egress::AddressRules;
use omabox_egress::dns::{DnsStub, MAX_RESPONSE};

fn policy() -> NetworkPolicy {
    NetworkPolicy::compile(
        &NetworkingConfig::Limited {
            allowed_hosts: vec!["a.example".into(), "*.b.example".into()],
            allow_package_managers: false,
            allow_mcp_servers: false,
        },
        &[],
    )
    .unwrap()
}

struct PolicyCheckingResolver(NetworkPolicy);

#[async_trait::async_trait]
impl omabox_egress::Resolver for PolicyCheckingResolver {
    async fn resolve(&self, name: &str) -> io::Result<Vec<IpAddr>> {
        assert!(
            self.0.answers(name),
            "the resolver was asked a refused name: {name:?}"
        );
        Ok(vec![
            "192.0.2.1".parse().unwrap(),
            "2001:db8::1".parse().unwrap(),
        ])
    }
}

fn stub() -> &'static (tokio::runtime::Runtime, DnsStub) {
    static STUB: OnceLock<(tokio::runtime::Runtime, DnsStub)> = OnceLock::new();
    STUB.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let resolver = Arc::new(PolicyCheckingResolver(policy()));
        (
            runtime,
            DnsStub::new(policy(), resolver, AddressRules::default()),
        )
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let (runtime, stub) = stub();
    let peer = "127.0.0.1:5353".parse().unwrap();
    if let Some(response) = runtime.block_on(stub.answer(data, peer)) {
        assert!(response.len() <= MAX_RESPONSE);
    }
});
