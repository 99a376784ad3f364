//! A small extension → media type table for Session outputs.

/// The media type of `logical_path`, guessed from its extension (case-insensitive);
/// `application/octet-stream` when unknown.
pub fn guess_media_type(logical_path: &str) -> &'static str {
    let name = logical_path.rsplit('/').next().unwrap_or(logical_path);
    let Some((stem, extension)) = name.rsplit_once('.') else {
        return "application/octet-stream";
    };
    if stem.is_empty() {
        return "application/octet-stream";
    }
    match extension.to_ascii_lowercase().as_str() {
        "txt" | "log" | "text" => "text/plain",
        "md" | "markdown" => "text/markdown",
        "html" | "htm" => "text/html",
        "css" => "text/css",
        "csv" => "text/csv",
        "tsv" => "text/tab-separated-values",
        "js" | "mjs" => "text/javascript",
        "json" => "application/json",
        "jsonl" | "ndjson" => "application/x-ndjson",
        "xml" => "application/xml",
        "yaml" | "yml" => "application/yaml",
        "toml" => "application/toml",
        "pdf" => "application/pdf",
        "zip" => "application/zip",
        "gz" | "tgz" => "application/gzip",
        "tar" => "application/x-tar",
        "wasm" => "application/wasm",
        "png" => "image/png",
        "jpg" | "jpeg" => "image/jpeg",
        "gif" => "image/gif",
        "webp" => "image/webp",
        "svg" => "image/svg+xml",
        "ico" => "image/vnd.microsoft.icon",
        "mp3" => "audio/mpeg",
        "wav" => "audio/wav",
        "mp4" => "video/mp4",
        "webm" => "video/webm",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guesses_from_the_last_extension() {
        assert_eq!(guess_media_type("report.md"), "text/markdown");
        assert_eq!(guess_media_type("dir.d/IMG.JPG"), "image/jpeg");
        assert_eq!(guess_media_type("a.tar.gz"), "application/gzip");
        assert_eq!(guess_media_type(".bashrc"), "application/octet-stream");
        assert_eq!(guess_media_type("Makefile"), "application/octet-stream");
        assert_eq!(guess_media_type("x.unknown"), "application/octet-stream");
    }
}
