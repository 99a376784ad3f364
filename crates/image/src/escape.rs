//! Text a registry or an image controls (an error body, a realm URL, an archive entry's
//! name), made safe to put into an error that a terminal shows: control characters (C0,
//! DEL, C1: the start of every escape sequence), bidirectional overrides and invisible
//! format characters become `\u{…}` escapes, and the text is cut at a length.
//!
//! Must never return a control or bidi character, or more than the limit asked for (plus
//! the note saying how much was cut).

use std::path::Path;

/// How many characters of a hostile text an error keeps by default.
pub(crate) const SHOWN_CHARS: usize = 300;

/// `text` escaped and cut after `max_chars` characters.
pub(crate) fn untrusted(text: &str, max_chars: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max_chars.saturating_mul(2)));
    for (shown, (at, c)) in text.char_indices().enumerate() {
        if shown == max_chars {
            out.push_str(&format!("… ({} more bytes)", text.len() - at));
            break;
        }
        if needs_escape(c) {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// A path from an image (its entry names are the archive's), escaped for an error.
pub(crate) fn path(path: &Path) -> String {
    untrusted(&path.to_string_lossy(), 4096)
}

fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'                  // Arabic letter mark
            | '\u{200b}'..='\u{200f}'   // zero-width space/joiners, LRM, RLM
            | '\u{2028}'..='\u{202e}'   // line/paragraph separators, embeddings, overrides
            | '\u{2060}'..='\u{2069}'   // word joiner, invisible operators, isolates
            | '\u{feff}'                // zero-width no-break space
            | '\u{fff9}'..='\u{fffb}'   // interlinear annotations
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn controls_and_bidi_overrides_are_escaped_and_long_text_is_cut() {
        let text = "a\u{1b}]52;c;x\u{7}b\u{9b}c\u{202e}d\u{2066}e\r\nf";
        let shown = untrusted(text, 100);
        assert_eq!(
            shown,
            "a\\u{1b}]52;c;x\\u{7}b\\u{9b}c\\u{202e}d\\u{2066}e\\u{d}\\u{a}f"
        );
        assert!(!shown.chars().any(|c| c.is_control() || needs_escape(c)));
        let long = "é".repeat(1000);
        let cut = untrusted(&long, 10);
        assert!(cut.starts_with(&"é".repeat(10)));
        assert!(cut.ends_with("… (1980 more bytes)"), "{cut}");
        assert_eq!(untrusted("plain text", 100), "plain text");
    }
}
