//! Sparse files: finding a file's data regions, reading only them, and writing them back with
//! holes in between.
//!
//! A sandbox can make a file of any logical size that occupies nothing (`truncate -s 512G`).
//! Copying its logical bytes would fill the host's disk, so a file whose allocated size is
//! below its logical size is read through `SEEK_DATA`/`SEEK_HOLE`: its blob holds only the data
//! regions, concatenated, and the manifest lists them (`extents`). Restore writes each region
//! at its offset and sets the size with `ftruncate`, leaving the holes unallocated.
//!
//! A file with more than [`MAX_EXTENTS`] regions is stored dense (its logical bytes), which the
//! checkpoint byte limit bounds. Never reads past the regions it found, and never trusts a
//! region list that is unsorted, overlapping or outside the file (the manifest is validated).

use crate::manifest::MAX_EXTENTS;
use rustix::fs::SeekFrom;
use rustix::io::Errno;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::FileExt;

/// The data regions `[offset, length]` of `file` (of logical `size`), or `None` when it is
/// better stored dense: one region covering it all, too many regions, or a filesystem
/// without `SEEK_DATA`.
pub(crate) fn data_extents(file: &File, size: u64) -> io::Result<Option<Vec<[u64; 2]>>> {
    let mut extents = Vec::new();
    let mut offset = 0u64;
    while offset < size {
        let start = match rustix::fs::seek(file, SeekFrom::Data(offset)) {
            Ok(start) => start,
            // No data at or after `offset`: the rest is a hole.
            Err(Errno::NXIO) => break,
            Err(Errno::INVAL | Errno::OPNOTSUPP) => return Ok(None),
            Err(error) => return Err(error.into()),
        };
        if start >= size {
            break;
        }
        let end = match rustix::fs::seek(file, SeekFrom::Hole(start)) {
            Ok(end) => end.min(size),
            Err(Errno::NXIO) => size,
            Err(error) => return Err(error.into()),
        };
        if end <= start {
            break;
        }
        if extents.len() == MAX_EXTENTS {
            return Ok(None);
        }
        extents.push([start, end - start]);
        offset = end;
    }
    if extents.len() == 1 && extents[0] == [0, size] {
        return Ok(None);
    }
    Ok(Some(extents))
}

/// Reads the listed regions of a file, concatenated: the content of a sparse file's blob.
pub(crate) struct ExtentReader<'a> {
    file: &'a File,
    extents: &'a [[u64; 2]],
    index: usize,
    done: u64,
}

impl<'a> ExtentReader<'a> {
    pub(crate) fn new(file: &'a File, extents: &'a [[u64; 2]]) -> Self {
        Self {
            file,
            extents,
            index: 0,
            done: 0,
        }
    }
}

impl Read for ExtentReader<'_> {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        loop {
            let Some([offset, length]) = self.extents.get(self.index).copied() else {
                return Ok(0);
            };
            let left = length - self.done;
            if left == 0 {
                self.index += 1;
                self.done = 0;
                continue;
            }
            let want = usize::try_from(left)
                .unwrap_or(usize::MAX)
                .min(buffer.len());
            let read = self.file.read_at(&mut buffer[..want], offset + self.done)?;
            if read == 0 {
                // The file shrank under us: the caller's stat check reports the change.
                return Ok(0);
            }
            self.done += read as u64;
            return Ok(read);
        }
    }
}

/// Writes `blob` (the regions' bytes, concatenated) into `file` at the regions' offsets and
/// sets its size; returns the bytes copied. `each` sees every chunk (for hashing).
pub(crate) fn write_extents(
    blob: &mut impl Read,
    file: &File,
    extents: &[[u64; 2]],
    size: u64,
    buffer: &mut [u8],
    mut each: impl FnMut(&[u8]),
) -> io::Result<u64> {
    let mut copied = 0u64;
    for [offset, length] in extents {
        let mut written = 0u64;
        while written < *length {
            let want = usize::try_from(length - written)
                .unwrap_or(usize::MAX)
                .min(buffer.len());
            let read = match blob.read(&mut buffer[..want]) {
                Ok(0) => return Ok(copied),
                Ok(read) => read,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(error) => return Err(error),
            };
            each(&buffer[..read]);
            file.write_all_at(&buffer[..read], offset + written)?;
            written += read as u64;
            copied += read as u64;
        }
    }
    // Anything left in the blob is a size mismatch the caller sees through `copied`.
    let extra = blob.read(&mut buffer[..1])?;
    copied += extra as u64;
    file.set_len(size)?;
    Ok(copied)
}
