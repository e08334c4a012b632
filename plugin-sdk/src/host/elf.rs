//! A size check of a plugin file before `dlopen`: every segment the program headers name must
//! lie inside the file.
//!
//! The dynamic loader maps a library's segments from the file without checking them against
//! its length, and the first touch of a page past the end kills the process with SIGBUS. A
//! truncated `.so` (an interrupted build or copy) in a plugin directory would so crash every
//! command that scans it, with no message. [`check_segments`] reads only the ELF header and
//! the program header table; anything it does not understand (another ELF class or byte
//! order, not ELF at all) is left to `dlopen`, which rejects such files by their header
//! before mapping anything.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// Size of an ELF64 header.
const EHDR_SIZE: usize = 64;
/// Size of an ELF64 program header.
const PHDR_SIZE: u64 = 56;

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(v)
}

/// `Err(reason)` when `path` is a little-endian ELF64 file whose header, program header table
/// or a segment reaches past the end of the file; `Ok(())` otherwise (including files that are
/// not ELF64: `dlopen` refuses those by their header).
pub(crate) fn check_segments(path: &Path) -> Result<(), String> {
    let mut file = File::open(path).map_err(|e| e.to_string())?;
    let len = file.metadata().map_err(|e| e.to_string())?.len();
    let mut header = [0u8; EHDR_SIZE];
    let got = read_up_to(&mut file, &mut header).map_err(|e| e.to_string())?;
    // ELF magic, ELFCLASS64, ELFDATA2LSB.
    if got < 6 || header[..4] != *b"\x7fELF" || header[4] != 2 || header[5] != 1 {
        return Ok(());
    }
    let truncated = |what: String, end: u128| {
        format!(
            "the file is truncated or damaged: {what} ends at byte {end} but the file has {len} \
             bytes (an interrupted build or copy?); rebuild the plugin or copy it again"
        )
    };
    if got < EHDR_SIZE {
        return Err(truncated("the ELF header".into(), EHDR_SIZE as u128));
    }
    let (phoff, phentsize, phnum) = (
        u64_at(&header, 32),
        u16_at(&header, 54),
        u16_at(&header, 56),
    );
    if u64::from(phentsize) != PHDR_SIZE {
        // dlopen refuses a foreign program header size before mapping anything.
        return Ok(());
    }
    let table_end = u128::from(phoff) + u128::from(phnum) * u128::from(PHDR_SIZE);
    if table_end > u128::from(len) {
        return Err(truncated("the program header table".into(), table_end));
    }
    let mut table = vec![0u8; usize::from(phnum) * PHDR_SIZE as usize];
    file.seek(SeekFrom::Start(phoff))
        .and_then(|_| file.read_exact(&mut table))
        .map_err(|e| e.to_string())?;
    for (i, ph) in table.chunks_exact(PHDR_SIZE as usize).enumerate() {
        let (offset, filesz) = (u64_at(ph, 8), u64_at(ph, 32));
        let end = u128::from(offset) + u128::from(filesz);
        if filesz > 0 && end > u128::from(len) {
            return Err(truncated(format!("segment {i}"), end));
        }
    }
    Ok(())
}

/// Reads until `buf` is full or the file ends; returns the bytes read.
fn read_up_to(file: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match file.read(&mut buf[got..])? {
            0 => break,
            n => got += n,
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This test binary: an ELF64 file with loadable segments.
    fn own_executable() -> Vec<u8> {
        std::fs::read(std::env::current_exe().expect("test executable")).expect("read it")
    }

    fn write(dir: &Path, name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, bytes).expect("write");
        path
    }

    #[test]
    fn a_whole_elf_file_passes() {
        let dir = std::env::temp_dir().join(format!("cairn-elf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let whole = write(&dir, "whole.so", &own_executable());
        assert_eq!(check_segments(&whole), Ok(()));
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn truncated_elf_files_are_refused_with_the_sizes() {
        let dir = std::env::temp_dir().join(format!("cairn-elf-t-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bytes = own_executable();
        // Where the last segment ends (section data such as symbols may follow it).
        let phoff = u64_at(&bytes, 32) as usize;
        let end = (0..usize::from(u16_at(&bytes, 56)))
            .map(|i| {
                let ph = &bytes[phoff + i * 56..];
                (u64_at(ph, 8) + u64_at(ph, 32)) as usize
            })
            .max()
            .expect("program headers");
        for keep in [20, 63, 64, 200, end / 2, end - 1] {
            let path = write(&dir, "cut.so", &bytes[..keep]);
            let e = check_segments(&path).expect_err("a truncated ELF file");
            assert!(
                e.contains("truncated") && e.contains(&format!("file has {keep} bytes")),
                "{keep}: {e}"
            );
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn files_that_are_not_elf64_are_left_to_dlopen() {
        let dir = std::env::temp_dir().join(format!("cairn-elf-n-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for bytes in [
            &b""[..],
            b"\x7fEL",
            b"not an ELF file",
            b"\x7fELF\x01\x01\x01",
        ] {
            let path = write(&dir, "other.so", bytes);
            assert_eq!(check_segments(&path), Ok(()), "{bytes:?}");
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}
