//! What a sandbox writes reaches a terminal only as text: [`ControlFilter`] removes the
//! control sequences that make a terminal do more than draw.
//!
//! A program in a sandbox is hostile, and a terminal is an interpreter: an OSC sequence can
//! set the clipboard (OSC 52), the window title or a hyperlink, a DCS can reprogram keys on
//! some terminals, and a report request (device status `CSI 6 n`, attributes `CSI c`,
//! window title `CSI 21 t`) makes the terminal *type its answer into the input* of whatever
//! reads the terminal next — the user's shell, once `omabox` exits. So output that goes to a
//! terminal keeps printable text (UTF-8 untouched; a byte 0x80–0x9f only inside a UTF-8
//! character, since alone it is an 8-bit C1 control to some terminals), tab, newline, carriage return and
//! backspace, SGR colours and styles (`CSI … m`), cursor movement and erasing (`CSI` with
//! final `A`–`H`, `J`, `K`, `f`, `s`, `u`) and cursor show/hide (`CSI ? 25 h/l`): what
//! coloured output and progress bars use. Everything else is dropped: other C0 controls
//! (BEL included), every string sequence (OSC, DCS, APC, PM, SOS — up to BEL or ST, or
//! [`MAX_STRING`] bytes), every other escape and CSI sequence, and a CSI longer than
//! [`MAX_CSI`] bytes. Output that does not go to a terminal (a pipe, a file) is never
//! filtered: `omabox sandbox run … | cat` shows the raw bytes.
//!
//! The filter is a state machine over the byte stream, so a sequence split across reads is
//! recognised as one; its only buffer is one CSI sequence (at most [`MAX_CSI`] bytes).

/// The longest CSI sequence kept (ESC and `[` included); a longer one is dropped whole.
pub const MAX_CSI: usize = 32;

/// How many bytes of an unterminated string sequence (OSC, DCS, …) are swallowed before the
/// filter gives up on it and shows text again, so a stray `ESC ]` cannot hide the rest of
/// the output.
pub const MAX_STRING: usize = 4096;

/// CSI final bytes that only draw: cursor movement, erasing, colours, cursor save/restore.
const DRAWING_FINALS: &[u8] = b"ABCDEFGHJKfmsu";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Text,
    /// After ESC.
    Escape,
    /// Inside `ESC [`; the bytes so far are in `csi`.
    Csi,
    /// Inside a sequence that is dropped whole: an escape with intermediate bytes
    /// (`ESC ( B`, finals from 0x30) or a CSI too long to keep (finals from 0x40). Bytes
    /// from 0x20 up to `first_final` are swallowed; a final byte ends it.
    Skip {
        first_final: u8,
    },
    /// Inside a string sequence, `n` bytes so far; `esc`: the last byte was ESC.
    String {
        n: usize,
        esc: bool,
    },
}

/// The streaming filter (see the module doc). One per output stream.
#[derive(Debug)]
pub struct ControlFilter {
    state: State,
    csi: Vec<u8>,
    /// UTF-8 continuation bytes the last lead byte announced and not yet seen.
    utf8_pending: u8,
}

impl Default for ControlFilter {
    fn default() -> Self {
        Self::new()
    }
}

impl ControlFilter {
    pub fn new() -> Self {
        Self {
            state: State::Text,
            csi: Vec::with_capacity(MAX_CSI),
            utf8_pending: 0,
        }
    }

    /// A filter for output to our fd `fd` if that is a terminal; `None` for a pipe or a
    /// file, which get the bytes raw.
    pub fn for_terminal(fd: std::os::fd::RawFd) -> Option<Self> {
        // SAFETY: isatty on an integer fd has no memory effects.
        (unsafe { libc::isatty(fd) } == 1).then(Self::new)
    }

    /// Appends to `out` what of `input` may reach a terminal.
    pub fn filter(&mut self, input: &[u8], out: &mut Vec<u8>) {
        for &b in input {
            self.byte(b, out);
        }
    }

    fn byte(&mut self, b: u8, out: &mut Vec<u8>) {
        const ESC: u8 = 0x1b;
        match self.state {
            State::Text if b >= 0x80 => self.non_ascii(b, out),
            State::Text => {
                self.utf8_pending = 0;
                match b {
                    ESC => self.state = State::Escape,
                    b'\t' | b'\n' | b'\r' | 0x08 => out.push(b),
                    0x00..=0x1f | 0x7f => {}
                    _ => out.push(b),
                }
            }
            State::Escape => {
                self.state = match b {
                    b'[' => {
                        self.csi.clear();
                        self.csi.extend_from_slice(&[ESC, b'[']);
                        State::Csi
                    }
                    b']' | b'P' | b'_' | b'^' | b'X' => State::String { n: 0, esc: false },
                    ESC => State::Escape,
                    0x20..=0x2f => State::Skip { first_final: 0x30 },
                    // A two-byte escape (ESC 7, ESC c, ESC =, …) is dropped; a control
                    // byte ends it and counts as text again.
                    0x00..=0x1f => return self.as_text(b, out),
                    _ => State::Text,
                };
            }
            State::Csi => match b {
                // Parameter and intermediate bytes.
                0x20..=0x3f => {
                    self.csi.push(b);
                    if self.csi.len() >= MAX_CSI {
                        // Too long to be drawing: swallow the rest of it.
                        self.state = State::Skip { first_final: 0x40 };
                    }
                }
                // The final byte.
                0x40..=0x7e => {
                    self.csi.push(b);
                    if drawing_csi(&self.csi) {
                        out.extend_from_slice(&self.csi);
                    }
                    self.state = State::Text;
                }
                // Anything else aborts the sequence and is itself text (or a new ESC).
                _ => self.as_text(b, out),
            },
            State::Skip { first_final } => match b {
                _ if (0x20..first_final).contains(&b) => {}
                _ if (first_final..=0x7e).contains(&b) => self.state = State::Text,
                _ => self.as_text(b, out),
            },
            State::String { n, esc } => {
                self.state = match b {
                    0x07 => State::Text,
                    b'\\' if esc => State::Text,
                    // CAN and SUB cancel a sequence.
                    0x18 | 0x1a => State::Text,
                    _ if n + 1 >= MAX_STRING => State::Text,
                    _ => State::String {
                        n: n + 1,
                        esc: b == ESC,
                    },
                };
            }
        }
    }
}

impl ControlFilter {
    /// Ends the sequence in progress (dropped) and takes `b` as the next byte of text.
    fn as_text(&mut self, b: u8, out: &mut Vec<u8>) {
        self.state = State::Text;
        self.byte(b, out);
    }

    /// A byte ≥ 0x80 in text: UTF-8 passes; a byte in 0x80–0x9f that is not a
    /// continuation a lead byte announced is dropped, since a terminal not in UTF-8 mode
    /// reads it as a C1 control (0x9b is CSI, 0x9d OSC, 0x90 DCS).
    fn non_ascii(&mut self, b: u8, out: &mut Vec<u8>) {
        match b {
            0x80..=0xbf if self.utf8_pending > 0 => {
                self.utf8_pending -= 1;
                out.push(b);
            }
            0x80..=0x9f => self.utf8_pending = 0,
            0xc2..=0xdf => {
                self.utf8_pending = 1;
                out.push(b);
            }
            0xe0..=0xef => {
                self.utf8_pending = 2;
                out.push(b);
            }
            0xf0..=0xf4 => {
                self.utf8_pending = 3;
                out.push(b);
            }
            _ => {
                self.utf8_pending = 0;
                out.push(b);
            }
        }
    }
}

/// `text` for one field of a printed line, when it may hold what a sandbox chose (an output's
/// or workspace file's name, an error that quotes one): every control character — C0 with
/// tab, newline and carriage return, DEL, C1 — and every Unicode bidirectional control
/// (which can make a name display as another, "Trojan Source") is shown escaped, as Rust
/// writes it (`\n`, `\u{1b}`, `\u{202e}`). So a name can neither drive the terminal nor
/// start a line of its own that looks like omabox's; the text stays readable. Borrowed
/// unchanged when there is nothing to escape.
pub fn one_line(text: &str) -> std::borrow::Cow<'_, str> {
    let hostile = |c: char| {
        c.is_control()
            || matches!(c, '\u{200e}' | '\u{200f}' | '\u{061c}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !text.chars().any(hostile) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if hostile(c) {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Whether a complete CSI sequence (`ESC [` … final) only draws (see the module doc).
fn drawing_csi(seq: &[u8]) -> bool {
    let Some((&last, body)) = seq[2..].split_last() else {
        return false;
    };
    match body.first() {
        // Private modes: only showing and hiding the cursor.
        Some(b'?') => body == b"?25" && (last == b'h' || last == b'l'),
        Some(b'<' | b'=' | b'>') => false,
        // Plain parameters (digits and separators) only, no intermediate bytes.
        _ => {
            DRAWING_FINALS.contains(&last)
                && body
                    .iter()
                    .all(|c| c.is_ascii_digit() || *c == b';' || *c == b':')
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_escapes_controls_and_bidi_overrides_and_keeps_text() {
        assert!(matches!(
            one_line("r.txt"),
            std::borrow::Cow::Borrowed("r.txt")
        ));
        assert_eq!(one_line("naïve 文字.txt"), "naïve 文字.txt");
        assert_eq!(
            one_line("x\u{1b}]52;c;aGk=\u{7}\ncompleted: revision 9"),
            "x\\u{1b}]52;c;aGk=\\u{7}\\ncompleted: revision 9"
        );
        assert_eq!(one_line("a\tb\rc\u{7f}\u{9b}"), "a\\tb\\rc\\u{7f}\\u{9b}");
        assert_eq!(one_line("evil\u{202e}txt.exe"), "evil\\u{202e}txt.exe");
        assert!(!one_line("\u{1b}[2J\u{2066}").contains(['\u{1b}', '\u{2066}']));
    }

    fn run(chunks: &[&[u8]]) -> Vec<u8> {
        let mut f = ControlFilter::new();
        let mut out = Vec::new();
        for c in chunks {
            f.filter(c, &mut out);
        }
        out
    }

    #[test]
    fn text_colours_and_progress_pass_unchanged() {
        let text = "plain, ünïcødé ✓\ttab\r\nnext\x08\x1b[1;31mred\x1b[0m \x1b[38;5;200mx\x1b[m\
                    \x1b[2K\r\x1b[1A\x1b[?25l50%\x1b[?25h\x1b[10;20H\x1b[s\x1b[u\x1b[J"
            .as_bytes();
        assert_eq!(run(&[text]), text);
    }

    #[test]
    fn reports_strings_and_other_controls_are_dropped() {
        let cases: &[(&[u8], &[u8])] = &[
            // Device status and attribute reports: the answer would be typed into input.
            (b"a\x1b[6nb", b"ab"),
            (b"a\x1b[cb\x1b[>0cc", b"abc"),
            // Window title report and window operations.
            (b"a\x1b[21tb\x1b[8;1;1t", b"ab"),
            // OSC 52 (clipboard), OSC 0 (title), both terminators; DCS; APC; PM; SOS.
            (b"a\x1b]52;c;ZXZpbA==\x07b", b"ab"),
            (b"a\x1b]0;owned\x1b\\b", b"ab"),
            (
                b"a\x1bP+q544e\x1b\\b\x1b_x\x07c\x1b^y\x07d\x1bXz\x07e",
                b"abcde",
            ),
            // BEL and other C0 controls, DEL.
            (b"a\x07\x00\x05\x7fb", b"ab"),
            // Two-byte and intermediate escapes (reset, charset designation, keypad).
            (b"a\x1bcb\x1b(Bc\x1b=d\x1b#8e", b"abcde"),
            // Private modes other than the cursor's (alternate screen, bracketed paste,
            // mouse reporting), and CSI with intermediates or odd parameters.
            (
                b"a\x1b[?1049hb\x1b[?2004h\x1b[?1000hc\x1b[1 qd\x1b[=5me",
                b"abcde",
            ),
            // 8-bit C1 controls outside UTF-8 (CSI 0x9b, OSC 0x9d); UTF-8 that contains
            // the same bytes as continuations stays ("ě" is C4 9B, "❝" E2 9D 9D).
            (b"a\x9b6nb\x9d0;t\x07c", b"a6nb0;tc"),
            ("ě❝".as_bytes(), "ě❝".as_bytes()),
            // Scrolling region, insert/delete: not in the drawing set.
            (b"a\x1b[1;5rb\x1b[2Lc", b"abc"),
        ];
        for (input, want) in cases {
            assert_eq!(
                String::from_utf8_lossy(&run(&[input])),
                String::from_utf8_lossy(want),
                "{input:?}"
            );
        }
    }

    #[test]
    fn a_sequence_split_across_reads_is_still_one_sequence() {
        let input = b"x\x1b]52;c;ZXZpbA==\x07y\x1b[31mz\x1b[6nw";
        let whole = run(&[input]);
        assert_eq!(whole, b"xy\x1b[31mzw");
        for cut in 0..input.len() {
            assert_eq!(run(&[&input[..cut], &input[cut..]]), whole, "cut at {cut}");
        }
        let bytes: Vec<&[u8]> = input.chunks(1).collect();
        assert_eq!(run(&bytes), whole);
    }

    /// Every ESC in `out` starts a CSI sequence of the drawing set; no other control.
    fn only_drawing(out: &[u8]) -> Result<(), String> {
        let mut i = 0;
        let mut pending = 0;
        while i < out.len() {
            let b = out[i];
            if b >= 0x80 {
                pending = match b {
                    0x80..=0xbf if pending > 0 => pending - 1,
                    0x80..=0x9f => return Err(format!("C1 {b:#x} at {i}")),
                    0xc2..=0xdf => 1,
                    0xe0..=0xef => 2,
                    0xf0..=0xf4 => 3,
                    _ => 0,
                };
                i += 1;
                continue;
            }
            pending = 0;
            match b {
                0x1b => {
                    if out.get(i + 1) != Some(&b'[') {
                        return Err(format!("ESC without [ at {i}"));
                    }
                    let end = out[i + 2..]
                        .iter()
                        .position(|b| (0x40..=0x7e).contains(b))
                        .ok_or(format!("unfinished CSI at {i}"))?;
                    let seq = &out[i..i + 2 + end + 1];
                    if !drawing_csi(seq) {
                        return Err(format!("CSI {seq:?} at {i}"));
                    }
                    i += seq.len();
                }
                b'\t' | b'\n' | b'\r' | 0x08 => i += 1,
                0x00..=0x1f | 0x7f => return Err(format!("control {b:#x} at {i}")),
                _ => i += 1,
            }
        }
        Ok(())
    }

    #[test]
    fn random_streams_leave_only_text_and_drawing() {
        // Bytes drawn mostly from what sequences are made of, cut into random reads.
        let alphabet = b"\x1b\x1b\x1b[[]]?;0126mnctHPX_^\\\x07\x18 ab\n\x9b\x9d\x00\xc4\xe2";
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..2000 {
            let len = (next() % 200) as usize;
            let input: Vec<u8> = (0..len)
                .map(|_| alphabet[(next() % alphabet.len() as u64) as usize])
                .collect();
            let mut f = ControlFilter::new();
            let mut out = Vec::new();
            let mut rest = &input[..];
            while !rest.is_empty() {
                let cut = 1 + (next() % rest.len() as u64) as usize;
                f.filter(&rest[..cut], &mut out);
                rest = &rest[cut..];
            }
            if let Err(e) = only_drawing(&out) {
                panic!("{e}: input {input:?} gave {out:?}");
            }
        }
    }

    #[test]
    fn unterminated_or_overlong_sequences_do_not_hide_the_rest() {
        // A stray OSC swallows at most MAX_STRING bytes.
        let mut input = b"\x1b]".to_vec();
        input.extend(std::iter::repeat_n(b'q', MAX_STRING + 10));
        input.extend_from_slice(b"visible");
        let out = run(&[&input]);
        assert!(
            out.ends_with(b"visible"),
            "{}",
            String::from_utf8_lossy(&out)
        );
        assert!(out.len() < 20 + "visible".len());
        // An endless CSI is dropped and text resumes after its final byte.
        let mut input = b"\x1b[".to_vec();
        input.extend(std::iter::repeat_n(b'1', 1000));
        input.extend_from_slice(b"mafter");
        assert_eq!(run(&[&input]), b"after");
        // A control byte aborts a CSI and counts as text.
        assert_eq!(run(&[b"\x1b[12\nok"]), b"\nok");
    }
}
