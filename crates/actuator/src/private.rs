//! appease's own files: kept only in directories only root (appease's user) can write,
//! opened without following a link, readable by appease alone. A local user who plants a
//! link or a file where appease keeps its state gets an error naming the path, never a
//! write through it.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Mode bits that let others than the owner change a directory's entries.
const WRITABLE_BY_OTHERS: u32 = 0o022;
const STICKY: u32 = 0o1000;

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

fn refused(path: &Path, why: String) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!(
            "{}: {why}; appease keeps its state only where no other user can change it \
             (remove it, or make it root's with mode 0700)",
            path.display()
        ),
    )
}

/// Makes `dir` (mode 0700) unless it exists, then checks it as [`check_private_dir`] does;
/// returns its canonical path, the one to use from then on (a link above it that someone
/// repoints later changes nothing).
pub fn private_dir(dir: &Path) -> io::Result<PathBuf> {
    if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(parent)?;
    }
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    check_private_dir(dir)
}

/// `dir` is a directory (not a link) of appease's user that no one else may write to, and
/// so is each directory above it, or else it is sticky (as /tmp is): no other user can
/// have put, replaced or linked anything in it. Returns its canonical path.
pub fn check_private_dir(dir: &Path) -> io::Result<PathBuf> {
    let me = euid();
    let meta = fs::symlink_metadata(dir)?;
    if meta.file_type().is_symlink() || !meta.is_dir() {
        return Err(refused(dir, "not a directory (a link, or a file)".into()));
    }
    if meta.uid() != me {
        return Err(refused(
            dir,
            format!("owned by uid {}, not {me}", meta.uid()),
        ));
    }
    if meta.mode() & WRITABLE_BY_OTHERS != 0 {
        return Err(refused(
            dir,
            format!("writable by others (mode {:o})", meta.mode() & 0o7777),
        ));
    }
    let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) else {
        return fs::canonicalize(dir);
    };
    // Links above are followed (/var/run is one): what counts is where they lead, and the
    // caller uses that path alone.
    let parent = fs::canonicalize(parent)?;
    let name = dir
        .file_name()
        .ok_or_else(|| refused(dir, "no directory name".into()))?;
    for above in parent.ancestors() {
        let m = fs::metadata(above)?;
        if m.uid() != 0 && m.uid() != me {
            return Err(refused(
                dir,
                format!("{} above it is owned by uid {}", above.display(), m.uid()),
            ));
        }
        if m.mode() & WRITABLE_BY_OTHERS != 0 && m.mode() & STICKY == 0 {
            return Err(refused(
                dir,
                format!("{} above it is writable by others", above.display()),
            ));
        }
    }
    let canonical = parent.join(name);
    // The same directory as the one checked (not swapped since).
    let again = fs::symlink_metadata(&canonical)?;
    if again.ino() != meta.ino() || again.dev() != meta.dev() {
        return Err(refused(dir, "replaced while it was checked".into()));
    }
    Ok(canonical)
}

/// How a private file is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Read and write, created if missing, kept as it is.
    ReadWrite,
    /// Appended to, created if missing.
    Append,
    /// Written anew (created, or emptied).
    Replace,
}

/// Opens `path` (in a directory checked by [`private_dir`]) never through a link, as a
/// regular file of appease's user with mode 0600 whatever it had.
pub fn open_private(path: &Path, access: Access) -> io::Result<File> {
    let mut o = OpenOptions::new();
    // Never truncated at open: only once it is known to be appease's own file.
    match access {
        Access::ReadWrite => o.read(true).write(true).create(true),
        Access::Append => o.append(true).create(true),
        Access::Replace => o.write(true).create(true),
    };
    // std opens with O_CLOEXEC already.
    let file = o
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => refused(path, "a symbolic link".into()),
            _ => io::Error::new(e.kind(), format!("{}: {e}", path.display())),
        })?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(refused(path, "not a regular file".into()));
    }
    if meta.uid() != euid() || meta.nlink() > 1 {
        return Err(refused(
            path,
            format!("owned by uid {} with {} links", meta.uid(), meta.nlink()),
        ));
    }
    if meta.mode() & 0o777 != 0o600 {
        file.set_permissions(fs::Permissions::from_mode(0o600))?;
    }
    if access == Access::Replace {
        file.set_len(0)?;
    }
    Ok(file)
}

/// Writes `bytes` to `path` whole or not at all: a private temporary file beside it, then
/// a rename over it.
pub fn replace_private(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    let mut f = open_private(&tmp, Access::Replace)?;
    f.write_all(bytes)?;
    f.sync_data()?;
    fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::TempDir;

    #[test]
    fn a_link_planted_where_a_private_file_goes_is_refused_and_its_target_untouched() {
        let dir = TempDir::new("private-link");
        let target = dir.0.join("target");
        fs::write(&target, "keep me").unwrap();
        let link = dir.0.join("lock");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        for access in [Access::ReadWrite, Access::Append, Access::Replace] {
            let e = open_private(&link, access).unwrap_err();
            assert!(e.to_string().contains("symbolic link"), "{e}");
        }
        assert_eq!(fs::read_to_string(&target).unwrap(), "keep me");
    }

    #[test]
    fn a_private_file_is_mode_0600_whatever_it_had() {
        let dir = TempDir::new("private-mode");
        let path = dir.0.join("f");
        fs::write(&path, "x").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        open_private(&path, Access::ReadWrite).unwrap();
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        replace_private(&path, b"new").unwrap();
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        assert_eq!(fs::read_to_string(&path).unwrap(), "new");
    }

    #[test]
    fn a_directory_others_can_write_or_a_link_is_not_private() {
        let dir = TempDir::new("private-dir");
        let run = dir.0.join("run");
        private_dir(&run).unwrap();
        assert_eq!(fs::metadata(&run).unwrap().mode() & 0o777, 0o700);
        fs::set_permissions(&run, fs::Permissions::from_mode(0o777)).unwrap();
        let e = check_private_dir(&run).unwrap_err();
        assert!(e.to_string().contains("writable by others"), "{e}");
        let link = dir.0.join("link");
        fs::set_permissions(&run, fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::symlink(&run, &link).unwrap();
        let e = private_dir(&link).unwrap_err();
        assert!(e.to_string().contains("not a directory"), "{e}");
        // Below a directory others may write (not sticky): refused.
        let open = dir.0.join("open");
        fs::create_dir(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
        let e = private_dir(&open.join("run")).unwrap_err();
        assert!(
            e.to_string().contains("above it is writable by others"),
            "{e}"
        );
    }
}
