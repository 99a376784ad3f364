//! One module per subcommand.

pub mod bench;
pub mod catalog;
pub mod config;
pub mod files;
pub mod fsck;
pub mod gc;
pub mod image;
pub mod outputs;
pub mod reap;
pub mod run;
pub mod sandbox;
pub mod serve;
pub mod sessions;
pub mod usage;
pub mod vault;
pub mod workspace;

/// `--backend linux|local|docker` as the node's backend (`omabox_node::wiring::Backend`).
pub fn backend_parser() -> impl clap::builder::TypedValueParser<Value = omabox_node::wiring::Backend>
{
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser as _};
    use omabox_node::wiring::Backend;
    PossibleValuesParser::new([
        PossibleValue::new("linux")
            .help("Linux namespaces, cgroups, seccomp and Landlock (root). The default"),
        PossibleValue::new("local")
            .help("A local subprocess with NO isolation; only in test mode (OMABOX_TEST_MODE=1)"),
        PossibleValue::new("docker").help(
            "Containers of the Docker Engine at DOCKER_HOST (needs an image: OMABOX_LINUX_IMAGE)",
        ),
        PossibleValue::new("gvisor")
            .help("Sandboxes under gVisor's runsc (root; the host's /usr read-only, no image yet)"),
    ])
    .map(|name| Backend::from_name(&name).unwrap_or(Backend::Linux))
}
