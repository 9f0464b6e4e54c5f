//! Bad input gives typed errors that name the file.

use std::path::{Path, PathBuf};
use topo::Error;

/// A file `name` in a directory of its own under the temp dir; both go when it drops, so
/// no run leaves them behind (tests run in parallel: one directory per file).
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str, contents: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("topo-errors-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join(name);
        std::fs::write(&path, contents).expect("write temp file");
        Self(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

#[test]
fn missing_file_is_a_read_error_naming_it() {
    let path = PathBuf::from("/nonexistent/dir/topology.xml");
    match topo::from_xml(&path) {
        Err(e @ Error::XmlRead { .. }) => {
            assert!(
                e.to_string().contains("/nonexistent/dir/topology.xml"),
                "{e}"
            );
        }
        other => panic!("expected XmlRead, got {other:?}"),
    }
}

#[test]
fn malformed_xml_is_invalid_naming_the_file() {
    let file = Scratch::new(
        "truncated.xml",
        "<?xml version=\"1.0\"?>\n<topology version=\"2.0\">\n  <object type=\"Machine\" os_index=\"0\"",
    );
    let err = topo::from_xml(file.path()).expect_err("truncated XML must fail");
    assert!(matches!(err, Error::XmlInvalid { .. }), "{err:?}");
    assert!(err.to_string().contains("truncated.xml"), "{err}");
}

#[test]
fn other_documents_are_invalid() {
    for (name, text) in [
        ("empty.xml", ""),
        ("garbage.xml", "this is not xml at all"),
        ("other.xml", "<?xml version=\"1.0\"?><html><body/></html>"),
        ("nul.xml", "<topology version=\"2.0\">\0</topology>"),
    ] {
        let file = Scratch::new(name, text);
        let err = topo::from_xml(file.path()).expect_err(name);
        assert!(matches!(err, Error::XmlInvalid { .. }), "{name}: {err:?}");
        assert!(err.to_string().contains(name), "{err}");
    }
}

#[test]
fn hwloc3_export_is_refused_clearly() {
    let err = topo::from_xml_str("<?xml version=\"1.0\"?><topology version=\"3.0\"></topology>")
        .expect_err("v3 must fail");
    let text = err.to_string();
    assert!(
        text.contains("<xml buffer>") && text.contains("version 3"),
        "{text}"
    );
}

#[test]
fn directory_is_a_read_error() {
    let err = topo::from_xml(std::env::temp_dir()).expect_err("a directory is no file");
    assert!(matches!(err, Error::XmlRead { .. }), "{err:?}");
}
