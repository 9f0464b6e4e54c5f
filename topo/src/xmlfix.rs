//! Light pre-processing of hwloc XML text before it is handed to hwloc.
//!
//! Two things are done here, both on the raw text and without a full XML
//! library:
//!
//! * [`format_version`] sniffs the `<topology version="...">` attribute so that
//!   an hwloc 3.x export gets a clear error instead of hwloc's bare `EINVAL`.
//! * [`ensure_pus`] adds PU objects to exports whose CPU hierarchy was trimmed
//!   away (the public AWS dumps keep only Package/NUMANode cpusets). hwloc 2.9
//!   loads such files, but its consistency check (`hwloc_topology_check`,
//!   which hwlocality runs in debug builds) aborts the process when the
//!   lowest level is not PU. One PU per cpuset bit is added to every leaf CPU
//!   object, which is exactly what the cpuset already says.

/// Major hwloc XML format version of a document: 1 (no `version` attribute on
/// `<topology>`), 2 (`version="2.0"`), 3... `None` when no `<topology` element
/// is found at all.
pub(crate) fn format_version(xml: &str) -> Option<u32> {
    let mut scanner = Scanner::new(xml);
    while let Some(tok) = scanner.next_token() {
        match tok {
            Token::Start { name, attrs, .. } if name == "topology" => {
                let major = attr(&attrs, "version")
                    .and_then(|v| v.split('.').next().and_then(|m| m.trim().parse().ok()))
                    .unwrap_or(1);
                return Some(major);
            }
            // The scanner does not move past what it cannot read: stop, as `normalize` does.
            Token::Error => return None,
            _ => {}
        }
    }
    None
}

/// Return a copy of `xml` in the shape hwloc's own exporter writes, or `None` when it is
/// already in that shape (or cannot be scanned: hwloc then reports the problem itself).
///
/// hwloc reads XML with libxml2 where its `libhwloc-plugins` package is installed, and
/// otherwise with a built-in minimal parser that only reads what hwloc writes: an
/// `<?xml ...?>` line, optionally a `<!DOCTYPE ...>` line, then `<topology` at the start of
/// the next line, and no comments or processing instructions anywhere. Real dumps often
/// carry licence comments before `<topology>`, which that parser rejects with `EINVAL`. So
/// every document is rewritten to that shape first, and both parsers read the same text.
pub(crate) fn normalize(xml: &str) -> Option<String> {
    let mut scanner = Scanner::new(xml);
    let mut topology_start = None;
    while let Some(tok) = scanner.next_token() {
        match tok {
            Token::Start { name, start, .. } if topology_start.is_none() => {
                if name != "topology" {
                    return None;
                }
                topology_start = Some(start);
            }
            Token::Error => return None,
            _ => {}
        }
    }
    let body_start = topology_start?;
    let mut out = String::with_capacity(xml.len());
    out.push_str("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    if let Some((s, e)) = scanner.doctype.filter(|&(_, e)| e <= body_start) {
        out.push_str(&xml[s..e]);
        out.push('\n');
    }
    let mut pos = body_start;
    for &(s, e) in scanner.skipped.iter().filter(|&&(s, _)| s >= body_start) {
        out.push_str(&xml[pos..s]);
        pos = e;
    }
    out.push_str(&xml[pos..]);
    (out != xml).then_some(out)
}

/// PUs at or above this bit are not added ([`ensure_pus`] leaves such a document alone).
const MAX_PU_BIT: usize = 8192;

/// Return a copy of `xml` with PU objects added where the CPU hierarchy has
/// none, or `None` when nothing needs to change (the document already has PUs,
/// or it cannot be scanned, in which case hwloc reports the problem itself).
pub(crate) fn ensure_pus(xml: &str) -> Option<String> {
    if xml.contains("type=\"PU\"") || xml.contains("type='PU'") {
        return None;
    }
    let version = format_version(xml)?;
    if version >= 3 {
        return None;
    }
    let objects = scan_objects(xml)?;
    // hwloc 2.x numbers objects by gp_index; objects without one are numbered
    // from a counter that may collide with indices met later in the file, so
    // give the new PUs explicit indices above every existing one.
    let mut next_gp = match objects.iter().filter_map(|o| o.gp_index).max() {
        // No index left above the largest: not a document to edit.
        Some(m) => Some(m.checked_add(1)?),
        None => None,
    };
    let mut edits: Vec<(usize, usize, String)> = Vec::new();
    for (idx, obj) in objects.iter().enumerate() {
        if !is_cpu_side(&obj.ty, version) || obj.has_cpu_child {
            continue;
        }
        let Some(cpuset) = obj.cpuset.as_deref() else {
            continue;
        };
        let bits = parse_bitmap(cpuset);
        if bits.is_empty() {
            continue;
        }
        // Each added PU's mask is as long as its bit is high: a cpuset of thousands of words
        // would make the document grow with the square of it. No machine has this many.
        if bits.last().is_some_and(|&b| b >= MAX_PU_BIT) {
            return None;
        }
        let nodeset = inherited(&objects, idx, |o| o.nodeset.clone());
        let complete_nodeset =
            inherited(&objects, idx, |o| o.complete_nodeset.clone()).or_else(|| nodeset.clone());
        if version >= 2 && nodeset.is_none() {
            // hwloc 2.x needs a nodeset on every CPU object; without one it
            // may crash. Leave the document alone.
            return None;
        }
        let mut pus = String::new();
        for bit in bits {
            let mask = single_bit_mask(bit);
            pus.push_str(&format!(
                "<object type=\"PU\" os_index=\"{bit}\" cpuset=\"{mask}\" complete_cpuset=\"{mask}\""
            ));
            if let Some(gp) = next_gp.as_mut() {
                pus.push_str(&format!(" gp_index=\"{gp}\""));
                *gp = gp.checked_add(1)?;
            }
            if let Some(ns) = &nodeset {
                pus.push_str(&format!(" nodeset=\"{ns}\""));
            }
            if let Some(cns) = &complete_nodeset {
                pus.push_str(&format!(" complete_nodeset=\"{cns}\""));
            }
            pus.push_str("/>");
        }
        if obj.self_closing {
            // `<object .../>` becomes `<object ...>PUs</object>`.
            edits.push((
                obj.start_tag_end - 2,
                obj.start_tag_end,
                format!(">{pus}</object>"),
            ));
        } else {
            edits.push((obj.start_tag_end, obj.start_tag_end, pus));
        }
    }
    if edits.is_empty() {
        return None;
    }
    edits.sort_by_key(|e| std::cmp::Reverse(e.0));
    let mut out = xml.to_string();
    for (start, end, text) in edits {
        out.replace_range(start..end, &text);
    }
    Some(out)
}

/// Walk up from `idx` to the first object where `get` yields a value.
fn inherited(
    objects: &[ObjInfo],
    idx: usize,
    get: impl Fn(&ObjInfo) -> Option<String>,
) -> Option<String> {
    let mut cur = Some(idx);
    while let Some(i) = cur {
        let obj = objects.get(i)?;
        if let Some(v) = get(obj) {
            return Some(v);
        }
        cur = obj.parent;
    }
    None
}

/// Object types of the CPU hierarchy (the ones that may hold PUs). In 1.x
/// exports NUMANode is part of that hierarchy; in 2.x it is a memory child.
fn is_cpu_side(ty: &str, version: u32) -> bool {
    match ty {
        "Machine" | "System" | "Package" | "Socket" | "Die" | "Core" | "Group" | "Cache"
        | "L1Cache" | "L2Cache" | "L3Cache" | "L4Cache" | "L5Cache" | "L1iCache" | "L2iCache"
        | "L3iCache" | "PU" => true,
        "NUMANode" => version < 2,
        _ => false,
    }
}

/// Parse an hwloc bitmap string (`0x0000ffff,0xffffffff`: 32-bit words, most
/// significant first; a `0xf...f` word stands for an infinite tail and is
/// ignored). Returns the set bit indices in increasing order; garbage words
/// count as empty.
pub(crate) fn parse_bitmap(s: &str) -> Vec<usize> {
    let words: Vec<&str> = s.trim().split(',').collect();
    let mut bits = Vec::new();
    for (pos, word) in words.iter().rev().enumerate() {
        let w = word.trim();
        let hex = w
            .strip_prefix("0x")
            .or_else(|| w.strip_prefix("0X"))
            .unwrap_or(w);
        if hex.contains("...") || hex.is_empty() {
            continue;
        }
        let Ok(value) = u32::from_str_radix(hex, 16) else {
            continue;
        };
        for b in 0..32 {
            if value & (1u32 << b) != 0 {
                bits.push(pos * 32 + b);
            }
        }
    }
    bits.sort_unstable();
    bits
}

/// hwloc bitmap string with only `bit` set.
pub(crate) fn single_bit_mask(bit: usize) -> String {
    let word = bit / 32;
    let mut parts = Vec::with_capacity(word + 1);
    for w in (0..=word).rev() {
        let value: u32 = if w == word { 1u32 << (bit % 32) } else { 0 };
        parts.push(format!("0x{value:08x}"));
    }
    parts.join(",")
}

/// hwloc's "no index" (`HWLOC_UNKNOWN_INDEX`, `(unsigned)-1`).
const UNKNOWN_INDEX: u64 = u32::MAX as u64;

/// The first PU or NUMA node whose `os_index` no hwloc bitmap can hold (past `INT_MAX`, but
/// not hwloc's "no index"): its type and index. hwloc loads such a file, then its consistency
/// check (debug builds) aborts the process, and a bitmap query for the index panics.
pub(crate) fn index_past_bitmaps(xml: &str) -> Option<(String, u64)> {
    scan_objects(xml)?
        .into_iter()
        .filter(|o| o.ty == "PU" || o.ty == "NUMANode")
        .find_map(|o| {
            let i = o.os_index?;
            (i > i32::MAX as u64 && i != UNKNOWN_INDEX).then_some((o.ty, i))
        })
}

/// What the scanner keeps about one `<object>` element.
#[derive(Debug, Default)]
struct ObjInfo {
    ty: String,
    cpuset: Option<String>,
    nodeset: Option<String>,
    complete_nodeset: Option<String>,
    gp_index: Option<u64>,
    os_index: Option<u64>,
    parent: Option<usize>,
    /// Byte offset just past the start tag's `>`.
    start_tag_end: usize,
    self_closing: bool,
    has_cpu_child: bool,
}

/// Scan all `<object>` elements with their nesting. `None` when the document
/// is not well formed enough to scan.
fn scan_objects(xml: &str) -> Option<Vec<ObjInfo>> {
    let version = format_version(xml)?;
    let mut scanner = Scanner::new(xml);
    let mut objects: Vec<ObjInfo> = Vec::new();
    // Stack of open elements: Some(index into objects) for <object>.
    let mut stack: Vec<Option<usize>> = Vec::new();
    while let Some(tok) = scanner.next_token() {
        match tok {
            Token::Start {
                name,
                attrs,
                end,
                self_closing,
                ..
            } => {
                let parent_obj = stack.iter().rev().flatten().next().copied();
                let idx = if name == "object" {
                    let ty = attr(&attrs, "type").unwrap_or_default();
                    if is_cpu_side(&ty, version) {
                        if let Some(p) = parent_obj.and_then(|p| objects.get_mut(p)) {
                            p.has_cpu_child = true;
                        }
                    }
                    objects.push(ObjInfo {
                        ty,
                        cpuset: attr(&attrs, "cpuset"),
                        nodeset: attr(&attrs, "nodeset"),
                        complete_nodeset: attr(&attrs, "complete_nodeset"),
                        gp_index: attr(&attrs, "gp_index").and_then(|g| g.trim().parse().ok()),
                        os_index: attr(&attrs, "os_index").and_then(|g| g.trim().parse().ok()),
                        parent: parent_obj,
                        start_tag_end: end,
                        self_closing,
                        has_cpu_child: false,
                    });
                    Some(objects.len() - 1)
                } else {
                    None
                };
                if !self_closing {
                    stack.push(idx);
                }
            }
            Token::End => {
                stack.pop()?;
            }
            Token::Error => return None,
        }
    }
    if stack.is_empty() {
        Some(objects)
    } else {
        None
    }
}

fn attr(attrs: &[(String, String)], key: &str) -> Option<String> {
    attrs.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
}

enum Token {
    Start {
        name: String,
        attrs: Vec<(String, String)>,
        /// Byte offset of the start tag's `<`.
        start: usize,
        /// Byte offset just past the closing `>` of the start tag.
        end: usize,
        self_closing: bool,
    },
    End,
    Error,
}

/// Minimal tokenizer for the XML that hwloc writes: elements, attributes in
/// single or double quotes, comments, processing instructions, DOCTYPE and
/// text. Entities are left as they are (only the structure matters here).
struct Scanner<'a> {
    s: &'a str,
    pos: usize,
    /// Byte ranges of the comments and processing instructions skipped so far.
    skipped: Vec<(usize, usize)>,
    /// Byte range of the `<!DOCTYPE ...>` declaration, once met.
    doctype: Option<(usize, usize)>,
}

impl<'a> Scanner<'a> {
    fn new(s: &'a str) -> Self {
        Self {
            s,
            pos: 0,
            skipped: Vec::new(),
            doctype: None,
        }
    }

    fn next_token(&mut self) -> Option<Token> {
        loop {
            let rest = self.s.get(self.pos..)?;
            let lt = rest.find('<')?;
            self.pos += lt;
            let rest = self.s.get(self.pos..)?;
            if rest.starts_with("<!--") {
                match rest.find("-->") {
                    Some(e) => self.skip(e + 3),
                    None => return Some(Token::Error),
                }
                continue;
            }
            if rest.starts_with("<?") {
                match rest.find("?>") {
                    Some(e) => self.skip(e + 2),
                    None => return Some(Token::Error),
                }
                continue;
            }
            if rest.starts_with("<![CDATA[") {
                match rest.find("]]>") {
                    Some(e) => self.pos += e + 3,
                    None => return Some(Token::Error),
                }
                continue;
            }
            if rest.starts_with("<!") {
                // DOCTYPE, possibly with an internal subset in brackets.
                let close = match (rest.find('['), rest.find('>')) {
                    (Some(b), Some(g)) if b < g => rest.find("]>").map(|e| e + 2),
                    (_, Some(g)) => Some(g + 1),
                    _ => None,
                };
                match close {
                    Some(e) => {
                        if rest.starts_with("<!DOCTYPE") && self.doctype.is_none() {
                            self.doctype = Some((self.pos, self.pos + e));
                        }
                        self.pos += e;
                    }
                    None => return Some(Token::Error),
                }
                continue;
            }
            if rest.starts_with("</") {
                match rest.find('>') {
                    Some(e) => self.pos += e + 1,
                    None => return Some(Token::Error),
                }
                return Some(Token::End);
            }
            return Some(self.start_tag());
        }
    }

    /// Skip `len` bytes of a comment or processing instruction, remembering where it was.
    fn skip(&mut self, len: usize) {
        self.skipped.push((self.pos, self.pos + len));
        self.pos += len;
    }

    /// Parse a start tag at `self.pos` (which points at `<`).
    fn start_tag(&mut self) -> Token {
        let start = self.pos;
        let bytes = self.s.as_bytes();
        let mut i = self.pos + 1;
        let name_start = i;
        while i < bytes.len()
            && !bytes[i].is_ascii_whitespace()
            && bytes[i] != b'>'
            && bytes[i] != b'/'
        {
            i += 1;
        }
        let Some(name) = self.s.get(name_start..i) else {
            return Token::Error;
        };
        let name = name.to_string();
        let mut attrs = Vec::new();
        loop {
            while i < bytes.len() && bytes[i].is_ascii_whitespace() {
                i += 1;
            }
            if i >= bytes.len() {
                return Token::Error;
            }
            if bytes[i] == b'>' {
                self.pos = i + 1;
                return Token::Start {
                    name,
                    attrs,
                    start,
                    end: i + 1,
                    self_closing: false,
                };
            }
            if bytes[i] == b'/' {
                if bytes.get(i + 1) == Some(&b'>') {
                    self.pos = i + 2;
                    return Token::Start {
                        name,
                        attrs,
                        start,
                        end: i + 2,
                        self_closing: true,
                    };
                }
                return Token::Error;
            }
            let key_start = i;
            while i < bytes.len()
                && bytes[i] != b'='
                && !bytes[i].is_ascii_whitespace()
                && bytes[i] != b'>'
            {
                i += 1;
            }
            let Some(key) = self.s.get(key_start..i) else {
                return Token::Error;
            };
            while i < bytes.len() && bytes[i].is_ascii_whitespace() {
                i += 1;
            }
            if bytes.get(i) != Some(&b'=') {
                return Token::Error;
            }
            i += 1;
            while i < bytes.len() && bytes[i].is_ascii_whitespace() {
                i += 1;
            }
            let Some(&quote) = bytes.get(i) else {
                return Token::Error;
            };
            if quote != b'"' && quote != b'\'' {
                return Token::Error;
            }
            i += 1;
            let value_start = i;
            while i < bytes.len() && bytes[i] != quote {
                i += 1;
            }
            if i >= bytes.len() {
                return Token::Error;
            }
            let Some(value) = self.s.get(value_start..i) else {
                return Token::Error;
            };
            attrs.push((key.to_string(), value.to_string()));
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitmap_parsing() {
        assert_eq!(parse_bitmap("0x00000003"), vec![0, 1]);
        assert_eq!(parse_bitmap("0x00000100,0x0"), vec![40]);
        assert_eq!(
            parse_bitmap("0x0000000f,0x80000000"),
            vec![31, 32, 33, 34, 35]
        );
        assert_eq!(parse_bitmap("0xf...f,0x00000001"), vec![0]);
        assert!(parse_bitmap("").is_empty());
        assert!(parse_bitmap("zzz").is_empty());
    }

    #[test]
    fn single_bit_masks() {
        assert_eq!(single_bit_mask(0), "0x00000001");
        assert_eq!(single_bit_mask(33), "0x00000002,0x00000000");
        assert_eq!(parse_bitmap(&single_bit_mask(77)), vec![77]);
    }

    #[test]
    fn version_sniffing() {
        assert_eq!(
            format_version("<topology version=\"2.0\"></topology>"),
            Some(2)
        );
        assert_eq!(format_version("<?xml version=\"1.0\"?><topology>"), Some(1));
        assert_eq!(format_version("<topology version='3.0'/>"), Some(3));
        assert_eq!(format_version("<foo/>"), None);
        assert_eq!(format_version("not xml"), None);
    }

    /// A document cut off before `<topology` (or any bytes the scanner cannot read) is
    /// answered at once: the scanner stays where it cannot read, so a loop that passed its
    /// error over spun forever.
    #[test]
    fn unreadable_documents_end_the_scan() {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for doc in [
                "<",
                "<x",
                "<topol",
                "<?xml version=\"1.0\"?>\n<!-- lic",
                "<a =\"b\">",
            ] {
                let _ = tx.send((doc, format_version(doc), normalize(doc), ensure_pus(doc)));
            }
        });
        for _ in 0..5 {
            let (doc, v, n, p) = rx
                .recv_timeout(std::time::Duration::from_secs(10))
                .expect("the scan of a cut-off document did not end");
            assert_eq!((v, n.is_none(), p.is_none()), (None, true, true), "{doc:?}");
        }
    }

    #[test]
    fn adds_pus_to_leaf_package() {
        let xml = r#"<?xml version="1.0"?>
<!DOCTYPE topology SYSTEM "hwloc2.dtd">
<topology version="2.0">
  <!-- a comment with <object type="PU"> inside is not a PU -->
  <object type="Machine" os_index="0" cpuset="0x00000003" nodeset="0x00000001" complete_nodeset="0x00000001">
    <object type="Package" os_index="0" cpuset="0x00000003" nodeset="0x00000001">
      <object type="NUMANode" os_index="0" cpuset="0x00000003" nodeset="0x00000001"/>
    </object>
  </object>
</topology>"#;
        // The comment contains type="PU" literally: ensure_pus bails out early
        // on such a document, which is harmless.
        assert!(ensure_pus(xml).is_none());
        let xml = xml.replace("<object type=\"PU\">", "");
        let fixed = ensure_pus(&xml).expect("PUs added");
        assert!(fixed.contains(
            "<object type=\"Package\" os_index=\"0\" cpuset=\"0x00000003\" nodeset=\"0x00000001\"><object type=\"PU\" os_index=\"0\""
        ));
        assert_eq!(fixed.matches("type=\"PU\"").count(), 2);
        assert!(fixed.contains("complete_nodeset=\"0x00000001\""));
        assert!(ensure_pus(&fixed).is_none());
    }

    #[test]
    fn self_closing_leaf_gets_children() {
        let xml = r#"<topology version="2.0"><object type="Machine" cpuset="0x00000001" nodeset="0x00000001"/></topology>"#;
        let fixed = ensure_pus(xml).expect("PUs added");
        assert_eq!(
            fixed,
            r#"<topology version="2.0"><object type="Machine" cpuset="0x00000001" nodeset="0x00000001"><object type="PU" os_index="0" cpuset="0x00000001" complete_cpuset="0x00000001" nodeset="0x00000001" complete_nodeset="0x00000001"/></object></topology>"#
        );
    }

    #[test]
    fn normalize_writes_what_hwloc_writes() {
        let xml = "<?xml version='1.0'?>\n<!-- licence -->\n<!-- more -->\n\
                   <!DOCTYPE topology SYSTEM \"hwloc2.dtd\">\n\n  <topology version=\"2.0\">\n\
                   <!-- inner --><object type=\"Machine\"/><?pi x?>\n</topology>\n";
        let out = normalize(xml).expect("changed");
        assert_eq!(
            out,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
             <!DOCTYPE topology SYSTEM \"hwloc2.dtd\">\n\
             <topology version=\"2.0\">\n<object type=\"Machine\"/>\n</topology>\n"
        );
        // Already in hwloc's shape: nothing to do. Comments inside values are text.
        let canonical = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<topology>\n\
                         <info name=\"a\" value=\"&lt;!-- x --&gt;\"/>\n</topology>\n";
        assert_eq!(normalize(canonical), None);
        assert_eq!(normalize(&out), None);
        // Not hwloc XML, or malformed: left for hwloc to report.
        assert_eq!(normalize("<html></html>"), None);
        assert_eq!(normalize("<topology version=\"2.0\"><!-- open"), None);
    }

    #[test]
    fn malformed_documents_are_left_alone() {
        assert!(ensure_pus("<topology version=\"2.0\"><object type=\"Machine\"").is_none());
        assert!(ensure_pus("").is_none());
        assert!(ensure_pus("<topology version=\"3.0\"></topology>").is_none());
        // The largest gp_index: no index above it for the PUs (it overflowed).
        let top = format!(
            r#"<topology version="2.0"><object type="Machine" gp_index="{}" cpuset="0x00000001" nodeset="0x00000001"/></topology>"#,
            u64::MAX
        );
        assert!(ensure_pus(&top).is_none());
        // An all-ones cpuset of 4096 words: left alone, not grown to gigabytes.
        let wide = vec!["0xffffffff"; 4096].join(",");
        let wide = format!(
            r#"<topology version="2.0"><object type="Machine" cpuset="{wide}" nodeset="0x00000001"/></topology>"#
        );
        assert!(ensure_pus(&wide).is_none());
    }
}
