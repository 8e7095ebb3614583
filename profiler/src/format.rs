//! Constants and primitive encodings of the trace file format (see `docs/trace-format.md`).
//!
//! A file is `MAGIC`, the major and minor version (`u16` little-endian each), then chunks. A chunk
//! is a 12-byte header (`u32` payload length, `u32` CRC-32 of the payload, `u32` CRC-32 of the
//! first 8 header bytes, all little-endian) followed by the payload: a sequence of records, each a
//! tag byte and a body of LEB128 varints, zigzag deltas and length-prefixed strings.

/// The first 8 bytes of every trace file.
pub const MAGIC: [u8; 8] = *b"PKTRACE\0";
/// Major format version written by this crate; readers refuse other majors.
pub const FORMAT_MAJOR: u16 = 1;
/// Minor format version written by this crate; newer minors only add skippable records.
/// 1.1 added the Python stack records (`PY_STACK`, `OP_PY_STACK`).
pub const FORMAT_MINOR: u16 = 1;
/// Size of the file preamble (magic + versions).
pub const PREAMBLE_LEN: usize = 12;
/// Size of a chunk header.
pub const CHUNK_HEADER_LEN: usize = 12;
/// Largest payload a chunk may have; a larger length field means corruption.
pub const MAX_CHUNK_PAYLOAD: u32 = 16 << 20;
/// File extension of trace files (without the dot).
pub const TRACE_EXTENSION: &str = "pktrace";

/// Record tags. Tags below [`tag::EXTENSION_FIRST`] have a fixed layout known to every reader of
/// the major version; tags from it on are followed by a varint body length so older readers can
/// skip them.
pub(crate) mod tag {
    pub const HEADER: u8 = 0x01;
    pub const STRING: u8 = 0x02;
    pub const CALLSITE: u8 = 0x03;
    pub const LOCATION: u8 = 0x04;
    pub const THREAD: u8 = 0x05;
    pub const THREAD_CONTEXT: u8 = 0x06;
    pub const SPAN_NEW: u8 = 0x10;
    pub const SPAN_ENTER: u8 = 0x11;
    pub const SPAN_EXIT: u8 = 0x12;
    pub const SPAN_CLOSE: u8 = 0x13;
    pub const SPAN_RECORD: u8 = 0x14;
    pub const EVENT: u8 = 0x15;
    pub const GPU: u8 = 0x20;
    pub const GPU_TIMING: u8 = 0x21;
    pub const DEVICE: u8 = 0x22;
    pub const DEVICE_MEMORY: u8 = 0x23;
    pub const GPU_SAMPLE: u8 = 0x24;
    pub const STACK: u8 = 0x25;
    pub const MODULE: u8 = 0x26;
    pub const OP_STACK: u8 = 0x27;
    pub const DROPPED: u8 = 0x30;
    pub const PANIC: u8 = 0x31;
    pub const END: u8 = 0x3F;
    pub const EXTENSION_FIRST: u8 = 0x80;
    /// 1.1: a Python call stack (extension record).
    pub const PY_STACK: u8 = 0x80;
    /// 1.1: the Python stack of a GPU operation (extension record).
    pub const OP_PY_STACK: u8 = 0x81;
}

/// Field value type codes.
pub(crate) mod value {
    pub const U64: u8 = 0;
    pub const I64: u8 = 1;
    pub const F64: u8 = 2;
    pub const FALSE: u8 = 3;
    pub const TRUE: u8 = 4;
    pub const STR: u8 = 5;
}

/// GPU record flag bits.
pub(crate) mod gpu_flag {
    pub const GPU_START: u64 = 1;
    pub const GPU_END: u64 = 1 << 1;
    pub const STREAM: u64 = 1 << 2;
    pub const SPAN: u64 = 1 << 3;
    pub const LOCATION: u64 = 1 << 4;
    pub const KERNEL: u64 = 1 << 5;
    pub const PINNED: u64 = 1 << 6;
    pub const PAGEABLE: u64 = 1 << 7;
    pub const GPU_END_AT_HOST_RETURN: u64 = 1 << 8;
}

/// Appends `v` as an unsigned LEB128 varint.
#[inline]
pub(crate) fn put_varint(buf: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        buf.push((v as u8) | 0x80);
        v >>= 7;
    }
    buf.push(v as u8);
}

/// Zigzag-encodes a signed value.
#[inline]
pub(crate) fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

/// Decodes a zigzag-encoded value.
#[inline]
pub(crate) fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// Appends the signed difference `v - base` (wrapping) as a zigzag varint.
#[inline]
pub(crate) fn put_delta(buf: &mut Vec<u8>, v: u64, base: u64) {
    put_varint(buf, zigzag(v.wrapping_sub(base) as i64));
}

/// Appends a length-prefixed UTF-8 string.
#[inline]
pub(crate) fn put_str(buf: &mut Vec<u8>, s: &str) {
    put_varint(buf, s.len() as u64);
    buf.extend_from_slice(s.as_bytes());
}

/// Appends an optional `u32` as a varint (0 = absent, else value + 1).
#[inline]
pub(crate) fn put_opt(buf: &mut Vec<u8>, v: Option<u64>) {
    match v {
        None => buf.push(0),
        Some(v) => put_varint(buf, v.wrapping_add(1)),
    }
}

/// CRC-32 (IEEE) of `data`.
pub(crate) fn crc32(data: &[u8]) -> u32 {
    crc32fast::hash(data)
}

/// Builds the 12-byte header of a chunk holding `payload`.
pub(crate) fn chunk_header(payload: &[u8]) -> [u8; CHUNK_HEADER_LEN] {
    let mut h = [0u8; CHUNK_HEADER_LEN];
    h[0..4].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    h[4..8].copy_from_slice(&crc32(payload).to_le_bytes());
    let hc = crc32(&h[0..8]);
    h[8..12].copy_from_slice(&hc.to_le_bytes());
    h
}

/// Builds the 12-byte file preamble.
pub(crate) fn preamble() -> [u8; PREAMBLE_LEN] {
    let mut p = [0u8; PREAMBLE_LEN];
    p[0..8].copy_from_slice(&MAGIC);
    p[8..10].copy_from_slice(&FORMAT_MAJOR.to_le_bytes());
    p[10..12].copy_from_slice(&FORMAT_MINOR.to_le_bytes());
    p
}

/// A decoding cursor over one chunk payload; every failure names the offset in the file.
pub(crate) struct Cursor<'a> {
    data: &'a [u8],
    pos: usize,
    base: u64,
}

/// What went wrong while decoding, with the file offset of the offending byte.
#[derive(Debug)]
pub(crate) struct DecodeError {
    pub offset: u64,
    pub what: String,
}

impl<'a> Cursor<'a> {
    /// A cursor over `data`, which starts at file offset `base`.
    pub fn new(data: &'a [u8], base: u64) -> Cursor<'a> {
        Cursor { data, pos: 0, base }
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.pos >= self.data.len()
    }

    pub fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    /// Bytes left in the chunk.
    pub fn remaining(&self) -> usize {
        self.data.len().saturating_sub(self.pos)
    }

    pub fn err(&self, what: impl Into<String>) -> DecodeError {
        DecodeError {
            offset: self.offset(),
            what: what.into(),
        }
    }

    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        let Some(&b) = self.data.get(self.pos) else {
            return Err(self.err("record runs past the end of its chunk"));
        };
        self.pos += 1;
        Ok(b)
    }

    pub fn varint(&mut self) -> Result<u64, DecodeError> {
        let start = self.offset();
        let mut v: u64 = 0;
        let mut shift = 0u32;
        loop {
            let b = self.u8()?;
            if shift == 63 && b > 1 {
                return Err(DecodeError {
                    offset: start,
                    what: "varint overflows 64 bits".into(),
                });
            }
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
            shift += 7;
            if shift > 63 {
                return Err(DecodeError {
                    offset: start,
                    what: "varint longer than 10 bytes".into(),
                });
            }
        }
    }

    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        let start = self.offset();
        let v = self.varint()?;
        u32::try_from(v).map_err(|_| DecodeError {
            offset: start,
            what: format!("value {v} does not fit in 32 bits"),
        })
    }

    pub fn delta(&mut self, base: u64) -> Result<u64, DecodeError> {
        let d = unzigzag(self.varint()?);
        Ok(base.wrapping_add(d as u64))
    }

    pub fn opt(&mut self) -> Result<Option<u64>, DecodeError> {
        let v = self.varint()?;
        Ok(v.checked_sub(1))
    }

    pub fn opt_u32(&mut self) -> Result<Option<u32>, DecodeError> {
        let start = self.offset();
        match self.opt()? {
            None => Ok(None),
            Some(v) => u32::try_from(v).map(Some).map_err(|_| DecodeError {
                offset: start,
                what: format!("value {v} does not fit in 32 bits"),
            }),
        }
    }

    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.data.len() - self.pos < n {
            return Err(self.err(format!("{n}-byte field runs past the end of its chunk")));
        }
        let s = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    pub fn str(&mut self) -> Result<&'a str, DecodeError> {
        let start = self.offset();
        let len = self.varint()?;
        let len = usize::try_from(len)
            .ok()
            .filter(|&l| l <= self.data.len() - self.pos)
            .ok_or_else(|| DecodeError {
                offset: start,
                what: format!("string length {len} runs past the end of its chunk"),
            })?;
        let b = self.bytes(len)?;
        std::str::from_utf8(b).map_err(|_| DecodeError {
            offset: start,
            what: "string is not valid UTF-8".into(),
        })
    }

    pub fn f64(&mut self) -> Result<f64, DecodeError> {
        let b = self.bytes(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(f64::from_le_bytes(a))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varint_and_zigzag_round_trip() {
        let values = [
            0u64,
            1,
            127,
            128,
            300,
            u32::MAX as u64,
            u64::MAX - 1,
            u64::MAX,
        ];
        let mut buf = Vec::new();
        for &v in &values {
            put_varint(&mut buf, v);
        }
        let mut c = Cursor::new(&buf, 0);
        for &v in &values {
            assert_eq!(c.varint().unwrap(), v);
        }
        assert!(c.is_empty());
        for v in [0i64, -1, 1, i64::MIN, i64::MAX, -300] {
            assert_eq!(unzigzag(zigzag(v)), v);
        }
    }

    #[test]
    fn overlong_varint_is_an_error_with_offset() {
        let buf = [0xffu8; 11];
        let mut c = Cursor::new(&buf, 100);
        let e = c.varint().unwrap_err();
        assert_eq!(e.offset, 100);
    }
}
