//! `Environment.config.dockerfile`, the subset omabox builds into an environment layer:
//! `RUN`, `ENV`, `WORKDIR` and `COPY` of a file from omabox's file store, run over the
//! environment's image (the contract's platform prepended its own `FROM` and rejected a
//! user's; so does this). Pure: parsing and the shell script, no I/O.
//!
//! ```text
//! # comments and blank lines are skipped; a trailing `\` continues the line
//! RUN apt-get install -y jq            shell form, run by /bin/sh -c
//! RUN ["make", "-C", "/opt/x"]          exec form (JSON), each word single-quoted
//! ENV A=1 B="two words"  |  ENV A 1     every later step and every sandbox of the layer
//! WORKDIR /opt/x                        created; later RUNs start there (relative: joined)
//! COPY file_0123… /opt/x/data.csv       a file of omabox's file store (`omabox files add`);
//!                                       a DEST ending in `/` gets the id as its name
//! ```
//!
//! The builder stages every copied file at [`COPY_STAGING`]`/<id>` in the build sandbox
//! before the script runs. Every other instruction (`FROM`, `ADD`, `USER`, `CMD`, …), every
//! flag (`RUN --mount`, `--network`, `--security`; `COPY --chown`, `--from`) and a `RUN`
//! heredoc is refused with its line and text, so a dockerfile never half-applies.

use std::collections::BTreeMap;

/// The contract's cap on `config.dockerfile`.
pub const MAX_DOCKERFILE_CHARS: usize = 100_000;
/// Where the builder puts the files `COPY` takes, one per id, before the script runs.
pub const COPY_STAGING: &str = "/tmp/.omabox-copy";

/// One step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// A shell command.
    Run(String),
    /// Variables set for every later step and for the layer's sandboxes.
    Env(Vec<(String, String)>),
    /// The working directory of later steps (absolute).
    Workdir(String),
    /// A file of omabox's file store, by id, copied to an absolute path.
    Copy {
        /// The store's id.
        file: String,
        /// Where it goes.
        dest: String,
    },
}

/// A parsed dockerfile.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Dockerfile {
    /// In order.
    pub steps: Vec<Step>,
}

/// Why a dockerfile was refused: the line and the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("dockerfile line {line}: {reason}")]
pub struct DockerfileError {
    /// 1-based line of the instruction.
    pub line: usize,
    /// What is wrong.
    pub reason: String,
}

impl Dockerfile {
    /// Parses `text` (see the module doc).
    pub fn parse(text: &str) -> Result<Self, DockerfileError> {
        if text.chars().count() > MAX_DOCKERFILE_CHARS {
            return Err(DockerfileError {
                line: 0,
                reason: format!("longer than {MAX_DOCKERFILE_CHARS} characters"),
            });
        }
        let mut steps = Vec::new();
        let mut workdir = String::from("/");
        let mut pending = String::new();
        let mut start = 0;
        for (index, raw) in text.lines().enumerate() {
            if pending.is_empty() {
                start = index + 1;
                let trimmed = raw.trim_start();
                if trimmed.is_empty() || trimmed.starts_with('#') {
                    continue;
                }
            }
            if let Some(head) = raw.strip_suffix('\\') {
                pending.push_str(head);
                pending.push(' ');
                continue;
            }
            pending.push_str(raw);
            let line = std::mem::take(&mut pending);
            steps.push(
                parse_instruction(line.trim(), &mut workdir).map_err(|reason| DockerfileError {
                    line: start,
                    reason,
                })?,
            );
        }
        if !pending.trim().is_empty() {
            return Err(DockerfileError {
                line: start,
                reason: "ends in a line continuation".into(),
            });
        }
        Ok(Self { steps })
    }

    /// The variables its `ENV` steps leave set.
    pub fn env(&self) -> BTreeMap<String, String> {
        let mut env = BTreeMap::new();
        for step in &self.steps {
            if let Step::Env(pairs) = step {
                env.extend(pairs.iter().cloned());
            }
        }
        env
    }

    /// The file-store ids its `COPY` steps take, sorted, once each.
    pub fn copied_files(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .steps
            .iter()
            .filter_map(|step| match step {
                Step::Copy { file, .. } => Some(file.clone()),
                _ => None,
            })
            .collect();
        ids.sort();
        ids.dedup();
        ids
    }

    /// A `/bin/sh` script that runs the steps in order and stops at the first failure.
    pub fn script(&self) -> String {
        let mut script = String::from("set -e\ncd /");
        for step in &self.steps {
            script.push('\n');
            match step {
                Step::Run(command) => script.push_str(&format!("/bin/sh -c {}", quote(command))),
                Step::Env(pairs) => {
                    let assignments: Vec<String> = pairs
                        .iter()
                        .map(|(k, v)| format!("{k}={}", quote(v)))
                        .collect();
                    script.push_str(&format!("export {}", assignments.join(" ")));
                }
                Step::Workdir(dir) => {
                    let dir = quote(dir);
                    script.push_str(&format!("mkdir -p {dir} && cd {dir}"));
                }
                Step::Copy { file, dest } => {
                    let (source, dest) = (quote(&format!("{COPY_STAGING}/{file}")), quote(dest));
                    script.push_str(&format!(
                        "mkdir -p \"$(dirname {dest})\" && cp {source} {dest}"
                    ));
                }
            }
        }
        script
    }
}

fn parse_instruction(line: &str, workdir: &mut String) -> Result<Step, String> {
    let (word, rest) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
    let rest = rest.trim();
    match word.to_ascii_uppercase().as_str() {
        "RUN" if rest.is_empty() => Err("RUN needs a command".into()),
        // BuildKit's `RUN --mount=…`, `--network=…`, `--security=…`: each changes what the
        // step may reach or keep, none of which this builder does; run as a shell command
        // the flag would only fail later, or worse, run.
        "RUN" if rest.starts_with("--") => {
            let flag = rest.split_whitespace().next().unwrap_or(rest);
            Err(format!(
                "RUN {} is not supported (omabox's RUN takes no flags)",
                shown(flag)
            ))
        }
        "RUN" if rest.starts_with("<<") => Err(format!(
            "RUN {} is not supported (heredocs: write the script on RUN lines)",
            shown(rest.split_whitespace().next().unwrap_or(rest))
        )),
        "RUN" if rest.starts_with('[') => {
            let words: Vec<String> = serde_json::from_str(rest)
                .map_err(|e| format!("RUN's exec form is not a JSON list of strings: {e}"))?;
            if words.is_empty() {
                return Err("RUN needs a command".into());
            }
            Ok(Step::Run(
                words.iter().map(|w| quote(w)).collect::<Vec<_>>().join(" "),
            ))
        }
        "RUN" => Ok(Step::Run(rest.to_owned())),
        "ENV" => parse_env(rest).map(Step::Env),
        "WORKDIR" if rest.is_empty() || rest.contains('\0') => Err("WORKDIR needs a path".into()),
        "WORKDIR" => {
            let dir = if rest.starts_with('/') {
                rest.to_owned()
            } else {
                format!("{}/{rest}", workdir.trim_end_matches('/'))
            };
            *workdir = dir.clone();
            Ok(Step::Workdir(dir))
        }
        "COPY" => parse_copy(rest, workdir),
        "FROM" => Err(
            "FROM is not allowed: the environment's image is the base (set it with SANDBOX_IMAGE)"
                .into(),
        ),
        other if other.chars().all(|c| c.is_ascii_alphabetic()) && !other.is_empty() => Err(
            format!("{other} is not supported (omabox builds RUN, ENV, WORKDIR and COPY)"),
        ),
        _ => Err(format!("{word:?} is not an instruction")),
    }
}

/// `COPY ID DEST` (see the module doc).
fn parse_copy(rest: &str, workdir: &str) -> Result<Step, String> {
    let words = split_words(rest)?;
    if let Some(flag) = words.iter().find(|w| w.starts_with("--")) {
        return Err(format!("COPY {flag} is not supported"));
    }
    let [file, dest] = words.as_slice() else {
        return Err("COPY takes one file id of omabox's file store and a destination".into());
    };
    let id_ok = !file.is_empty()
        && file.len() <= 128
        && file
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !id_ok {
        return Err(format!(
            "COPY {file:?} is not a file id of omabox's file store (`omabox files add PATH` prints one)"
        ));
    }
    if dest.contains('\0') || dest.split('/').any(|c| c == "..") {
        return Err(format!(
            "COPY destination {dest:?} may not hold `..` or NUL"
        ));
    }
    let mut dest = if dest.starts_with('/') {
        dest.clone()
    } else {
        format!("{}/{dest}", workdir.trim_end_matches('/'))
    };
    if dest.ends_with('/') {
        dest.push_str(file);
    }
    Ok(Step::Copy {
        file: file.clone(),
        dest,
    })
}

/// `ENV K=V [K=V …]` (values may be quoted) or the legacy `ENV K V…`.
fn parse_env(rest: &str) -> Result<Vec<(String, String)>, String> {
    let valid = |key: &str| {
        let mut chars = key.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    let pairs = match rest.split_once(char::is_whitespace) {
        Some((key, value)) if !key.contains('=') => vec![(key.to_owned(), value.trim().to_owned())],
        _ if !rest.contains('=') => return Err("ENV needs KEY=VALUE".into()),
        _ => split_words(rest)?
            .into_iter()
            .map(|word| match word.split_once('=') {
                Some((k, v)) => Ok((k.to_owned(), v.to_owned())),
                None => Err(format!("ENV word {word:?} is not KEY=VALUE")),
            })
            .collect::<Result<_, _>>()?,
    };
    for (key, value) in &pairs {
        if !valid(key) {
            return Err(format!("ENV name {key:?} is not a variable name"));
        }
        if value.contains('\0') {
            return Err(format!("ENV {key} holds a NUL"));
        }
    }
    Ok(pairs)
}

/// Splits on whitespace outside quotes; `"…"` and `'…'` group, `\` escapes one character
/// (outside single quotes).
fn split_words(text: &str) -> Result<Vec<String>, String> {
    let (mut words, mut word, mut quote, mut any) = (Vec::new(), String::new(), None, false);
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some('\''), c) => word.push(c),
            (_, '\\') => word.push(chars.next().ok_or("ends in a backslash")?),
            (Some(_), c) => word.push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                any = true;
            }
            (None, c) if c.is_whitespace() => {
                if any || !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
                any = false;
            }
            (None, c) => word.push(c),
        }
    }
    if quote.is_some() {
        return Err("an unterminated quote".into());
    }
    if any || !word.is_empty() {
        words.push(word);
    }
    Ok(words)
}

/// A word of the dockerfile for a message: at most 200 characters, control characters
/// escaped.
fn shown(word: &str) -> String {
    let mut out: String = word
        .chars()
        .take(200)
        .flat_map(char::escape_debug)
        .collect();
    if word.chars().count() > 200 {
        out.push('…');
    }
    out
}

/// `text` single-quoted for `/bin/sh`.
fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_subset_parses_into_steps_and_a_script() {
        let file = Dockerfile::parse(
            "# tools\nRUN echo one \\\n  two\nENV A=1 B=\"two words\" C='x y'\nENV D legacy value\n\nWORKDIR /opt/x\nWORKDIR sub\nRUN [\"printf\", \"%s\\n\", \"it's\"]\nCOPY file_1 data/in.csv\nCOPY file_1 /etc/tool/\n",
        )
        .unwrap();
        assert_eq!(
            file.steps,
            vec![
                Step::Run("echo one    two".into()),
                Step::Env(vec![
                    ("A".into(), "1".into()),
                    ("B".into(), "two words".into()),
                    ("C".into(), "x y".into())
                ]),
                Step::Env(vec![("D".into(), "legacy value".into())]),
                Step::Workdir("/opt/x".into()),
                Step::Workdir("/opt/x/sub".into()),
                Step::Run(
                    r"'printf' '%s
' 'it'\''s'"
                        .into()
                ),
                Step::Copy {
                    file: "file_1".into(),
                    dest: "/opt/x/sub/data/in.csv".into()
                },
                Step::Copy {
                    file: "file_1".into(),
                    dest: "/etc/tool/file_1".into()
                },
            ]
        );
        assert_eq!(file.copied_files(), vec!["file_1".to_owned()]);
        assert_eq!(file.env()["B"], "two words");
        let script = file.script();
        assert!(
            script.starts_with("set -e\ncd /\n/bin/sh -c 'echo one    two'\n"),
            "{script}"
        );
        assert!(
            script.contains("export A='1' B='two words' C='x y'"),
            "{script}"
        );
        assert!(
            script.contains("mkdir -p '/opt/x/sub' && cd '/opt/x/sub'"),
            "{script}"
        );
        assert!(
            script.contains(
                "mkdir -p \"$(dirname '/etc/tool/file_1')\" && cp '/tmp/.omabox-copy/file_1' '/etc/tool/file_1'"
            ),
            "{script}"
        );
    }

    #[test]
    fn everything_else_is_refused_with_its_line() {
        for (text, line, reason) in [
            ("FROM debian", 1, "FROM is not allowed"),
            ("RUN true\n\nADD a /b", 3, "ADD is not supported"),
            ("COPY --chown=1 f /b", 1, "COPY --chown=1 is not supported"),
            ("COPY a b c", 1, "COPY takes one file id"),
            ("COPY ../x /b", 1, "not a file id"),
            ("COPY f /a/../b", 1, "may not hold `..`"),
            ("run true\nUSER nobody", 2, "USER is not supported"),
            ("ENV 1A=x", 1, "not a variable name"),
            ("ENV A", 1, "ENV needs KEY=VALUE"),
            ("ENV A=\"open", 1, "unterminated quote"),
            ("RUN [\"a\", 1]", 1, "not a JSON list of strings"),
            ("RUN", 1, "RUN needs a command"),
            (
                "RUN true\nRUN --mount=type=cache,target=/root/.cache pip install six",
                2,
                "RUN --mount=type=cache,target=/root/.cache is not supported",
            ),
            (
                "RUN \\\n  --network=none curl x",
                1,
                "RUN --network=none is not supported",
            ),
            (
                "RUN --security=insecure id",
                1,
                "RUN --security=insecure is not",
            ),
            (
                "RUN <<EOF\necho hi\nEOF",
                1,
                "RUN <<EOF is not supported (heredocs",
            ),
            ("RUN true \\", 1, "ends in a line continuation"),
            ("--x", 1, "is not an instruction"),
        ] {
            let e = Dockerfile::parse(text).unwrap_err();
            assert_eq!(e.line, line, "{text}: {e}");
            assert!(e.reason.contains(reason), "{text}: {e}");
        }
        let long = "#".repeat(MAX_DOCKERFILE_CHARS + 1);
        assert!(
            Dockerfile::parse(&long)
                .unwrap_err()
                .reason
                .contains("longer")
        );
    }
}
