//! An E2B template build's steps as what omabox builds: an environment layer's dockerfile
//! (`omabox_sandbox::dockerfile`: `RUN`, `WORKDIR`, `COPY` of a staged file) over the
//! base the build names. Pure: no I/O.
//!
//! | E2B step | omabox |
//! |---|---|
//! | `RUN cmd [root]` | `RUN ["env", <ENVs so far>, "/bin/sh", "-c", cmd]` |
//! | `ENV k v …` | set for the later `RUN`s only (E2B: build-time variables) |
//! | `WORKDIR dir` | `WORKDIR dir` |
//! | `USER root` | nothing (steps run as root) |
//! | `COPY src dest [owner] [mode]` | the uploaded archive staged, unpacked in `/tmp`, `src` copied to `dest` |
//!
//! Refused, naming the step: any other step, `RUN` or `USER` as another user, a `COPY`
//! whose files were not uploaded or whose `src` is a pattern, `startCmd`, `readyCmd`,
//! registry credentials.
//!
//! Must never: let a step's text escape its own `RUN` (every value goes through JSON into
//! an exec-form word, never into shell text of ours).

use omabox_backend_linux::env_layer::CopyFile;
use omabox_proxy::templates::TemplateBuildSpec;
use std::collections::BTreeMap;

/// The template every other starts from when none is named.
pub const BASE: &str = "base";
/// Where a `COPY`'s archive waits in the build sandbox (its `/tmp`: not in the layer).
const ARCHIVES: &str = "/tmp/.omabox-template";

/// Unpacks archive `$1`, copies its `$2` to `$3` (into it when `$3` ends in `/` or `$2` is
/// a directory), then `chmod -R $4` and `chown -R $5` when given.
const COPY_SCRIPT: &str = r#"set -e
d=$(mktemp -d)
tar --no-same-owner -xf "$1" -C "$d"
s="$d/$2"
if [ ! -e "$s" ] && [ ! -L "$s" ]; then echo "COPY $2: not among the uploaded files" >&2; exit 1; fi
if [ -d "$s" ] && [ ! -L "$s" ]; then
  mkdir -p "$3"; cp -a "$s/." "$3"; t="$3"
else
  case "$3" in
    */) mkdir -p "$3"; t="$3$(basename "$2")" ;;
    *) mkdir -p "$(dirname "$3")"; t="$3" ;;
  esac
  cp -a "$s" "$t"
fi
if [ -n "$4" ]; then chmod -R "$4" "$t"; fi
if [ -n "$5" ]; then chown -R "$5" "$t"; fi
rm -rf "$d" "$1""#;

/// What a template's sandboxes start from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Base {
    /// The node's own root (`base`).
    Node,
    /// An image reference.
    Image(String),
}

/// How a template is built: its base, the dockerfile lines over it and the files they copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recipe {
    /// The base.
    pub base: Base,
    /// The dockerfile, a line each.
    pub lines: Vec<String>,
    /// The archives its `COPY`s stage, by id.
    pub files: BTreeMap<String, CopyFile>,
}

impl Recipe {
    /// The dockerfile's text (`None`: nothing to build over the base).
    pub fn dockerfile(&self) -> Option<String> {
        (!self.lines.is_empty()).then(|| self.lines.join("\n") + "\n")
    }
}

fn word_list(words: &[&str]) -> String {
    serde_json::to_string(words).unwrap_or_default()
}

fn is_root(user: &str) -> bool {
    user.is_empty() || user == "root" || user == "0"
}

/// An image reference's shape, as `POST /sandboxes` takes one.
fn check_image(image: &str) -> Result<(), String> {
    if !image.contains([':', '/', '@'])
        || image.len() > 512
        || image.chars().any(|c| c.is_control() || c.is_whitespace())
    {
        let shown: String = image.chars().take(64).collect();
        return Err(format!(
            "fromImage {shown:?} is not an image reference omabox pulls (NAME:TAG, REGISTRY/REPO:TAG, a path)"
        ));
    }
    Ok(())
}

/// The recipe of `spec`: `parent` is the recipe of its `fromTemplate` (when that is a
/// template built before), `files` the archive uploaded for a files hash.
pub fn recipe_of(
    spec: &TemplateBuildSpec,
    parent: Option<&Recipe>,
    files: &dyn Fn(&str) -> Option<CopyFile>,
) -> Result<Recipe, String> {
    if spec.registry_credentials {
        return Err("fromImageRegistry: registry credentials in a build are not supported (omabox pulls with the node's registry settings)".into());
    }
    if spec.start_cmd.is_some() || spec.ready_cmd.is_some() {
        return Err(
            "startCmd/readyCmd: omabox's templates start no command (run it after Sandbox.create)"
                .into(),
        );
    }
    let mut recipe = match (&spec.from_image, spec.from_template.as_deref()) {
        (Some(_), Some(_)) => return Err("fromImage and fromTemplate: name one base".into()),
        (Some(image), None) => {
            check_image(image)?;
            Recipe {
                base: Base::Image(image.clone()),
                lines: Vec::new(),
                files: BTreeMap::new(),
            }
        }
        (None, None | Some(BASE)) => Recipe {
            base: Base::Node,
            lines: Vec::new(),
            files: BTreeMap::new(),
        },
        (None, Some(name)) => parent.cloned().ok_or_else(|| {
            let shown: String = name.chars().take(64).collect();
            format!("fromTemplate {shown:?}: no such template with a finished build (\"{BASE}\" or one built here)")
        })?,
    };
    let mut envs: Vec<String> = Vec::new();
    for (index, step) in spec.steps.iter().enumerate() {
        let n = index + 1;
        let kind = step.kind.to_ascii_uppercase();
        let arg = |i: usize| step.args.get(i).map(String::as_str).unwrap_or_default();
        let fail = |reason: &str| Err(format!("step {n} ({kind}): {reason}"));
        if step.args.iter().any(|a| a.contains('\0')) {
            return fail("an argument holds a NUL byte");
        }
        match kind.as_str() {
            "RUN" => {
                if arg(0).trim().is_empty() {
                    return fail("no command");
                }
                if !is_root(arg(1)) {
                    return fail(
                        "omabox runs build steps as root only (run_cmd without user, or user=\"root\")",
                    );
                }
                let mut words: Vec<&str> = vec!["env"];
                words.extend(envs.iter().map(String::as_str));
                words.extend(["/bin/sh", "-c", arg(0)]);
                recipe.lines.push(format!("RUN {}", word_list(&words)));
            }
            "ENV" => {
                if step.args.len() % 2 != 0 {
                    return fail("takes names and values in pairs");
                }
                for pair in step.args.chunks(2) {
                    let valid = pair[0]
                        .chars()
                        .next()
                        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                        && pair[0]
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || c == '_');
                    if !valid {
                        let shown: String = pair[0].chars().take(64).collect();
                        return fail(&format!("{shown:?} is not a variable name"));
                    }
                    envs.push(format!("{}={}", pair[0], pair[1]));
                }
            }
            "WORKDIR" => {
                if arg(0).is_empty() || arg(0).contains(['\n', '\r']) {
                    return fail("needs a path on one line");
                }
                recipe.lines.push(format!("WORKDIR {}", arg(0)));
            }
            "USER" if is_root(arg(0)) => {}
            "USER" => return fail("omabox runs build steps as root only"),
            "COPY" => {
                let (src, dest, owner, mode) = (arg(0), arg(1), arg(2), arg(3));
                if src.is_empty() || dest.is_empty() {
                    return fail("needs a source and a destination");
                }
                if src.starts_with('/')
                    || src.contains(['*', '?', '[', '\n', '\r'])
                    || src.split('/').any(|c| c == "..")
                    || dest.contains(['\n', '\r'])
                {
                    return fail(
                        "the source must be a relative path in the context without patterns or `..`, the destination one line",
                    );
                }
                if !mode.chars().all(|c| c.is_ascii_digit()) || mode.len() > 4 {
                    return fail("the mode must be octal digits");
                }
                let Some(hash) = step.files_hash.as_deref() else {
                    return fail("no filesHash");
                };
                let Some(file) = files(hash) else {
                    return fail(
                        "its files were not uploaded (GET /templates/{id}/files/{hash} first)",
                    );
                };
                let id = format!("tpl-{}", &file.sha256[..32.min(file.sha256.len())]);
                let staged = format!("{ARCHIVES}/{id}");
                recipe.lines.push(format!("COPY {id} {staged}"));
                let words = [
                    "/bin/sh",
                    "-c",
                    COPY_SCRIPT,
                    "sh",
                    &staged,
                    src,
                    dest,
                    mode,
                    owner,
                ];
                recipe.lines.push(format!("RUN {}", word_list(&words)));
                recipe.files.insert(id, file);
            }
            _ => {
                return fail("not supported by omabox (RUN, COPY, ENV, WORKDIR and USER root are)");
            }
        }
    }
    Ok(recipe)
}

#[cfg(test)]
mod tests {
    use super::*;
    use omabox_proxy::templates::TemplateStep;
    use std::path::PathBuf;

    fn step(kind: &str, args: &[&str]) -> TemplateStep {
        TemplateStep {
            kind: kind.into(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            files_hash: (kind == "COPY").then(|| "h1".to_owned()),
        }
    }

    fn spec(steps: Vec<TemplateStep>) -> TemplateBuildSpec {
        TemplateBuildSpec {
            from_template: Some(BASE.into()),
            steps,
            ..Default::default()
        }
    }

    fn uploaded(hash: &str) -> Option<CopyFile> {
        (hash == "h1").then(|| CopyFile {
            path: PathBuf::from("/data/h1"),
            sha256: "ab".repeat(32),
        })
    }

    #[test]
    fn steps_become_a_dockerfile_omabox_parses() {
        let recipe = recipe_of(
            &spec(vec![
                step("ENV", &["A", "one \"two\"\n"]),
                step("RUN", &["echo $A > /opt/x; echo 'q'"]),
                step("WORKDIR", &["/opt/app"]),
                step("USER", &["root"]),
                step("COPY", &["app.py", "/opt/app/", "", "0755"]),
                step("RUN", &["ls", "root"]),
            ]),
            None,
            &uploaded,
        )
        .unwrap();
        assert_eq!(recipe.base, Base::Node);
        let text = recipe.dockerfile().unwrap();
        let parsed = omabox_sandbox::dockerfile::Dockerfile::parse(&text).unwrap();
        assert_eq!(parsed.steps.len(), 5, "{text}");
        assert_eq!(parsed.copied_files(), [format!("tpl-{}", "ab".repeat(16))]);
        assert!(
            text.starts_with("RUN [\"env\",\"A=one \\\"two\\\"\\n\",\"/bin/sh\""),
            "{text}"
        );
        assert_eq!(recipe.files.len(), 1);
        // A chained template starts from its parent's recipe.
        let child = recipe_of(
            &TemplateBuildSpec {
                from_template: Some("mine".into()),
                steps: vec![step("RUN", &["true"])],
                ..Default::default()
            },
            Some(&recipe),
            &uploaded,
        )
        .unwrap();
        assert_eq!(child.lines.len(), recipe.lines.len() + 1);
    }

    #[test]
    fn what_omabox_cannot_honour_is_refused_naming_the_step() {
        for (steps, needle) in [
            (
                vec![step("RUN", &["id", "user"])],
                "step 1 (RUN): omabox runs build steps as root",
            ),
            (
                vec![step("RUN", &["true"]), step("USER", &["user"])],
                "step 2 (USER)",
            ),
            (
                vec![step("ADD", &["x", "y"])],
                "step 1 (ADD): not supported",
            ),
            (vec![step("COPY", &["*.py", "/x/"])], "without patterns"),
            (
                vec![step("COPY", &["../x", "/x/"])],
                "without patterns or `..`",
            ),
            (vec![step("ENV", &["A"])], "pairs"),
            (vec![step("ENV", &["1A", "x"])], "not a variable name"),
        ] {
            let error = recipe_of(&spec(steps), None, &uploaded).unwrap_err();
            assert!(error.contains(needle), "{error}");
        }
        let mut missing = step("COPY", &["a", "/b"]);
        missing.files_hash = Some("other".into());
        let error = recipe_of(&spec(vec![missing]), None, &uploaded).unwrap_err();
        assert!(error.contains("were not uploaded"), "{error}");
        for (spec, needle) in [
            (
                TemplateBuildSpec {
                    start_cmd: Some("x".into()),
                    ..Default::default()
                },
                "startCmd",
            ),
            (
                TemplateBuildSpec {
                    registry_credentials: true,
                    ..Default::default()
                },
                "fromImageRegistry",
            ),
            (
                TemplateBuildSpec {
                    from_template: Some("nope".into()),
                    ..Default::default()
                },
                "no such template",
            ),
            (
                TemplateBuildSpec {
                    from_image: Some("ubuntu".into()),
                    ..Default::default()
                },
                "not an image reference",
            ),
        ] {
            let error = recipe_of(&spec, None, &uploaded).unwrap_err();
            assert!(error.contains(needle), "{error}");
        }
    }
}
