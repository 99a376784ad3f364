//! The plain `omabox sandbox run` command line, read without clap: `sandbox run [--backend
//! B] -- CMD ARGS…`, the options all at their defaults. clap builds its whole parser (every
//! option with its help text) before it reads a word: ~130 µs of every such run, spent
//! before the sandbox's PID 1 can be forked. Any other line (an option, `--help`, a missing
//! command, a word that is not UTF-8) is not taken here: clap parses it, with its messages.
//! The test holds this reading to clap's for every line it takes.
//!
//! Must never: accept a line clap would refuse, or read one differently from clap.

use std::ffi::OsString;

use omabox_node::config::{Flags, Key};

use super::{RunArgs, SandboxArgs, SandboxCommand, SandboxRunOnly};

/// `omabox sandbox run ARGS…` parsed by a parser of `sandbox run`'s own arguments,
/// without building the whole command tree (a sandbox start is a few milliseconds; the
/// whole tree is a sizeable part of one). `None` for any other command line and for one
/// this parser does not accept (`--help`, a global option, a usage error): the full
/// parser then handles it, with its messages. A plain line (`parse`) is read without
/// clap.
pub fn parse_sandbox_run() -> Option<(SandboxArgs, Flags)> {
    let mut args = std::env::args_os();
    args.next()?;
    if args.next()? != "sandbox" || args.next()? != "run" {
        return None;
    }
    let words: Vec<OsString> = args.collect();
    let (run, data_dir) = match parse(&words) {
        Some(run) => (run, None),
        None => {
            let argv = std::iter::once(OsString::from("omabox sandbox run")).chain(words);
            let parsed = <SandboxRunOnly as clap::Parser>::try_parse_from(argv).ok()?;
            (parsed.run, parsed.data_dir)
        }
    };
    let args = SandboxArgs {
        command: SandboxCommand::Run(run),
    };
    let flags = args.flags(Flags::new().with_some(Key::DataDir, data_dir));
    Some((args, flags))
}

/// The words after `sandbox run` as [`RunArgs`], if they are a plain line.
fn parse(words: &[OsString]) -> Option<RunArgs> {
    let words: Vec<&str> = words.iter().map(|w| w.to_str()).collect::<Option<_>>()?;
    let (backend, rest) = match &words[..] {
        ["--backend", b, rest @ ..] => (*b, rest),
        [w, rest @ ..] if w.starts_with("--backend=") => (&w["--backend=".len()..], rest),
        rest => ("linux", rest),
    };
    let ["--", command @ ..] = rest else {
        return None;
    };
    if backend.is_empty() || backend.starts_with('-') || command.is_empty() {
        return None;
    }
    Some(RunArgs {
        backend: backend.to_owned(),
        image: None,
        workspace: None,
        memory: None,
        pids: None,
        cpus: None,
        network: None,
        allow_hosts: Vec::new(),
        allow_package_managers: false,
        env: Vec::new(),
        command: command.iter().map(|w| (*w).to_owned()).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &[&str]) -> Vec<OsString> {
        line.iter().map(OsString::from).collect()
    }

    fn clap(line: &[&str]) -> Option<RunArgs> {
        let argv = std::iter::once("omabox sandbox run").chain(line.iter().copied());
        <SandboxRunOnly as clap::Parser>::try_parse_from(argv)
            .ok()
            .filter(|parsed| parsed.data_dir.is_none())
            .map(|parsed| parsed.run)
    }

    #[test]
    fn a_plain_line_reads_as_clap_reads_it() {
        for line in [
            &["--", "echo", "x"][..],
            &["--", "true"],
            &["--backend", "linux", "--", "echo", "x"],
            &["--backend", "local", "--", "sh", "-c", "echo hi"],
            &["--backend=linux", "--", "true"],
            &["--", "echo", "--", "-x", "--backend", "local"],
            &["--", "-n"],
            &["--", ""],
        ] {
            let ours = parse(&words(line)).unwrap_or_else(|| panic!("not taken: {line:?}"));
            let theirs = clap(line).unwrap_or_else(|| panic!("clap refuses {line:?}"));
            assert_eq!(format!("{ours:?}"), format!("{theirs:?}"), "{line:?}");
        }
    }

    #[test]
    fn any_other_line_is_left_to_clap() {
        for line in [
            &[][..],
            &["--"],
            &["echo", "x"],
            &["--help"],
            &["--memory", "1G", "--", "true"],
            &["-e", "A=B", "--", "true"],
            &["--data-dir", "/tmp/x", "--", "true"],
            &["--backend"],
            &["--backend", "--", "true"],
            &["--backend=", "--", "true"],
            &["--backend", "linux", "--backend", "local", "--", "true"],
            &["--backend", "linux", "echo"],
        ] {
            assert!(parse(&words(line)).is_none(), "{line:?}");
        }
        // Not UTF-8: clap's to report.
        use std::os::unix::ffi::OsStringExt;
        let line = vec![OsString::from("--"), OsString::from_vec(vec![0xff])];
        assert!(parse(&line).is_none());
    }
}
