//! The image's one layer: a file tree written as a tar archive that depends on nothing but
//! its contents (entries sorted by path, one fixed mtime, uid/gid 0, no user or group
//! names, no device numbers, no extended attributes), then gzipped without a name or time.

use std::collections::BTreeMap;
use std::io::Write;

use anyhow::{Context, Result, bail};

/// One entry of a [`FileTree`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    /// A directory with its permission bits.
    Dir {
        /// Permission bits (e.g. `0o755`).
        mode: u32,
    },
    /// A regular file.
    File {
        /// Permission bits (e.g. `0o644`, `0o755`).
        mode: u32,
        /// Its contents.
        data: Vec<u8>,
    },
    /// A symbolic link to `target` (as stored, relative or absolute).
    Symlink {
        /// The link's target.
        target: String,
    },
}

/// A root file system being assembled: paths relative to `/`, without leading or trailing
/// slashes (`usr/sbin/nft`). Parent directories are added as they are needed.
#[derive(Debug, Default, Clone)]
pub struct FileTree {
    nodes: BTreeMap<String, Node>,
}

/// Normalises `./usr/sbin/`, `/usr/sbin` and `usr/sbin` to `usr/sbin`; `None` for the root
/// itself. Refuses `..` so that nothing lands outside the tree.
pub fn normalize(path: &str) -> Result<Option<String>> {
    let parts: Vec<&str> = path
        .split('/')
        .filter(|p| !p.is_empty() && *p != ".")
        .collect();
    if parts.contains(&"..") {
        bail!("path {path:?} leaves the image root");
    }
    Ok((!parts.is_empty()).then(|| parts.join("/")))
}

impl FileTree {
    /// Adds (or replaces) `path` with `node`, creating missing parent directories with mode
    /// 0755. A directory added over an existing directory keeps the new mode; anything else
    /// replaces what was there.
    ///
    /// # Errors
    /// When `path` contains `..`, or a parent is not a directory.
    pub fn insert(&mut self, path: &str, node: Node) -> Result<()> {
        let Some(path) = normalize(path)? else {
            return Ok(()); // the root directory itself is implied
        };
        let mut parent = String::new();
        for part in path.split('/').take(path.split('/').count() - 1) {
            if !parent.is_empty() {
                parent.push('/');
            }
            parent.push_str(part);
            match self.nodes.get(&parent) {
                None => {
                    self.nodes.insert(parent.clone(), Node::Dir { mode: 0o755 });
                }
                Some(Node::Dir { .. }) => {}
                Some(other) => bail!("cannot add {path}: its parent {parent} is {other:?}"),
            }
        }
        self.nodes.insert(path, node);
        Ok(())
    }

    /// Removes `path` and everything under it.
    pub fn remove_tree(&mut self, path: &str) {
        let prefix = format!("{path}/");
        self.nodes
            .retain(|p, _| p != path && !p.starts_with(prefix.as_str()));
    }

    /// The entry at `path`, if any.
    pub fn get(&self, path: &str) -> Option<&Node> {
        self.nodes.get(path)
    }

    /// All paths, sorted.
    pub fn paths(&self) -> impl Iterator<Item = &str> {
        self.nodes.keys().map(String::as_str)
    }

    /// The uncompressed layer: a tar archive of the tree, every entry with mtime `mtime`
    /// (seconds since the epoch), owner 0:0 and no names, in path order.
    ///
    /// # Errors
    /// When the tar writer fails (a path or link name it cannot encode).
    pub fn to_tar(&self, mtime: u64) -> Result<Vec<u8>> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, node) in &self.nodes {
            let mut h = tar::Header::new_ustar();
            h.set_mtime(mtime);
            h.set_uid(0);
            h.set_gid(0);
            match node {
                Node::Dir { mode } => {
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_mode(*mode);
                    h.set_size(0);
                    b.append_data(&mut h, format!("{path}/"), std::io::empty())
                }
                Node::File { mode, data } => {
                    h.set_entry_type(tar::EntryType::Regular);
                    h.set_mode(*mode);
                    h.set_size(data.len() as u64);
                    b.append_data(&mut h, path, data.as_slice())
                }
                Node::Symlink { target } => {
                    h.set_entry_type(tar::EntryType::Symlink);
                    h.set_mode(0o777);
                    h.set_size(0);
                    b.append_link(&mut h, path, target)
                }
            }
            .with_context(|| format!("add {path} to the layer tar"))?;
        }
        b.into_inner().context("finish the layer tar")
    }
}

/// A tar archive of ready-made files (`(name, contents)`, written in the order given), each
/// with mode 0644, owner 0:0 and mtime `mtime`: the OCI layout and docker-archive files.
/// Directories in `dirs` come first, mode 0755.
///
/// # Errors
/// When the tar writer fails.
pub fn archive(dirs: &[&str], files: &[(String, &[u8])], mtime: u64) -> Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    for d in dirs {
        let mut h = tar::Header::new_ustar();
        h.set_mtime(mtime);
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(0o755);
        h.set_size(0);
        b.append_data(&mut h, format!("{d}/"), std::io::empty())
            .with_context(|| format!("add {d}/ to the archive"))?;
    }
    for (name, data) in files {
        let mut h = tar::Header::new_ustar();
        h.set_mtime(mtime);
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        b.append_data(&mut h, name, *data)
            .with_context(|| format!("add {name} to the archive"))?;
    }
    b.into_inner().context("finish the archive")
}

/// gzip (level 6) without a file name or time stamp in its header: the same bytes in give
/// the same bytes out.
///
/// # Errors
/// When compressing fails (out of memory).
pub fn gzip(data: &[u8]) -> Result<Vec<u8>> {
    let mut gz = flate2::GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), flate2::Compression::default());
    gz.write_all(data).context("gzip the layer")?;
    gz.finish().context("finish the gzip stream")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> FileTree {
        let mut t = FileTree::default();
        t.insert(
            "usr/sbin/nft",
            Node::File {
                mode: 0o755,
                data: b"x".to_vec(),
            },
        )
        .unwrap();
        t.insert(
            "./lib64/ld.so",
            Node::Symlink {
                target: "/lib/ld.so".into(),
            },
        )
        .unwrap();
        t.insert(
            "/vipd",
            Node::File {
                mode: 0o755,
                data: b"bin".to_vec(),
            },
        )
        .unwrap();
        t
    }

    #[test]
    fn parents_are_added_and_entries_sorted() {
        let t = tree();
        let paths: Vec<&str> = t.paths().collect();
        assert_eq!(
            paths,
            [
                "lib64",
                "lib64/ld.so",
                "usr",
                "usr/sbin",
                "usr/sbin/nft",
                "vipd"
            ]
        );
        assert_eq!(t.get("usr"), Some(&Node::Dir { mode: 0o755 }));
    }

    #[test]
    fn dot_dot_is_refused_and_root_ignored() {
        let mut t = FileTree::default();
        assert!(
            t.insert("usr/../../etc", Node::Dir { mode: 0o755 })
                .is_err()
        );
        t.insert("./", Node::Dir { mode: 0o700 }).unwrap();
        assert_eq!(t.paths().count(), 0);
    }

    #[test]
    fn tar_is_the_same_for_the_same_tree_whatever_the_insertion_order() {
        let a = tree().to_tar(1_700_000_000).unwrap();
        let mut t = FileTree::default();
        t.insert(
            "vipd",
            Node::File {
                mode: 0o755,
                data: b"bin".to_vec(),
            },
        )
        .unwrap();
        t.insert(
            "lib64/ld.so",
            Node::Symlink {
                target: "/lib/ld.so".into(),
            },
        )
        .unwrap();
        t.insert(
            "usr/sbin/nft",
            Node::File {
                mode: 0o755,
                data: b"x".to_vec(),
            },
        )
        .unwrap();
        assert_eq!(a, t.to_tar(1_700_000_000).unwrap());
        assert_ne!(a, t.to_tar(1_700_000_001).unwrap());
        let mut ar = tar::Archive::new(a.as_slice());
        for e in ar.entries().unwrap() {
            let e = e.unwrap();
            assert_eq!(e.header().mtime().unwrap(), 1_700_000_000);
            assert_eq!(
                (e.header().uid().unwrap(), e.header().gid().unwrap()),
                (0, 0)
            );
        }
        assert_eq!(gzip(&a).unwrap(), gzip(&a).unwrap());
    }

    #[test]
    fn remove_tree_drops_the_directory_and_its_contents_only() {
        let mut t = tree();
        t.insert("usr/sbinx", Node::Dir { mode: 0o755 }).unwrap();
        t.remove_tree("usr/sbin");
        let paths: Vec<&str> = t.paths().collect();
        assert_eq!(paths, ["lib64", "lib64/ld.so", "usr", "usr/sbinx", "vipd"]);
    }
}
