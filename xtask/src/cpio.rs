//! Writer for the cpio "newc" format that the kernel unpacks as initramfs.

use std::io::{self, Write};

/// File type bits of `st_mode`.
const S_IFDIR: u32 = 0o040_000;
const S_IFREG: u32 = 0o100_000;
const S_IFLNK: u32 = 0o120_000;
const S_IFCHR: u32 = 0o020_000;

/// What one archive member is.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    /// A directory.
    Dir,
    /// A regular file of this many bytes (the data follows the header).
    File {
        /// Size of the file in bytes.
        size: u32,
    },
    /// A symbolic link (the data is the target).
    Symlink {
        /// Length of the link target in bytes.
        target_len: u32,
    },
    /// A character device.
    CharDev {
        /// Device major number.
        major: u32,
        /// Device minor number.
        minor: u32,
    },
}

/// Streams a newc archive: call [`CpioWriter::header`], write exactly the
/// announced data, call [`CpioWriter::end_data`]; finish with [`CpioWriter::finish`].
pub struct CpioWriter<W: Write> {
    out: W,
    next_inode: u32,
    data_len: u32,
}

impl<W: Write> CpioWriter<W> {
    /// A writer appending to `out`.
    pub fn new(out: W) -> Self {
        CpioWriter {
            out,
            next_inode: 1,
            data_len: 0,
        }
    }

    /// Writes the header and name of a member; its data must follow.
    pub fn header(&mut self, name: &str, kind: Kind, permissions: u32) -> io::Result<()> {
        let (type_bits, size, rdev) = match kind {
            Kind::Dir => (S_IFDIR, 0, (0, 0)),
            Kind::File { size } => (S_IFREG, size, (0, 0)),
            Kind::Symlink { target_len } => (S_IFLNK, target_len, (0, 0)),
            Kind::CharDev { major, minor } => (S_IFCHR, 0, (major, minor)),
        };
        let nlink = if matches!(kind, Kind::Dir) { 2 } else { 1 };
        let inode = self.next_inode;
        self.next_inode += 1;
        self.write_header(
            name,
            inode,
            type_bits | (permissions & 0o7777),
            nlink,
            size,
            rdev,
        )?;
        self.data_len = size;
        Ok(())
    }

    /// Member data (may be called several times per member).
    pub fn data(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes)
    }

    /// Pads the member data to the 4-byte boundary.
    pub fn end_data(&mut self) -> io::Result<()> {
        self.pad(self.data_len as usize)
    }

    /// Writes the trailer and returns the underlying writer.
    pub fn finish(mut self) -> io::Result<W> {
        self.write_header("TRAILER!!!", 0, 0, 1, 0, (0, 0))?;
        self.out.flush()?;
        Ok(self.out)
    }

    fn write_header(
        &mut self,
        name: &str,
        inode: u32,
        mode: u32,
        nlink: u32,
        size: u32,
        rdev: (u32, u32),
    ) -> io::Result<()> {
        let name_size = name.len() as u32 + 1;
        let fields = [
            inode, mode, 0, 0, nlink, 0, size, 0, 0, rdev.0, rdev.1, name_size, 0,
        ];
        let mut header = String::with_capacity(110);
        header.push_str("070701");
        for field in fields {
            header.push_str(&format!("{field:08x}"));
        }
        self.out.write_all(header.as_bytes())?;
        self.out.write_all(name.as_bytes())?;
        self.out.write_all(&[0])?;
        self.pad(110 + name_size as usize)
    }

    fn pad(&mut self, written: usize) -> io::Result<()> {
        let padding = (4 - written % 4) % 4;
        self.out.write_all(&[0u8; 3][..padding])
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn archive_members_are_aligned_and_well_formed() {
        let mut cpio = CpioWriter::new(Vec::new());
        cpio.header("bin", Kind::Dir, 0o755).unwrap();
        cpio.end_data().unwrap();
        cpio.header("bin/hello", Kind::File { size: 5 }, 0o755)
            .unwrap();
        cpio.data(b"hello").unwrap();
        cpio.end_data().unwrap();
        let bytes = cpio.finish().unwrap();
        assert_eq!(bytes.len() % 4, 0);
        assert_eq!(&bytes[..6], b"070701");
        // Second header starts after 110 + "bin\0" (4) bytes, padded to 116.
        assert_eq!(&bytes[110..116], b"bin\0\0\0");
        let second = &bytes[116..];
        assert_eq!(&second[..6], b"070701");
        // mode field (2nd) of the file: regular file, 0755.
        assert_eq!(&second[14..22], b"000081ed");
        // filesize field (7th).
        assert_eq!(&second[54..62], b"00000005");
        // name "bin/hello\0" is 10 bytes: 116 + 110 + 10 = 236, aligned; data follows.
        assert_eq!(&second[110..120], b"bin/hello\0");
        assert_eq!(&second[120..125], b"hello");
        let text = String::from_utf8_lossy(&bytes);
        assert!(text.contains("TRAILER!!!"));
    }
}
