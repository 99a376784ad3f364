//! TLS to PostgreSQL through the URL's `sslmode` and `sslrootcert`: a server started with
//! `ssl=on` and a certificate of a CA this test makes, refusing TCP logins without TLS. A
//! `verify-full` connection to it works; a CA that did not sign it, or a host name its
//! certificate does not name, is refused with an error saying so; `verify-ca` accepts the
//! other name; no error carries the password.
//!
//! The server is started by `omabox_test_support::postgres` (the capability gate: skipped
//! with a reason locally, a failure under `CI=true`).

use omabox_contract::VaultSecretPort;
use omabox_store::PostgresStore;
use omabox_test_support::postgres::TestPostgres;
use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;

/// A CA and the server's certificate (for `127.0.0.1` only) and key, all PEM.
struct Pki {
    ca: String,
    server_cert: String,
    server_key: String,
}

fn ca() -> (rcgen::Certificate, rcgen::KeyPair) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::default();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "omabox test CA");
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    (params.self_signed(&key).unwrap(), key)
}

fn pki() -> Pki {
    let (ca, ca_key) = ca();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::default();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "127.0.0.1");
    params.subject_alt_names = vec![rcgen::SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST))];
    params.is_ca = rcgen::IsCa::ExplicitNoCa;
    let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
    Pki {
        ca: ca.pem(),
        server_cert: cert.pem(),
        server_key: key.serialize_pem(),
    }
}

fn with_tls(url: &str, mode: &str, root: &Path) -> String {
    format!("{url}?sslmode={mode}&sslrootcert={}", root.display())
}

/// The store's error text when connecting to `url` fails (it must).
async fn refusal(url: &str) -> String {
    match PostgresStore::connect(url).await {
        Ok(_) => panic!("connected to {url}"),
        Err(error) => {
            let mut text = error.to_string();
            let mut source = std::error::Error::source(&error);
            while let Some(cause) = source {
                text.push_str(&format!(": {cause}"));
                source = cause.source();
            }
            text
        }
    }
}

#[tokio::test]
async fn verify_full_connects_and_a_wrong_ca_or_name_is_refused_without_the_password() {
    let pki = pki();
    let Some(server) = TestPostgres::start_with_tls_or_skip(&pki.server_cert, &pki.server_key)
    else {
        return;
    };
    let url = server.create_database("tls").unwrap();
    let password = server.password().to_owned();
    let dir = tempfile::tempdir().unwrap();
    let right_ca = dir.path().join("ca.pem");
    std::fs::write(&right_ca, &pki.ca).unwrap();
    let wrong_ca = dir.path().join("other-ca.pem");
    std::fs::write(&wrong_ca, ca().0.pem()).unwrap();

    // Verified: the store works (it migrated over the connection, and keeps a secret).
    let store = PostgresStore::connect(&with_tls(&url, "verify-full", &right_ca))
        .await
        .unwrap();
    store
        .put(
            "over-tls",
            omabox_contract::SecretString::new("v".to_owned()),
        )
        .await
        .unwrap();
    assert_eq!(store.names().await.unwrap(), ["over-tls"]);

    // The server refuses a login without TLS: so the one above was encrypted.
    let plain = refusal(&format!("{url}?sslmode=disable")).await;
    assert!(plain.contains("no pg_hba.conf entry"), "{plain}");

    // A CA that did not sign the server's certificate.
    let wrong = refusal(&with_tls(&url, "verify-full", &wrong_ca)).await;
    assert!(wrong.contains("invalid peer certificate"), "{wrong}");
    assert!(
        wrong.contains("omabox@127.0.0.1:"),
        "names the database: {wrong}"
    );

    // The right CA, but a name the certificate does not carry: verify-full refuses,
    // verify-ca (the chain only) accepts.
    let localhost = url.replace("@127.0.0.1:", "@localhost:");
    let misnamed = refusal(&with_tls(&localhost, "verify-full", &right_ca)).await;
    assert!(misnamed.contains("invalid peer certificate"), "{misnamed}");
    PostgresStore::connect(&with_tls(&localhost, "verify-ca", &right_ca))
        .await
        .unwrap();

    // A root file that is not there is named; `require` encrypts without a root file.
    let missing = refusal(&with_tls(&url, "verify-full", &dir.path().join("nope.pem"))).await;
    assert!(missing.contains("nope.pem"), "{missing}");
    PostgresStore::connect(&format!("{url}?sslmode=require"))
        .await
        .unwrap();

    for text in [&plain, &wrong, &misnamed, &missing] {
        assert!(
            !text.contains(&password),
            "the password in an error: {text}"
        );
    }
}
