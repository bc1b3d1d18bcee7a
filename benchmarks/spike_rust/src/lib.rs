//! Spike (issue 24): a zero-dependency scanner of a Kineto / Trace Event Format document that writes the columns
//! distprof reads, for ctypes. Safe Rust only; the input is untrusted: every error is a status, never a panic
//! across the C boundary (`catch_unwind`), nesting is bounded, and the output grows at most linearly with the input.
//!
//! Columns, one row per complete ("X") event: ts, dur (f64), name and cat (u32 ids into one interned table of raw
//! string bytes, escapes left as written: Python unescapes each unique one), track (u32 id of the interned
//! (pid, tid) pair of raw JSON tokens), correlation and External id (i64, -1 when absent or not an int64),
//! stream (u32 id of the raw JSON token, u32::MAX when absent), and the byte span of the args object of events
//! whose args hold collective metadata or input shapes (decoded in Python with msgspec: a few events).
//! Metadata "thread_name" events give (track, name id) pairs.
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

#[derive(Default)]
struct Fx(u64);
impl Hasher for Fx {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut h = self.0;
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let v = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
            h = (h.rotate_left(5) ^ v).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
        for &b in chunks.remainder() {
            h = (h.rotate_left(5) ^ b as u64).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
        self.0 = h;
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}
type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<Fx>>;

const MAX_DEPTH: u32 = 256;
const NONE: u32 = u32::MAX;
pub const FLAG_COMM: u8 = 1; // args hold Process Group Name / Collective name / sizes
pub const FLAG_SHAPES: u8 = 2; // args hold Input Dims

#[derive(Debug)]
struct Bad(usize);

#[derive(Default)]
pub struct Scan {
    status: i32, // 0 ok, 1 malformed JSON (err_at: the byte), 2 not a trace document, 3 internal error
    err_at: u64,
    events: u64, // every event of traceEvents
    broken: u64, // complete or metadata events with a field of the wrong type or out of bounds (skipped)
    ts: Vec<f64>,
    dur: Vec<f64>,
    name: Vec<u32>,
    cat: Vec<u32>,
    track: Vec<u32>,
    corr: Vec<i64>,
    ext: Vec<i64>,
    stream: Vec<u32>,
    flag: Vec<u8>,
    span_row: Vec<u64>, // rows with a flag, and their args' byte span
    span_off: Vec<u64>,
    span_len: Vec<u64>,
    str_blob: Vec<u8>,
    str_off: Vec<u64>, // n + 1 offsets into str_blob
    track_pid: Vec<u32>,
    track_tid: Vec<u32>,
    tn_pid: Vec<u32>,
    tn_tid: Vec<u32>,
    tn_name: Vec<u32>,
    name_str: Vec<u32>, // complete events' names in first-seen order: their string ids (the name column's ids)
    track_map: FxMap<(u32, u32), u32>,
    name_map: FxMap<u32, u32>,
}

struct P<'a> {
    b: &'a [u8],
    i: usize,
}

#[inline]
fn is_ws(c: u8) -> bool {
    c == b' ' || c == b'\n' || c == b'\r' || c == b'\t'
}

const POW10: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19,
    1e20, 1e21, 1e22,
];

impl<'a> P<'a> {
    #[inline]
    fn ws(&mut self) {
        while self.i < self.b.len() && is_ws(self.b[self.i]) {
            self.i += 1;
        }
    }
    #[inline]
    fn peek(&mut self) -> Result<u8, Bad> {
        self.ws();
        self.b.get(self.i).copied().ok_or(Bad(self.i))
    }
    #[inline]
    fn expect(&mut self, c: u8) -> Result<(), Bad> {
        if self.peek()? == c {
            self.i += 1;
            Ok(())
        } else {
            Err(Bad(self.i))
        }
    }
    /// A string at i (after whitespace): the span inside the quotes and whether it has escapes. Eight bytes at a
    /// time while none is a quote, a backslash, a control character or non-ASCII (then byte by byte).
    fn string(&mut self) -> Result<(usize, usize, bool), Bad> {
        self.expect(b'"')?;
        let start = self.i;
        let b = self.b;
        let mut esc = false;
        let mut high = false;
        let mut i = self.i;
        const ONES: u64 = 0x0101_0101_0101_0101;
        const HIGH: u64 = 0x8080_8080_8080_8080;
        loop {
            if let Some(w) = b.get(i..i + 8) {
                let v = u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
                let q = v ^ (ONES * b'"' as u64);
                let bs = v ^ (ONES * b'\\' as u64);
                let m = (q.wrapping_sub(ONES) & !q) | (bs.wrapping_sub(ONES) & !bs) | (v.wrapping_sub(ONES * 0x20) & !v)
                    | v;
                let m = m & HIGH;
                if m == 0 {
                    i += 8;
                    continue;
                }
                i += (m.trailing_zeros() / 8) as usize; // the first flagged byte (exact: borrows only go up)
            }
            let c = *b.get(i).ok_or(Bad(i))?;
            if c == b'"' {
                break;
            } else if c == b'\\' {
                esc = true;
                let e = *b.get(i + 1).ok_or(Bad(i))?;
                match e {
                    b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => i += 2,
                    b'u' => {
                        let h = b.get(i + 2..i + 6).ok_or(Bad(i))?;
                        if !h.iter().all(|x| x.is_ascii_hexdigit()) {
                            return Err(Bad(i));
                        }
                        i += 6;
                    }
                    _ => return Err(Bad(i)),
                }
            } else if c < 0x20 {
                return Err(Bad(i));
            } else {
                high |= c >= 0x80;
                i += 1;
            }
        }
        if high && std::str::from_utf8(&b[start..i]).is_err() {
            return Err(Bad(start));
        }
        self.i = i + 1;
        Ok((start, i, esc))
    }
    /// A number's span (JSON grammar checked) and whether it is an integer.
    fn number(&mut self) -> Result<(usize, usize, bool), Bad> {
        self.ws();
        let b = self.b;
        let start = self.i;
        let mut i = start;
        if b.get(i) == Some(&b'-') {
            i += 1;
        }
        match b.get(i) {
            Some(b'0') => i += 1,
            Some(c) if c.is_ascii_digit() => {
                while i < b.len() && b[i].is_ascii_digit() {
                    i += 1
                }
            }
            _ => return Err(Bad(i)),
        }
        let mut int = true;
        if b.get(i) == Some(&b'.') {
            int = false;
            i += 1;
            let d = i;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1
            }
            if i == d {
                return Err(Bad(i));
            }
        }
        if matches!(b.get(i), Some(b'e') | Some(b'E')) {
            int = false;
            i += 1;
            if matches!(b.get(i), Some(b'+') | Some(b'-')) {
                i += 1;
            }
            let d = i;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1
            }
            if i == d {
                return Err(Bad(i));
            }
        }
        self.i = i;
        Ok((start, i, int))
    }
    /// A number as f64, parsed while it is checked: up to 19 digits, a mantissa of at most 2^53 and no exponent
    /// is exact (Clinger: the quotient of two exact doubles is correctly rounded); anything else is re-read by the
    /// standard library's parser.
    fn f64(&mut self) -> Result<f64, Bad> {
        self.ws();
        let b = self.b;
        let start = self.i;
        let mut i = start;
        let neg = b.get(i) == Some(&b'-');
        if neg {
            i += 1;
        }
        let d0 = i;
        let mut m: u64 = 0;
        while let Some(&c) = b.get(i) {
            if !c.is_ascii_digit() {
                break;
            }
            m = m.wrapping_mul(10).wrapping_add((c - b'0') as u64);
            i += 1;
        }
        let int_digits = i - d0;
        if int_digits == 0 || (int_digits > 1 && b[d0] == b'0') {
            return Err(Bad(i));
        }
        let mut frac = 0usize;
        if b.get(i) == Some(&b'.') {
            i += 1;
            let f0 = i;
            while let Some(&c) = b.get(i) {
                if !c.is_ascii_digit() {
                    break;
                }
                m = m.wrapping_mul(10).wrapping_add((c - b'0') as u64);
                i += 1;
            }
            frac = i - f0;
            if frac == 0 {
                return Err(Bad(i));
            }
        }
        if matches!(b.get(i), Some(b'e') | Some(b'E')) || int_digits + frac > 19 || m > (1u64 << 53)
            || frac >= POW10.len()
        {
            let (s, e, _) = self.number()?; // (from the start again: checks the exponent, then the slow parse)
            return parse_f64(&b[s..e]).ok_or(Bad(s));
        }
        self.i = i;
        let v = m as f64 / POW10[frac];
        Ok(if neg { -v } else { v })
    }
    fn lit(&mut self, w: &[u8]) -> Result<(), Bad> {
        if self.b.get(self.i..self.i + w.len()) == Some(w) {
            self.i += w.len();
            Ok(())
        } else {
            Err(Bad(self.i))
        }
    }
    fn skip(&mut self, depth: u32) -> Result<(), Bad> {
        if depth > MAX_DEPTH {
            return Err(Bad(self.i));
        }
        match self.peek()? {
            b'"' => self.string().map(|_| ()),
            b'{' => {
                self.i += 1;
                if self.peek()? == b'}' {
                    self.i += 1;
                    return Ok(());
                }
                loop {
                    self.string()?;
                    self.expect(b':')?;
                    self.skip(depth + 1)?;
                    match self.peek()? {
                        b',' => self.i += 1,
                        b'}' => {
                            self.i += 1;
                            return Ok(());
                        }
                        _ => return Err(Bad(self.i)),
                    }
                }
            }
            b'[' => {
                self.i += 1;
                if self.peek()? == b']' {
                    self.i += 1;
                    return Ok(());
                }
                loop {
                    self.skip(depth + 1)?;
                    match self.peek()? {
                        b',' => self.i += 1,
                        b']' => {
                            self.i += 1;
                            return Ok(());
                        }
                        _ => return Err(Bad(self.i)),
                    }
                }
            }
            b't' => self.lit(b"true"),
            b'f' => self.lit(b"false"),
            b'n' => self.lit(b"null"),
            _ => self.number().map(|_| ()),
        }
    }
    /// A value's raw token (a number or a string with its quotes); None for any other kind (skipped).
    fn token(&mut self) -> Result<Option<(usize, usize)>, Bad> {
        match self.peek()? {
            b'"' => {
                let s = self.i;
                self.string()?;
                Ok(Some((s, self.i)))
            }
            b'-' | b'0'..=b'9' => {
                let (s, e, _) = self.number()?;
                Ok(Some((s, e)))
            }
            _ => self.skip(1).map(|_| None),
        }
    }
    /// An int64 (-1 for any other value, which is skipped).
    fn i64_or(&mut self) -> Result<i64, Bad> {
        match self.peek()? {
            b'-' | b'0'..=b'9' => {
                let (s, e, int) = self.number()?;
                if !int {
                    return Ok(-1);
                }
                Ok(parse_i64(&self.b[s..e]).unwrap_or(-1))
            }
            _ => self.skip(1).map(|_| -1),
        }
    }
}

/// An integer token (checked by `number`) as i64; None when it has a fraction or exponent or overflows.
#[inline]
fn parse_i64(t: &[u8]) -> Option<i64> {
    let (neg, d) = if t.first() == Some(&b'-') { (true, &t[1..]) } else { (false, t) };
    let mut v: i64 = 0;
    for &c in d {
        if !c.is_ascii_digit() {
            return None;
        }
        let x = (c - b'0') as i64;
        // accumulate negatively: i64::MIN has no positive counterpart
        v = v.checked_mul(10)?.checked_sub(x)?;
    }
    if neg { Some(v) } else { v.checked_neg() }
}

/// Fast path (Clinger): at most 15 significant digits and no exponent give an exact mantissa and power of ten,
/// whose quotient is correctly rounded; everything else goes to the standard library's parser.
fn parse_f64(t: &[u8]) -> Option<f64> {
    let (neg, d) = if t.first() == Some(&b'-') { (true, &t[1..]) } else { (false, t) };
    let mut m: u64 = 0;
    let mut digits = 0u32;
    let mut frac = 0usize;
    let mut seen_dot = false;
    let mut fast = true;
    for &c in d {
        if c.is_ascii_digit() {
            if m != 0 || c != b'0' {
                digits += 1;
            }
            m = m.wrapping_mul(10).wrapping_add((c - b'0') as u64);
            if seen_dot {
                frac += 1;
            }
        } else if c == b'.' {
            seen_dot = true;
        } else {
            fast = false;
            break;
        }
    }
    if fast && digits <= 19 && m <= (1u64 << 53) && frac < POW10.len() {
        let v = m as f64 / POW10[frac];
        return Some(if neg { -v } else { v });
    }
    std::str::from_utf8(t).ok()?.parse::<f64>().ok()
}

#[derive(Default)]
struct Interner<'a> {
    ids: FxMap<&'a [u8], u32>,
    blob: Vec<u8>,
    off: Vec<u64>,
    last: [(&'a [u8], u32); 3], // the last pid, tid and cat: consecutive events mostly repeat them
}
impl<'a> Interner<'a> {
    #[inline]
    fn cached(&mut self, slot: usize, s: &'a [u8]) -> u32 {
        let (k, v) = self.last[slot];
        if v != NONE && k == s {
            return v;
        }
        let v = self.id(s);
        self.last[slot] = (s, v);
        v
    }
    #[inline]
    fn id(&mut self, s: &'a [u8]) -> u32 {
        if let Some(&v) = self.ids.get(s) {
            return v;
        }
        let v = self.off.len() as u32;
        self.off.push(self.blob.len() as u64);
        self.blob.extend_from_slice(s);
        self.ids.insert(s, v);
        v
    }
}

/// A key's code by `f` (the key unescaped into `buf` only when it has escapes).
#[inline]
fn key<F: Fn(&[u8]) -> u8>(p: &mut P, buf: &mut Vec<u8>, f: F) -> Result<u8, Bad> {
    let (s, e, esc) = p.string()?;
    if !esc {
        return Ok(f(&p.b[s..e]));
    }
    buf.clear();
    unescape(&p.b[s..e], buf).ok_or(Bad(s))?;
    Ok(f(&buf[..]))
}

fn unescape(s: &[u8], out: &mut Vec<u8>) -> Option<()> {
    let mut i = 0;
    while i < s.len() {
        if s[i] != b'\\' {
            out.push(s[i]);
            i += 1;
            continue;
        }
        let e = s[i + 1];
        i += 2;
        let c = match e {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            _ => {
                let h = u32::from_str_radix(std::str::from_utf8(&s[i..i + 4]).ok()?, 16).ok()?;
                i += 4;
                if (0xD800..0xDC00).contains(&h) && s.get(i..i + 2) == Some(b"\\u") {
                    let l = u32::from_str_radix(std::str::from_utf8(s.get(i + 2..i + 6)?).ok()?, 16).ok()?;
                    i += 6;
                    char::from_u32(0x10000 + ((h - 0xD800) << 10) + (l.wrapping_sub(0xDC00) & 0x3FF))
                        .unwrap_or('\u{fffd}')
                } else {
                    char::from_u32(h).unwrap_or('\u{fffd}')
                }
            }
        };
        let mut tmp = [0u8; 4];
        out.extend_from_slice(c.encode_utf8(&mut tmp).as_bytes());
    }
    Some(())
}

struct Ev {
    ph: u8, // b'X', b'M', 0 other
    name: Option<(usize, usize)>,
    cat: Option<(usize, usize)>,
    pid: Option<(usize, usize)>,
    tid: Option<(usize, usize)>,
    ts: f64,
    dur: f64,
    corr: i64,
    ext: i64,
    stream: Option<(usize, usize)>,
    flag: u8,
    args: (usize, usize),
    tn: Option<(usize, usize)>, // args.name (metadata events)
    bad_x: bool,                // cat, ts or dur so (only complete events have them)
    bad: bool,                  // a field of the wrong type or out of bounds: a broken event, skipped and counted
}

fn args(p: &mut P, ev: &mut Ev, buf: &mut Vec<u8>) -> Result<(), Bad> {
    if p.peek()? != b'{' {
        return p.skip(1);
    }
    let start = p.i;
    p.i += 1;
    if p.peek()? == b'}' {
        p.i += 1;
        ev.args = (start, p.i);
        return Ok(());
    }
    loop {
        let which = key(p, buf, |k| match k {
            b"correlation" => 1,
            b"External id" => 2,
            b"stream" => 3,
            b"name" => 4,
            b"Process Group Name" | b"Collective name" | b"In msg nelems" | b"Out msg nelems" | b"dtype"
            | b"Group size" | b"Process Group Ranks" | b"Process Group Description" | b"Seq" => 5,
            b"Input Dims" => 6,
            _ => 0,
        })?;
        p.expect(b':')?;
        match which {
            1 => ev.corr = p.i64_or()?,
            2 => ev.ext = p.i64_or()?,
            3 => ev.stream = p.token()?,
            4 => {
                if p.peek()? == b'"' {
                    let (s, e, _) = p.string()?;
                    ev.tn = Some((s, e));
                } else {
                    p.skip(1)?;
                }
            }
            5 => {
                ev.flag |= FLAG_COMM;
                p.skip(1)?
            }
            6 => {
                ev.flag |= FLAG_SHAPES;
                p.skip(1)?
            }
            _ => p.skip(1)?,
        }
        match p.peek()? {
            b',' => p.i += 1,
            b'}' => {
                p.i += 1;
                ev.args = (start, p.i);
                return Ok(());
            }
            _ => return Err(Bad(p.i)),
        }
    }
}

fn event(p: &mut P, buf: &mut Vec<u8>) -> Result<Option<Ev>, Bad> {
    if p.peek()? != b'{' {
        p.skip(1)?; // not an object: not an event (counted by the caller)
        return Ok(None);
    }
    p.i += 1;
    let mut ev = Ev {
        ph: 0, name: None, cat: None, pid: None, tid: None, ts: 0.0, dur: 0.0, corr: -1, ext: -1, stream: None,
        flag: 0, args: (0, 0), tn: None, bad_x: false, bad: false,
    };
    if p.peek()? == b'}' {
        p.i += 1;
        return Ok(Some(ev));
    }
    loop {
        let which = key(p, buf, |k| match k {
            b"ph" => 1,
            b"name" => 2,
            b"cat" => 3,
            b"pid" => 4,
            b"tid" => 5,
            b"ts" => 6,
            b"dur" => 7,
            b"args" => 8,
            _ => 0,
        })?;
        p.expect(b':')?;
        let c = p.peek()?;
        let is_str = c == b'"';
        let is_num = c == b'-' || c.is_ascii_digit();
        match which {
            1 | 2 if !is_str => {
                ev.bad = true;
                p.skip(1)?
            }
            3 if !is_str => {
                ev.bad_x = true;
                p.skip(1)?
            }
            1 => {
                let (s, e, _) = p.string()?;
                ev.ph = match &p.b[s..e] {
                    b"X" => b'X',
                    b"M" => b'M',
                    _ => 0,
                };
            }
            2 | 3 => {
                let (s, e, _) = p.string()?;
                if which == 2 { ev.name = Some((s, e)) } else { ev.cat = Some((s, e)) }
            }
            4 | 5 => {
                let t = p.token()?;
                // an int64 or a string (msgspec's Int64 | str): anything else breaks the event
                let ok = match t {
                    Some((s, e)) if is_num => parse_i64(&p.b[s..e]).is_some(),
                    Some(_) => true,
                    None => false,
                };
                ev.bad |= !ok;
                if which == 4 { ev.pid = t } else { ev.tid = t }
            }
            6 | 7 if !is_num => {
                ev.bad_x = true;
                p.skip(1)?
            }
            6 => {
                ev.ts = p.f64()?;
                ev.bad_x |= !(-9e15..=9e15).contains(&ev.ts);
            }
            7 => {
                ev.dur = p.f64()?;
                ev.bad_x |= !(0.0..=9e15).contains(&ev.dur);
            }
            8 => args(p, &mut ev, buf)?,
            _ => p.skip(1)?,
        }
        match p.peek()? {
            b',' => p.i += 1,
            b'}' => {
                p.i += 1;
                return Ok(Some(ev));
            }
            _ => return Err(Bad(p.i)),
        }
    }
}

const ZERO: &[u8] = b"0";

fn scan_into<'a>(b: &'a [u8], out: &mut Scan, strs: &mut Interner<'a>) -> Result<(), (i32, usize)> {
    let mut p = P { b, i: 0 };
    let mut buf = Vec::new();
    let e = |x: Bad| (1, x.0);
    let mut found = false;
    p.expect(b'{').map_err(|_| (2, 0usize))?;
    if p.peek().map_err(e)? == b'}' {
        p.i += 1;
    } else {
        loop {
            let is_events = key(&mut p, &mut buf, |k| (k == b"traceEvents") as u8).map_err(e)? == 1;
            p.expect(b':').map_err(e)?;
            if is_events && p.peek().map_err(e)? == b'[' {
                found = true;
                p.i += 1;
                if p.peek().map_err(e)? == b']' {
                    p.i += 1;
                } else {
                    loop {
                        out.events += 1;
                        if let Some(ev) = event(&mut p, &mut buf).map_err(e)? {
                            push(&mut p, ev, out, strs);
                        }
                        match p.peek().map_err(e)? {
                            b',' => p.i += 1,
                            b']' => {
                                p.i += 1;
                                break;
                            }
                            _ => return Err((1, p.i)),
                        }
                    }
                }
            } else {
                p.skip(1).map_err(e)?;
            }
            match p.peek().map_err(e)? {
                b',' => p.i += 1,
                b'}' => {
                    p.i += 1;
                    break;
                }
                _ => return Err((1, p.i)),
            }
        }
    }
    p.ws();
    if p.i != b.len() {
        return Err((1, p.i));
    }
    if !found {
        return Err((2, 0));
    }
    Ok(())
}

fn name_sid<'a>(strs: &mut Interner<'a>, ev: &Ev, b: &'a [u8]) -> u32 {
    strs.id(ev.name.map_or(&b""[..], |(s, e)| &b[s..e]))
}

/// One complete event's row (ids of names and tracks dense, first seen first), or a thread name.
fn push<'a>(p: &mut P<'a>, ev: Ev, out: &mut Scan, strs: &mut Interner<'a>) {
    let b: &'a [u8] = p.b;
    if ev.ph != b'X' && ev.ph != b'M' {
        return;
    }
    if ev.bad || (ev.ph == b'X' && ev.bad_x) {
        out.broken += 1;
        return;
    }
    let pid = strs.cached(0, ev.pid.map_or(ZERO, |(s, e)| &b[s..e]));
    let tid = strs.cached(1, ev.tid.map_or(ZERO, |(s, e)| &b[s..e]));
    let name = strs.id(ev.name.map_or(&b""[..], |(s, e)| &b[s..e]));
    if ev.ph == b'M' {
        if &b[ev.name.map_or(0, |x| x.0)..ev.name.map_or(0, |x| x.1)] == b"thread_name" {
            if let Some((s, e)) = ev.tn {
                out.tn_pid.push(pid);
                out.tn_tid.push(tid);
                out.tn_name.push(strs.id(&b[s..e]));
            }
        }
        return;
    }
    let n = out.track_map.len() as u32;
    let track = *out.track_map.entry((pid, tid)).or_insert(n);
    if track == n {
        out.track_pid.push(pid);
        out.track_tid.push(tid);
    }
    let n = out.name_map.len() as u32;
    let name = *out.name_map.entry(name).or_insert(n);
    if name == n {
        out.name_str.push(name_sid(strs, &ev, b));
    }
    let row = out.ts.len() as u64;
    out.ts.push(ev.ts);
    out.dur.push(ev.dur);
    out.name.push(name);
    out.cat.push(strs.cached(2, ev.cat.map_or(&b""[..], |(s, e)| &b[s..e])));
    out.track.push(track);
    out.corr.push(ev.corr);
    out.ext.push(ev.ext);
    out.stream.push(ev.stream.map_or(NONE, |(s, e)| strs.id(&b[s..e])));
    out.flag.push(ev.flag);
    if ev.flag != 0 {
        out.span_row.push(row);
        out.span_off.push(ev.args.0 as u64);
        out.span_len.push((ev.args.1 - ev.args.0) as u64);
    }
}

fn scan(b: &[u8]) -> Scan {
    let mut out = Scan::default();
    let mut strs = Interner { last: [(&b""[..], NONE); 3], ..Interner::default() };
    if let Err((st, at)) = scan_into(b, &mut out, &mut strs) {
        return Scan { status: st, err_at: at as u64, ..Scan::default() };
    }
    strs.off.push(strs.blob.len() as u64);
    out.str_blob = strs.blob;
    out.str_off = strs.off;
    out
}

/// Scan `len` bytes at `data`; always returns a handle (free it with dp_free), whose status says how it went.
///
/// # Safety
/// `data` must point to `len` readable bytes (or be null with len 0).
#[no_mangle]
pub unsafe extern "C" fn dp_scan(data: *const u8, len: usize) -> *mut Scan {
    let b: &[u8] = if data.is_null() || len == 0 { &[] } else { std::slice::from_raw_parts(data, len) };
    let s = std::panic::catch_unwind(|| scan(b)).unwrap_or(Scan { status: 3, ..Scan::default() });
    Box::into_raw(Box::new(s))
}

/// # Safety
/// `h` must come from dp_scan and not be freed.
#[no_mangle]
pub unsafe extern "C" fn dp_info(h: *const Scan, which: u32) -> u64 {
    let s = &*h;
    match which {
        0 => s.status as u64,
        1 => s.err_at,
        2 => s.events,
        3 => s.broken,
        _ => 0,
    }
}

/// Column `which`'s address and (through `n`) its length in elements.
///
/// # Safety
/// `h` must come from dp_scan and not be freed; `n` must be writable.
#[no_mangle]
pub unsafe extern "C" fn dp_column(h: *const Scan, which: u32, n: *mut u64) -> *const u8 {
    let s = &*h;
    macro_rules! col {
        ($v:expr) => {{
            *n = $v.len() as u64;
            $v.as_ptr() as *const u8
        }};
    }
    match which {
        0 => col!(s.ts),
        1 => col!(s.dur),
        2 => col!(s.name),
        3 => col!(s.cat),
        4 => col!(s.track),
        5 => col!(s.corr),
        6 => col!(s.ext),
        7 => col!(s.stream),
        8 => col!(s.flag),
        9 => col!(s.span_row),
        10 => col!(s.span_off),
        11 => col!(s.span_len),
        12 => col!(s.str_blob),
        13 => col!(s.str_off),
        14 => col!(s.track_pid),
        15 => col!(s.track_tid),
        16 => col!(s.tn_pid),
        17 => col!(s.tn_name),
        18 => col!(s.tn_tid),
        19 => col!(s.name_str),
        _ => {
            *n = 0;
            std::ptr::null()
        }
    }
}

/// # Safety
/// `h` must come from dp_scan, freed once.
#[no_mangle]
pub unsafe extern "C" fn dp_free(h: *mut Scan) {
    if !h.is_null() {
        drop(Box::from_raw(h));
    }
}
