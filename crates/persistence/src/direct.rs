//! Writes that bypass the page cache (`O_DIRECT`), for bulk content the host does not read
//! back soon: blob temp files (fsynced right after anyway) and restored workspace files. A
//! restore also reads its blobs that way, into the same buffer ([`DirectWriter::write_from`]).
//!
//! Why: on the VMs omabox runs on, a buffered write costs about three times a SHA-256 of the
//! same bytes (allocating, charging and filling page-cache pages), and the fsync after it
//! waits for the whole writeback; an `O_DIRECT` write is a DMA from our own buffer, at disk
//! speed (`cargo bench -p omabox-persistence --bench workspace` prints both beside the hash
//! floor).
//!
//! How: content is gathered in a reused, 4 KiB-aligned buffer and written in whole aligned
//! blocks at aligned offsets; the last partial block is written padded and the file is then
//! cut to its length. Optionally, blocks of zeros are skipped (holes), as before.
//! Where the filesystem refuses `O_DIRECT` (tmpfs before Linux 6.6, some network
//! filesystems) or a write is refused (`EINVAL`: a stricter alignment), the writer falls back
//! to ordinary writes for the rest of the file: the bytes and the result are the same.
//!
//! Must never: write bytes other than those given, in another order, or leave the file at
//! another length than the bytes given.

use std::cell::RefCell;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// Alignment of buffer addresses, file offsets and lengths: covers 512-byte and 4 KiB
/// logical blocks. Also the unit of skipped zeros (a filesystem block).
pub(crate) const BLOCK: usize = 4096;

/// Bytes gathered before a write.
const GATHER: usize = 1 << 20;

thread_local! {
    /// One gathering buffer per thread (the blocking pool's threads), reused: a fresh one per
    /// file would fault in its pages every time.
    static BUFFER: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Writes a file from its start, sequentially (see the module doc).
pub(crate) struct DirectWriter<'f> {
    file: &'f File,
    /// The file offset of the gathered bytes' first.
    at: u64,
    gathered: usize,
    direct: bool,
    skip_zeros: bool,
}

impl<'f> DirectWriter<'f> {
    /// A writer of `file` (empty, opened for writing) from offset 0; with `skip_zeros`,
    /// blocks of zeros become holes. A file shorter than one gathering buffer (1 MiB) is
    /// written the ordinary way: one synchronous device write per small file would cost
    /// more than its page-cache copy.
    pub(crate) fn new(file: &'f File, skip_zeros: bool) -> Self {
        Self {
            file,
            at: 0,
            gathered: 0,
            direct: false,
            skip_zeros,
        }
    }

    /// Appends `data`.
    pub(crate) fn write(&mut self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let taken = with_buffer(|buffer| {
                let room = &mut buffer[self.gathered..];
                let n = room.len().min(data.len());
                room[..n].copy_from_slice(&data[..n]);
                n
            });
            data = &data[taken..];
            self.gathered_more(taken)?;
        }
        Ok(())
    }

    /// Appends everything `source` reads until its end, read straight into the gathering
    /// buffer (no copy in between); `seen` sees each piece as it was read. With
    /// `source_direct`, `source` is read with `O_DIRECT` as well, for as long as its reads
    /// land on whole blocks (a shorter one, or a refusal, turns it off for the rest).
    pub(crate) fn write_from(
        &mut self,
        source: &File,
        source_direct: bool,
        mut seen: impl FnMut(&[u8]),
    ) -> io::Result<u64> {
        let mut direct = source_direct && set_direct(source, true).is_ok();
        let mut read_at = 0u64;
        let result = loop {
            let read = with_buffer(|buffer| {
                let room = &mut buffer[self.gathered..];
                let read = match source.read_at(room, read_at) {
                    Err(error) if direct && error.raw_os_error() == Some(libc_einval()) => {
                        direct = false;
                        set_direct(source, false)?;
                        source.read_at(room, read_at)
                    }
                    other => other,
                };
                if let Ok(read) = read {
                    seen(&room[..read]);
                }
                read
            });
            let read = match read {
                Ok(0) => break Ok(read_at),
                Ok(read) => read,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(error) => break Err(error),
            };
            read_at += read as u64;
            if direct && read % BLOCK != 0 {
                direct = false;
                set_direct(source, false)?;
            }
            self.gathered_more(read)?;
        };
        if source_direct {
            set_direct(source, false)?;
        }
        result
    }

    /// Counts `n` more gathered bytes; a full buffer is written.
    fn gathered_more(&mut self, n: usize) -> io::Result<()> {
        self.gathered += n;
        if self.gathered == GATHER {
            if self.at == 0 {
                self.direct = set_direct(self.file, true).is_ok();
            }
            self.flush(GATHER)?;
            self.at += GATHER as u64;
            self.gathered = 0;
        }
        Ok(())
    }

    /// Writes what is gathered and cuts the file to the bytes given; returns their count.
    pub(crate) fn finish(mut self) -> io::Result<u64> {
        let total = self.at + self.gathered as u64;
        if self.gathered > 0 && self.direct {
            // Padded to a whole block; the cut below drops the padding.
            let padded = self.gathered.next_multiple_of(BLOCK);
            with_buffer(|buffer| buffer[self.gathered..padded].fill(0));
            self.flush(padded)?;
        } else if self.gathered > 0 {
            self.flush(self.gathered)?;
        }
        if self.direct {
            set_direct(self.file, false)?;
        }
        self.file.set_len(total)?;
        Ok(total)
    }

    /// Writes the first `len` gathered bytes (under `O_DIRECT`, a multiple of [`BLOCK`]) at
    /// `self.at`, runs of zero blocks skipped when asked.
    fn flush(&mut self, len: usize) -> io::Result<()> {
        let (file, at, skip_zeros) = (self.file, self.at, self.skip_zeros);
        let direct = &mut self.direct;
        with_buffer(|buffer| {
            let bytes = &buffer[..len];
            let block_end = |start: usize| (start + BLOCK).min(len);
            let zeros = |at: usize| skip_zeros && bytes[at..block_end(at)].iter().all(|&b| b == 0);
            let mut start = 0;
            while start < len {
                let skipping = zeros(start);
                let mut end = block_end(start);
                while end < len && zeros(end) == skipping {
                    end = block_end(end);
                }
                if !skipping {
                    write_at(file, direct, &bytes[start..end], at + start as u64)?;
                }
                start = end;
            }
            Ok(())
        })
    }
}

/// `pwrite`s all of `bytes`; on `EINVAL` under `O_DIRECT` (a stricter alignment than
/// ours), turns it off for good and writes them the ordinary way.
fn write_at(file: &File, direct: &mut bool, bytes: &[u8], offset: u64) -> io::Result<()> {
    match file.write_all_at(bytes, offset) {
        Err(error) if *direct && error.raw_os_error() == Some(libc_einval()) => {
            *direct = false;
            set_direct(file, false)?;
            file.write_all_at(bytes, offset)
        }
        other => other,
    }
}

fn libc_einval() -> i32 {
    rustix::io::Errno::INVAL.raw_os_error()
}

/// Turns `O_DIRECT` on or off for `file`.
fn set_direct(file: &File, on: bool) -> io::Result<()> {
    use rustix::fs::OFlags;
    let flags = rustix::fs::fcntl_getfl(file)?;
    let flags = if on {
        flags | OFlags::DIRECT
    } else {
        flags - OFlags::DIRECT
    };
    rustix::fs::fcntl_setfl(file, flags)?;
    Ok(())
}

/// Runs `f` on this thread's gathering buffer: [`GATHER`] bytes at a [`BLOCK`]-aligned
/// address.
fn with_buffer<T>(f: impl FnOnce(&mut [u8]) -> T) -> T {
    BUFFER.with(|cell| {
        let mut vec = cell.borrow_mut();
        if vec.len() < GATHER + BLOCK {
            *vec = vec![0u8; GATHER + BLOCK];
        }
        let skip = vec.as_ptr().align_offset(BLOCK);
        f(&mut vec[skip..skip + GATHER])
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn written(content: &[u8], skip_zeros: bool, pieces: usize) -> (Vec<u8>, u64) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let file = File::create(&path).unwrap();
        let mut writer = DirectWriter::new(&file, skip_zeros);
        for piece in content.chunks(pieces.max(1)) {
            writer.write(piece).unwrap();
        }
        assert_eq!(writer.finish().unwrap(), content.len() as u64);
        drop(file);
        let blocks = std::fs::metadata(&path).unwrap().blocks() * 512;
        (std::fs::read(&path).unwrap(), blocks)
    }

    #[test]
    fn the_file_holds_exactly_the_bytes_given_whatever_their_sizes() {
        let noise: Vec<u8> = (0..(3 * GATHER + 1234))
            .map(|i| (i * 7 + i / 4093) as u8)
            .collect();
        for len in [
            0,
            1,
            BLOCK - 1,
            BLOCK,
            BLOCK + 1,
            GATHER,
            GATHER + 1,
            noise.len(),
        ] {
            for pieces in [1, 777, 65_536, GATHER + 5] {
                for skip_zeros in [false, true] {
                    let (read, _) = written(&noise[..len], skip_zeros, pieces);
                    assert!(read == noise[..len], "len {len}, pieces {pieces}");
                }
            }
        }
    }

    #[test]
    fn zero_blocks_become_holes_only_when_asked() {
        let mut content = vec![0u8; 8 * GATHER];
        content[5 * GATHER + 3] = b'x';
        let last = content.len() - 1;
        content[last] = b'y';
        let (read, sparse) = written(&content, true, 100_000);
        assert!(read == content);
        assert!(sparse < 64 * 1024, "{sparse} bytes allocated");
        let (read, dense) = written(&content, false, 100_000);
        assert!(read == content);
        assert!(dense >= content.len() as u64, "{dense} bytes allocated");
    }

    #[test]
    fn write_from_copies_a_file_exactly_and_shows_every_byte_once_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let noise: Vec<u8> = (0..(2 * GATHER + 5000))
            .map(|i| (i * 13 + i / 4091) as u8)
            .collect();
        for len in [0, 1, BLOCK, BLOCK + 7, GATHER, GATHER + 1, noise.len()] {
            for source_direct in [false, true] {
                let source_path = dir.path().join("source");
                std::fs::write(&source_path, &noise[..len]).unwrap();
                let source = File::open(&source_path).unwrap();
                let target_path = dir.path().join("target");
                let _ = std::fs::remove_file(&target_path);
                let target = File::create(&target_path).unwrap();
                let mut seen = Vec::new();
                let mut writer = DirectWriter::new(&target, false);
                let read = writer
                    .write_from(&source, source_direct, |piece| {
                        seen.extend_from_slice(piece)
                    })
                    .unwrap();
                assert_eq!(writer.finish().unwrap(), len as u64);
                assert_eq!(read, len as u64);
                assert!(seen == noise[..len], "len {len}, direct {source_direct}");
                assert!(std::fs::read(&target_path).unwrap() == noise[..len]);
                let flags = rustix::fs::fcntl_getfl(&source).unwrap();
                assert!(
                    !flags.contains(rustix::fs::OFlags::DIRECT),
                    "left O_DIRECT on"
                );
            }
        }
    }
}
