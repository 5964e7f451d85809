//! The trace format, version 1: reading and writing its JSON lines.
//!
//! See the [crate documentation](crate#the-trace-format-version-1) for the schema.

use std::fmt::Write as _;
use std::io::{self, BufRead, Write};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};

/// The version of the format this crate reads and writes.
pub const FORMAT_VERSION: u32 = 1;

/// The key whose presence marks the optional header line.
pub const HEADER_KEY: &str = "gpumem_trace";

/// Which operation a line records (the `hook` key).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Hook {
    /// A raw allocation from the device (CuPy's `alloc` hook point): `mem_size` bytes at
    /// `mem_ptr`, 0 if it failed.
    Alloc,
    /// An allocation from the pool (CuPy's `malloc`): `size` bytes asked for, `mem_size` lent
    /// at `mem_ptr` (0 if it failed).
    #[default]
    Malloc,
    /// A pool allocation given back (CuPy's `free`).
    Free,
    /// A raw block given back to the device. CuPy has no hook point for it; this format adds it.
    RawFree,
    /// An iteration boundary of the program's loop (`gpumem_step`, `Pool::step`): no operation,
    /// `mem_size` and `mem_ptr` 0. CuPy has no hook point for it; this format adds it, so that a
    /// replay can plan from the loop as the pool did.
    Step,
}

impl Hook {
    /// The value of the `hook` key.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Hook::Alloc => "alloc",
            Hook::Malloc => "malloc",
            Hook::Free => "free",
            Hook::RawFree => "raw_free",
            Hook::Step => "step",
        }
    }
}

/// When a line was written relative to its operation (the `phase` key).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Before the operation (a `*_preprocess` hook): what was asked, not what happened. Replay and
    /// statistics skip these lines.
    Pre,
    /// After the operation (a `*_postprocess` hook), with its outcome. The default: CuPy's
    /// DebugPrintHook writes only these, without a `phase` key.
    #[default]
    Post,
}

/// One line of a trace: one hook call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Event {
    /// The operation.
    pub hook: Hook,
    /// Before or after the operation.
    pub phase: Phase,
    /// The device.
    pub device_id: i32,
    /// The bytes asked for: CuPy writes it on `malloc` lines only; on `free` lines it is an
    /// extension (PyTorch records the requested size of each free).
    pub size: Option<u64>,
    /// The bytes allocated or freed, rounded to the allocator's unit.
    pub mem_size: u64,
    /// The address; 0 for a failed allocation.
    pub mem_ptr: u64,
    /// The pooled memory object's id (`malloc` and `free` lines; 0 for a failed `malloc`).
    pub pmem_id: Option<u64>,
    /// The stream the operation was ordered on (its raw handle, or a small number).
    pub stream: Option<u64>,
    /// The thread that made the call.
    pub thread: Option<u64>,
    /// Nanoseconds since an arbitrary origin, the same for every line of the trace.
    pub time_ns: Option<u64>,
    /// Where the allocation was made (`file:line:function` or any text).
    pub site: Option<String>,
}

impl Event {
    /// The operation.
    #[must_use]
    pub fn kind(&self) -> Hook {
        self.hook
    }

    /// Whether the line records an outcome (not a `*_preprocess` call).
    #[must_use]
    pub fn is_post(&self) -> bool {
        self.phase == Phase::Post
    }

    /// The line, without its newline: CuPy's keys in CuPy's order (byte for byte what
    /// DebugPrintHook writes when no extension key is set), then the extension keys.
    #[must_use]
    pub fn to_line(&self) -> String {
        let mut s = String::with_capacity(160);
        // `write!` to a String cannot fail.
        let _ = write!(s, "{{\"hook\":\"{}\",\"device_id\":{}", self.kind().as_str(), self.device_id);
        let cupy_has_size = self.kind() == Hook::Malloc;
        if cupy_has_size {
            let _ = write!(s, ",\"size\":{}", self.size.unwrap_or(self.mem_size));
        }
        let _ = write!(s, ",\"mem_size\":{},\"mem_ptr\":{}", self.mem_size, self.mem_ptr);
        if let Some(id) = self.pmem_id {
            let _ = write!(s, ",\"pmem_id\":\"{id:#x}\"");
        }
        if !cupy_has_size {
            if let Some(size) = self.size {
                let _ = write!(s, ",\"size\":{size}");
            }
        }
        if self.phase == Phase::Pre {
            s.push_str(",\"phase\":\"pre\"");
        }
        if let Some(v) = self.stream {
            let _ = write!(s, ",\"stream\":{v}");
        }
        if let Some(v) = self.thread {
            let _ = write!(s, ",\"thread\":{v}");
        }
        if let Some(v) = self.time_ns {
            let _ = write!(s, ",\"time_ns\":{v}");
        }
        if let Some(site) = &self.site {
            s.push_str(",\"site\":");
            s.push_str(&serde_json::to_string(site).expect("a string always serialises"));
        }
        s.push('}');
        s
    }

    /// The requested size: `size` if the line has it, else `mem_size`.
    #[must_use]
    pub fn requested(&self) -> u64 {
        self.size.unwrap_or(self.mem_size)
    }
}

/// The optional first line of a trace: `{"gpumem_trace":1,...}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    /// The format version ([`FORMAT_VERSION`]).
    pub gpumem_trace: u32,
    /// What the trace was made from: `"gpumem"`, `"cupy"`, `"pytorch"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Free text (the file imported, the program recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl Header {
    /// A header of this version for `source`.
    #[must_use]
    pub fn new(source: &str, note: Option<String>) -> Self {
        Header { gpumem_trace: FORMAT_VERSION, source: Some(source.to_owned()), note }
    }
}

/// A whole trace: its header, if it has one, and its events in file order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trace {
    /// The header line, if the file has one.
    pub header: Option<Header>,
    /// The events.
    pub events: Vec<Event>,
}

impl Trace {
    /// Parses a trace from text.
    ///
    /// # Errors
    ///
    /// [`Error::Parse`] with the line number for a line that is not a valid event;
    /// [`Error::Version`] for a header of a newer version.
    pub fn parse(text: &str) -> Result<Self> {
        Self::read(text.as_bytes())
    }

    /// Reads a trace line by line. Blank lines are skipped.
    ///
    /// # Errors
    ///
    /// As [`Trace::parse`], and [`Error::Io`] when reading fails.
    pub fn read(reader: impl BufRead) -> Result<Self> {
        let mut trace = Trace::default();
        for line in numbered_lines(reader) {
            let (n, line) = line?;
            let Some(line) = line else {
                return Err(Error::Parse { line: n, message: "not UTF-8".into() });
            };
            if line.trim().is_empty() {
                continue;
            }
            match parse_line(&line, n)? {
                Line::Header(h) if trace.header.is_none() && trace.events.is_empty() => {
                    trace.header = Some(h)
                }
                Line::Header(_) => {
                    return Err(Error::Parse {
                        line: n,
                        message: "a header line after the first line".into(),
                    })
                }
                Line::Event(e) => trace.events.push(e),
            }
        }
        Ok(trace)
    }

    /// Writes the trace: the header line if there is one, then one line per event.
    ///
    /// # Errors
    ///
    /// [`Error::Io`] when writing fails.
    pub fn write(&self, mut w: impl Write) -> Result<()> {
        if let Some(h) = &self.header {
            writeln!(w, "{}", serde_json::to_string(h).expect("a header always serialises"))?;
        }
        for e in &self.events {
            writeln!(w, "{}", e.to_line())?;
        }
        w.flush()?;
        Ok(())
    }

    /// The trace as text.
    #[must_use]
    pub fn to_text(&self) -> String {
        let mut out = Vec::new();
        self.write(&mut out).expect("writing to a Vec cannot fail");
        String::from_utf8(out).expect("the lines are UTF-8")
    }
}

/// A parsed line.
pub(crate) enum Line {
    Header(Header),
    Event(Event),
}

/// The lines of `reader`, each with its 1-based number, as text, or `None` for a line that is not
/// UTF-8: unlike [`BufRead::lines`], such a line can be skipped and the lines after it read (a
/// captured program output may hold one). The line ending (`\n` or `\r\n`) is removed.
pub(crate) fn numbered_lines(
    mut reader: impl BufRead,
) -> impl Iterator<Item = Result<(usize, Option<String>)>> {
    let mut n = 0;
    let mut buf = Vec::new();
    std::iter::from_fn(move || {
        buf.clear();
        match reader.read_until(b'\n', &mut buf) {
            Ok(0) => None,
            Ok(_) => {
                n += 1;
                if buf.last() == Some(&b'\n') {
                    buf.pop();
                    if buf.last() == Some(&b'\r') {
                        buf.pop();
                    }
                }
                Some(Ok((n, String::from_utf8(std::mem::take(&mut buf)).ok())))
            }
            Err(e) => Some(Err(e.into())),
        }
    })
}

/// Parses one line (`n` is its 1-based number, for errors).
pub(crate) fn parse_line(line: &str, n: usize) -> Result<Line> {
    let err = |message: String| Error::Parse { line: n, message };
    let value: Value = serde_json::from_str(line).map_err(|e| err(format!("not JSON: {e}")))?;
    let Value::Object(map) = value else {
        return Err(err("not a JSON object".into()));
    };
    if let Some(v) = map.get(HEADER_KEY) {
        let header: Header = serde_json::from_value(Value::Object(map.clone()))
            .map_err(|e| err(format!("bad header: {e}")))?;
        if header.gpumem_trace > FORMAT_VERSION {
            return Err(Error::Version { found: v.to_string(), supported: FORMAT_VERSION });
        }
        return Ok(Line::Header(header));
    }
    let hook = match map.get("hook").and_then(Value::as_str) {
        Some("alloc") => Hook::Alloc,
        Some("malloc") => Hook::Malloc,
        Some("free") => Hook::Free,
        Some("raw_free") => Hook::RawFree,
        Some("step") => Hook::Step,
        Some(other) => return Err(err(format!("unknown hook {other:?}"))),
        None => return Err(err("no \"hook\" key".into())),
    };
    let uint = |key: &str| -> Result<Option<u64>> {
        match map.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => {
                v.as_u64().map(Some).ok_or_else(|| err(format!("{key:?} is not a non-negative integer")))
            }
        }
    };
    let need = |key: &str| -> Result<u64> { uint(key)?.ok_or_else(|| err(format!("no {key:?} key"))) };
    let device_id = match map.get("device_id") {
        Some(v) => v
            .as_i64()
            .and_then(|d| i32::try_from(d).ok())
            .ok_or_else(|| err("\"device_id\" is not a 32-bit integer".into()))?,
        None => return Err(err("no \"device_id\" key".into())),
    };
    let pmem_id = match map.get("pmem_id") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => {
            Some(parse_hex(s).ok_or_else(|| err(format!("\"pmem_id\" {s:?} is not 0x-hex")))?)
        }
        Some(v) => {
            Some(v.as_u64().ok_or_else(|| err("\"pmem_id\" is neither a hex string nor an integer".into()))?)
        }
    };
    let phase = match map.get("phase").and_then(Value::as_str) {
        None => Phase::Post,
        Some("post") => Phase::Post,
        Some("pre") => Phase::Pre,
        Some(other) => return Err(err(format!("unknown phase {other:?}"))),
    };
    let site = match map.get("site") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(err("\"site\" is not a string".into())),
    };
    Ok(Line::Event(Event {
        hook,
        phase,
        device_id,
        size: uint("size")?,
        mem_size: need("mem_size")?,
        mem_ptr: need("mem_ptr")?,
        pmem_id,
        stream: uint("stream")?,
        thread: uint("thread")?,
        time_ns: uint("time_ns")?,
        site,
    }))
}

/// Python's `hex()` read back: `0x` then hexadecimal digits.
fn parse_hex(s: &str) -> Option<u64> {
    let digits = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X"))?;
    u64::from_str_radix(digits, 16).ok()
}

/// Reads a file, or standard input for `-`.
///
/// # Errors
///
/// [`Error::Io`] naming the path.
pub fn read_file(path: &std::path::Path) -> Result<Trace> {
    if path.as_os_str() == "-" {
        return Trace::read(io::stdin().lock());
    }
    let f = std::fs::File::open(path).map_err(|e| Error::file(path, e))?;
    Trace::read(io::BufReader::new(f))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CUPY: &str = r#"{"hook":"alloc","device_id":0,"mem_size":512,"mem_ptr":150496608256}
{"hook":"malloc","device_id":0,"size":24,"mem_size":512,"mem_ptr":150496608256,"pmem_id":"0x7f39200c5278"}
{"hook":"free","device_id":0,"mem_size":512,"mem_ptr":150496608256,"pmem_id":"0x7f39200c5278"}
"#;

    #[test]
    fn cupy_lines_round_trip_byte_for_byte() {
        let t = Trace::parse(CUPY).unwrap();
        assert_eq!(t.events.len(), 3);
        assert_eq!(t.events[1].size, Some(24));
        assert_eq!(t.events[1].pmem_id, Some(0x7f39_200c_5278));
        assert_eq!(t.to_text(), CUPY);
    }

    #[test]
    fn extension_keys_round_trip_after_cupy_keys() {
        let e = Event {
            hook: Hook::Free,
            phase: Phase::Pre,
            device_id: 1,
            size: Some(100),
            mem_size: 512,
            mem_ptr: 4096,
            pmem_id: Some(7),
            stream: Some(3),
            thread: Some(9),
            time_ns: Some(12_345),
            site: Some("a \"b\".py:3:f".into()),
        };
        let line = e.to_line();
        assert!(line.starts_with(
            r#"{"hook":"free","device_id":1,"mem_size":512,"mem_ptr":4096,"pmem_id":"0x7","size":100"#
        ));
        let t = Trace {
            header: Some(Header::new("gpumem", Some("x".into()))),
            events: vec![e.clone(), Event { hook: Hook::RawFree, ..Default::default() }],
        };
        assert_eq!(Trace::parse(&t.to_text()).unwrap(), t);
    }

    #[test]
    fn bad_lines_are_typed_errors_with_their_number() {
        for (text, want) in [
            ("{\"hook\":\"malloc\"}", "device_id"),
            ("[1]", "object"),
            ("{\"hook\":\"steal\",\"device_id\":0}", "unknown hook"),
            ("{\"hook\":\"free\",\"device_id\":0,\"mem_size\":-1,\"mem_ptr\":0}", "mem_size"),
            (
                "{\"hook\":\"free\",\"device_id\":0,\"mem_size\":1,\"mem_ptr\":0,\"pmem_id\":\"zz\"}",
                "pmem_id",
            ),
            ("nope", "not JSON"),
        ] {
            let e = Trace::parse(&format!("\n{text}\n")).unwrap_err();
            match &e {
                Error::Parse { line, message } => {
                    assert_eq!(*line, 2);
                    assert!(message.contains(want), "{message}");
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(matches!(Trace::parse("{\"gpumem_trace\":2}"), Err(Error::Version { .. })));
        let late_header = format!("{}{{\"gpumem_trace\":1}}\n", CUPY);
        assert!(matches!(Trace::parse(&late_header), Err(Error::Parse { line: 4, .. })));
    }
}
