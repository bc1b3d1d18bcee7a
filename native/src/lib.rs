//! distprof's native decoder (issue 24): a zero-dependency scanner of a **run** of Trace Event Format events (the
//! JSON list `[{...},{...}]` that `distprof.trace.columns.reduce_run` takes) that writes the columns distprof
//! reads, for ctypes (`distprof.trace.native` turns them into a `Columns`).
//!
//! The contract: where the scanner answers (status 0), its columns are the ones the Python path (msgspec's lean
//! events, then `Columns.add`) builds from the same bytes; anywhere it is not sure, it says so (status 1) and the
//! Python path reads the run, which is also what decides whether the run decodes at all. So the scanner is
//! strict: a run that is not valid UTF-8, not a list of objects, an event whose `ph` is missing, escaped or of a
//! phase the lean events do not know, a key of an event written with escapes or given twice, a field the lean
//! event types of the wrong type or out of bounds, a `\u` escape of a surrogate, nesting over 256 levels: status 1.
//!
//! Safe Rust only; the input is untrusted: every error is a status, never a panic across the C boundary
//! (`catch_unwind`), nesting is bounded, and the output grows at most linearly with the input.
//!
//! Columns, one row per complete ("X") event: ts, dur (f64); name and cat (u32 ids into their own tables of raw
//! string bytes, escapes as written: Python unescapes each unique one); track (u32 id of the interned pair of the
//! pid and tid tokens, raw JSON, a string's with its quotes); correlation and External id (i64, -1 when absent or
//! null); the stream (`skind`: 0 absent or null, 1 an int64 in `sval`, 2 a string whose token id is `sval`, 3 the
//! args need msgspec: not an object, a field of the wrong type, escaped or repeated keys, collective metadata);
//! the byte span of the args value (`aoff`, `alen`; 0, 0 when absent). Metadata `thread_name` events give
//! (pid token, tid token, args span); `[memory]` instant events (ts, args span).
use std::collections::hash_map::RandomState;
use std::collections::HashMap;

/// A column's address for ctypes, its length in elements written through `n` (a raw pointer the caller checked).
macro_rules! col {
    ($n:expr, $v:expr) => {{
        *$n = $v.len() as u64;
        $v.as_ptr() as *const u8
    }};
}

mod merge;

/// The version of this C ABI (`dp_abi_version`): `distprof.trace.nativelib.ABI` must equal it.
pub const ABI: u32 = 4;

/// The interning maps hash with the standard library's randomly seeded SipHash: names, threads and streams come
/// from untrusted input, and a fixed hash lets crafted keys collide (a run of 144,000 names that differ in their
/// last bytes took 4.4 s against 0.2 s on the Python path with the first, unseeded hasher).
type FxMap<K, V> = HashMap<K, V, RandomState>;

const MAX_DEPTH: u32 = 256;
const NONE: u32 = u32::MAX;

/// Not sure: the byte where the scanner stopped (the Python path reads the run).
#[derive(Debug)]
struct Unsure(usize);
type R<T> = Result<T, Unsure>;

/// One table of interned strings: ids in first-seen order, the bytes in one blob with n + 1 offsets.
#[derive(Default)]
struct Table<'a> {
    ids: FxMap<&'a [u8], u32>,
    blob: Vec<u8>,
    off: Vec<u64>,
    last: (&'a [u8], u32), // the last one asked for: consecutive events mostly repeat it
}
impl<'a> Table<'a> {
    fn new() -> Self {
        Table { last: (&b""[..], NONE), ..Table::default() }
    }
    #[inline]
    fn id(&mut self, s: &'a [u8]) -> u32 {
        if self.last.1 != NONE && self.last.0 == s {
            return self.last.1;
        }
        let v = match self.ids.get(s) {
            Some(&v) => v,
            None => {
                let v = self.off.len() as u32;
                self.off.push(self.blob.len() as u64);
                self.blob.extend_from_slice(s);
                self.ids.insert(s, v);
                v
            }
        };
        self.last = (s, v);
        v
    }
    fn finish(&mut self) {
        self.off.push(self.blob.len() as u64);
    }
}

/// A scanned run: its status and columns (see the crate's documentation).
#[derive(Default)]
pub struct Run {
    status: u32, // 0 answered, 1 not sure (err_at: the byte), 2 internal error
    err_at: u64,
    events: u64,
    ts: Vec<f64>,
    dur: Vec<f64>,
    name: Vec<u32>,
    cat: Vec<u32>,
    track: Vec<u32>,
    corr: Vec<i64>,
    ext: Vec<i64>,
    skind: Vec<u8>,
    sval: Vec<i64>,
    aoff: Vec<u64>,
    alen: Vec<u64>,
    track_pid: Vec<u32>,
    track_tid: Vec<u32>,
    tn_pid: Vec<u32>,
    tn_tid: Vec<u32>,
    tn_off: Vec<u64>,
    tn_len: Vec<u64>,
    mem_ts: Vec<f64>,
    mem_off: Vec<u64>,
    mem_len: Vec<u64>,
    tables: [(Vec<u8>, Vec<u64>); 3], // names, cats, tokens
    // What merge's first pass reads (`distprof.analysis.merge_scan`): where its own decoding of an event would
    // differ (a timed event's ts, or any event's tid, of the wrong type or out of bounds; an empty ph), m_bad is
    // set and merge reads the run itself. The verbs' columns above do not depend on these.
    m_bad: u8,
    m_first: f64,   // the smallest ts of the timed phases (X and TIMED), +inf when none
    m_max_tid: i64, // the largest int tid of any event, at least 0
    pn_pid: Vec<u32>, // metadata process_name events: pid token, args span
    pn_off: Vec<u64>,
    pn_len: Vec<u64>,
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

/// A string's span inside its quotes and whether it has escapes.
type Str = (usize, usize, bool);

impl<'a> P<'a> {
    #[inline]
    fn ws(&mut self) {
        while self.i < self.b.len() && is_ws(self.b[self.i]) {
            self.i += 1;
        }
    }
    #[inline]
    fn peek(&mut self) -> R<u8> {
        self.ws();
        self.b.get(self.i).copied().ok_or(Unsure(self.i))
    }
    #[inline]
    fn expect(&mut self, c: u8) -> R<()> {
        if self.peek()? == c {
            self.i += 1;
            Ok(())
        } else {
            Err(Unsure(self.i))
        }
    }
    /// A string at i (after whitespace). Eight bytes at a time while none is a quote, a backslash, a control
    /// character or non-ASCII (then byte by byte; the run was checked to be UTF-8 as a whole). An escape of a
    /// surrogate is not sure (msgspec refuses a lone one; pairs are left to it too).
    fn string(&mut self) -> R<Str> {
        self.expect(b'"')?;
        let start = self.i;
        let b = self.b;
        let mut esc = false;
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
            let c = *b.get(i).ok_or(Unsure(i))?;
            if c == b'"' {
                break;
            } else if c == b'\\' {
                esc = true;
                let e = *b.get(i + 1).ok_or(Unsure(i))?;
                match e {
                    b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => i += 2,
                    b'u' => {
                        let h = b.get(i + 2..i + 6).ok_or(Unsure(i))?;
                        if !h.iter().all(|x| x.is_ascii_hexdigit()) {
                            return Err(Unsure(i));
                        }
                        let cp = hex4(h);
                        if (0xDC00..0xE000).contains(&cp) {
                            return Err(Unsure(i)); // a low surrogate first: msgspec refuses the run
                        }
                        if (0xD800..0xDC00).contains(&cp) {
                            // a high surrogate must come with its low one (one code point beyond the BMP, as
                            // json.dumps writes it); alone, msgspec refuses the run
                            let l = b.get(i + 6..i + 12).ok_or(Unsure(i))?;
                            if &l[..2] != b"\\u" || !l[2..].iter().all(|x| x.is_ascii_hexdigit())
                                || !(0xDC00..0xE000).contains(&hex4(&l[2..]))
                            {
                                return Err(Unsure(i));
                            }
                            i += 6;
                        }
                        i += 6;
                    }
                    _ => return Err(Unsure(i)),
                }
            } else if c < 0x20 {
                return Err(Unsure(i));
            } else {
                i += 1;
            }
        }
        self.i = i + 1;
        Ok((start, i, esc))
    }
    /// A number's span (JSON grammar checked) and whether it is an integer (no fraction, no exponent).
    fn number(&mut self) -> R<(usize, usize, bool)> {
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
            _ => return Err(Unsure(i)),
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
                return Err(Unsure(i));
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
                return Err(Unsure(i));
            }
        }
        self.i = i;
        Ok((start, i, int))
    }
    fn lit(&mut self, w: &[u8]) -> R<()> {
        if self.b.get(self.i..self.i + w.len()) == Some(w) {
            self.i += w.len();
            Ok(())
        } else {
            Err(Unsure(self.i))
        }
    }
    /// The members of an object at i (after whitespace): `member` gets each key (its span inside the quotes and
    /// whether it has escapes) after the `:` and reads the value; i ends after the `}`.
    #[inline]
    fn members(&mut self, mut member: impl FnMut(&mut Self, Str) -> R<()>) -> R<()> {
        self.expect(b'{')?;
        if self.peek()? == b'}' {
            self.i += 1;
            return Ok(());
        }
        loop {
            let key = self.string()?;
            self.expect(b':')?;
            member(self, key)?;
            match self.peek()? {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    return Ok(());
                }
                _ => return Err(Unsure(self.i)),
            }
        }
    }
    /// Any value, checked and skipped.
    fn skip(&mut self, depth: u32) -> R<()> {
        if depth > MAX_DEPTH {
            return Err(Unsure(self.i));
        }
        match self.peek()? {
            b'"' => self.string().map(|_| ()),
            b'{' => self.members(|p, _| p.skip(depth + 1)),
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
                        _ => return Err(Unsure(self.i)),
                    }
                }
            }
            b't' => self.lit(b"true"),
            b'f' => self.lit(b"false"),
            b'n' => self.lit(b"null"),
            _ => self.number().map(|_| ()),
        }
    }
}

/// Four hex digits (checked by the caller) as a number.
#[inline]
fn hex4(h: &[u8]) -> u32 {
    h.iter().take(4).fold(0, |v, &x| (v << 4) | (x as char).to_digit(16).unwrap_or(0))
}

/// An integer token (checked by `number`) as i64; None when it overflows.
#[inline]
fn parse_i64(t: &[u8]) -> Option<i64> {
    let (neg, d) = if t.first() == Some(&b'-') { (true, &t[1..]) } else { (false, t) };
    let mut v: i64 = 0;
    for &c in d {
        if !c.is_ascii_digit() {
            return None;
        }
        // accumulate negatively: i64::MIN has no positive counterpart
        v = v.checked_mul(10)?.checked_sub((c - b'0') as i64)?;
    }
    if neg { Some(v) } else { v.checked_neg() }
}

/// A number token (checked by `number`) as msgspec makes it a float: correctly rounded; an integer literal is
/// an int first, so `-0` is 0.0, not -0.0. Fast path (Clinger): at most 19 digits with a mantissa of at most 2^53
/// and no exponent give an exact mantissa and power of ten, whose quotient is correctly rounded.
fn parse_f64(t: &[u8], int: bool) -> Option<f64> {
    let (neg, d) = if t.first() == Some(&b'-') { (true, &t[1..]) } else { (false, t) };
    let mut m: u64 = 0;
    let mut digits = 0u32;
    let mut frac = 0usize;
    let mut seen_dot = false;
    let mut fast = true;
    for &c in d {
        if c.is_ascii_digit() {
            digits += 1;
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
    let v = if fast && digits <= 19 && m <= (1u64 << 53) && frac < POW10.len() {
        m as f64 / POW10[frac]
    } else {
        std::str::from_utf8(d).ok()?.parse::<f64>().ok()?
    };
    Some(if neg && !(int && v == 0.0) { -v } else { v })
}

/// What an event's value was, for the checks its phase makes at the end.
#[derive(Clone, Copy, PartialEq)]
enum V {
    Absent,
    Str(usize, usize, bool),
    Int(usize, usize), // an integer that fits int64
    Num(f64),          // any other number, as a float (bounds checked by the phase)
    Other,
}

/// What the args object of a complete event says of its links.
struct Args {
    span: (usize, usize),
    corr: i64,
    ext: i64,
    skind: u8,
    sval: (usize, usize), // a stream's int or string token
}

const ARGS_PY: u8 = 3;

/// An int64 or null in args (-1 for null); None: anything else (the args then need msgspec).
fn arg_int(p: &mut P) -> R<Option<i64>> {
    match p.peek()? {
        b'n' => p.lit(b"null").map(|_| Some(-1)),
        b'-' | b'0'..=b'9' => {
            let (s, e, int) = p.number()?;
            Ok(if int { parse_i64(&p.b[s..e]) } else { None })
        }
        _ => p.skip(1).map(|_| None),
    }
}

/// The args value of a complete event: the links read where they are plain, else `skind` ARGS_PY.
fn args(p: &mut P) -> R<Args> {
    let start = {
        p.ws();
        p.i
    };
    let mut a = Args { span: (start, start), corr: -1, ext: -1, skind: 0, sval: (0, 0) };
    if p.peek()? != b'{' {
        p.skip(1)?;
        a.span.1 = p.i;
        a.skind = ARGS_PY;
        return Ok(a);
    }
    let mut seen = 0u8;
    p.members(|p, (s, e, esc)| {
        let which = if esc {
            0xff
        } else {
            match &p.b[s..e] {
                b"correlation" => 1,
                b"External id" => 2,
                b"stream" => 4,
                b"Process Group Name" | b"Collective name" | b"In msg nelems" | b"Out msg nelems" | b"dtype"
                | b"Group size" | b"Process Group Ranks" | b"Process Group Description" | b"Seq"
                | b"In split size" | b"Out split size" => 0xff,
                _ => 0,
            }
        };
        if which == 0xff || seen & which != 0 {
            a.skind = ARGS_PY; // escaped or repeated keys, collective metadata: msgspec decides
        }
        seen |= which;
        match which {
            1 | 2 => match arg_int(p)? {
                Some(v) => {
                    if which == 1 { a.corr = v } else { a.ext = v }
                }
                None => a.skind = ARGS_PY,
            },
            4 => match p.peek()? {
                b'n' => p.lit(b"null")?,
                b'"' => {
                    let s = p.i;
                    p.string()?;
                    if a.skind != ARGS_PY {
                        a.skind = 2;
                    }
                    a.sval = (s, p.i);
                }
                b'-' | b'0'..=b'9' => {
                    let (s, e, int) = p.number()?;
                    if !int || parse_i64(&p.b[s..e]).is_none() {
                        a.skind = ARGS_PY;
                    } else if a.skind != ARGS_PY {
                        a.skind = 1;
                    }
                    a.sval = (s, e);
                }
                _ => {
                    p.skip(1)?;
                    a.skind = ARGS_PY;
                }
            },
            _ => p.skip(1)?,
        }
        Ok(())
    })?;
    a.span.1 = p.i;
    Ok(a)
}

/// A value of an event's field, classified (strings and numbers kept, the rest skipped).
fn value(p: &mut P) -> R<V> {
    match p.peek()? {
        b'"' => {
            let (s, e, esc) = p.string()?;
            Ok(V::Str(s, e, esc))
        }
        b'-' | b'0'..=b'9' => {
            let (s, e, int) = p.number()?;
            if int && parse_i64(&p.b[s..e]).is_some() {
                return Ok(V::Int(s, e));
            }
            Ok(parse_f64(&p.b[s..e], int).map_or(V::Other, V::Num))
        }
        _ => p.skip(1).map(|_| V::Other),
    }
}

struct Scanner<'a> {
    names: Table<'a>,
    cats: Table<'a>,
    toks: Table<'a>,
    tracks: FxMap<(u32, u32), u32>,
    last_track: (u32, u32, u32),
}

const K_PH: u8 = 1;
const K_NAME: u8 = 2;
const K_CAT: u8 = 4;
const K_PID: u8 = 8;
const K_TID: u8 = 16;
const K_TS: u8 = 32;
const K_DUR: u8 = 64;
const K_ARGS: u8 = 128;

/// The phases the lean events know besides X, M and i (each an empty placeholder: fields skipped).
const UNREAD: &[u8] = b"BEICbnestfPONDRcSTpFVv()";
/// The phases whose ts merge reads (the earliest one is a file's start), besides X.
const TIMED: &[u8] = b"iIstfBEbenC";

fn float_of(p: &P, v: V) -> Option<f64> {
    match v {
        V::Absent => Some(0.0),
        V::Num(f) => Some(f),
        V::Int(s, e) => parse_f64(&p.b[s..e], true),
        _ => None,
    }
}

impl<'a> Scanner<'a> {
    /// A pid or tid (msgspec's `Int64 | str`, 0 when absent) as a token id.
    fn token(&mut self, b: &'a [u8], v: V) -> R<u32> {
        Ok(match v {
            V::Absent => self.toks.id(b"0"),
            V::Int(s, e) => self.toks.id(&b[s..e]),
            V::Str(s, e, _) => self.toks.id(&b[s - 1..e + 1]),
            _ => return Err(Unsure(0)),
        })
    }

    fn event(&mut self, p: &mut P<'a>, out: &mut Run) -> R<()> {
        let at = p.i;
        let (mut ph, mut name, mut cat, mut pid, mut tid, mut ts, mut dur) =
            (V::Absent, V::Absent, V::Absent, V::Absent, V::Absent, V::Absent, V::Absent);
        let mut a: Option<Args> = None;
        let mut seen = 0u8;
        p.members(|p, (s, e, esc)| {
        if esc {
            return Err(Unsure(s)); // a key with escapes may name any field
        }
        let k = match &p.b[s..e] {
            b"ph" => K_PH,
            b"name" => K_NAME,
            b"cat" => K_CAT,
            b"pid" => K_PID,
            b"tid" => K_TID,
            b"ts" => K_TS,
            b"dur" => K_DUR,
            b"args" => K_ARGS,
            _ => 0,
        };
        if seen & k != 0 {
            return Err(Unsure(s)); // a field given twice
        }
        seen |= k;
        match k {
            K_PH => ph = value(p)?,
            K_NAME => name = value(p)?,
            K_CAT => cat = value(p)?,
            K_PID => pid = value(p)?,
            K_TID => tid = value(p)?,
            K_TS => ts = value(p)?,
            K_DUR => dur = value(p)?,
            K_ARGS => a = Some(args(p)?),
            _ => p.skip(1)?,
        }
            Ok(())
        })?;
        out.events += 1;
        let b = p.b;
        let phase = match ph {
            V::Str(s, e, false) if e == s => 0,
            V::Str(s, e, false) if e - s == 1 => b[s],
            _ => return Err(Unsure(at)),
        };
        let text = |v: V| -> R<&'a [u8]> {
            match v {
                V::Absent => Ok(&b""[..]),
                V::Str(s, e, _) => Ok(&b[s..e]),
                _ => Err(Unsure(at)),
            }
        };
        let span = a.as_ref().map_or((0, 0), |x| x.span);
        // merge's first pass: every event's tid (`Int64 | str`, 0 when absent), the timed phases' ts (`Time`)
        match tid {
            V::Absent | V::Str(..) => {}
            V::Int(s, e) => out.m_max_tid = out.m_max_tid.max(parse_i64(&b[s..e]).unwrap_or(0)),
            _ => out.m_bad = 1,
        }
        if phase == b'X' || TIMED.contains(&phase) {
            match float_of(p, ts).filter(|t| (-9e15..=9e15).contains(t)) {
                Some(t) => {
                    if t < out.m_first {
                        out.m_first = t;
                    }
                }
                None => out.m_bad = 1,
            }
        } else if phase == 0 {
            out.m_bad = 1; // no struct of merge's takes an empty phase
        }
        match phase {
            b'X' => {
                let (nm, ct) = (text(name)?, text(cat)?);
                let t = float_of(p, ts).filter(|t| (-9e15..=9e15).contains(t)).ok_or(Unsure(at))?;
                let d = float_of(p, dur).filter(|d| (0.0..=9e15).contains(d)).ok_or(Unsure(at))?;
                let (pt, tt) = (self.token(b, pid).map_err(|_| Unsure(at))?, self.token(b, tid).map_err(|_| Unsure(at))?);
                let track = if self.last_track.0 == pt && self.last_track.1 == tt && self.last_track.2 != NONE {
                    self.last_track.2
                } else {
                    let n = self.tracks.len() as u32;
                    let id = *self.tracks.entry((pt, tt)).or_insert(n);
                    if id == n {
                        out.track_pid.push(pt);
                        out.track_tid.push(tt);
                    }
                    self.last_track = (pt, tt, id);
                    id
                };
                out.ts.push(t);
                out.dur.push(d);
                out.name.push(self.names.id(nm));
                out.cat.push(self.cats.id(ct));
                out.track.push(track);
                match &a {
                    Some(x) => {
                        out.corr.push(if x.skind == ARGS_PY { -1 } else { x.corr });
                        out.ext.push(if x.skind == ARGS_PY { -1 } else { x.ext });
                        out.skind.push(x.skind);
                        out.sval.push(match x.skind {
                            1 => parse_i64(&b[x.sval.0..x.sval.1]).unwrap_or(-1),
                            2 => self.toks.id(&b[x.sval.0..x.sval.1]) as i64,
                            _ => 0,
                        });
                    }
                    None => {
                        out.corr.push(-1);
                        out.ext.push(-1);
                        out.skind.push(0);
                        out.sval.push(0);
                    }
                }
                out.aoff.push(span.0 as u64);
                out.alen.push((span.1 - span.0) as u64);
            }
            b'M' | b'i' if matches!(name, V::Str(_, _, true)) => return Err(Unsure(at)), // compared unescaped
            b'M' => {
                let nm = text(name)?;
                let (pt, tt) = (self.token(b, pid).map_err(|_| Unsure(at))?, self.token(b, tid).map_err(|_| Unsure(at))?);
                if nm == b"thread_name" {
                    out.tn_pid.push(pt);
                    out.tn_tid.push(tt);
                    out.tn_off.push(span.0 as u64);
                    out.tn_len.push((span.1 - span.0) as u64);
                }
                if nm == b"process_name" {
                    out.pn_pid.push(pt);
                    out.pn_off.push(span.0 as u64);
                    out.pn_len.push((span.1 - span.0) as u64);
                }
            }
            b'i' => {
                let nm = text(name)?;
                let t = float_of(p, ts).filter(|t| (-9e15..=9e15).contains(t)).ok_or(Unsure(at))?;
                if nm == b"[memory]" {
                    out.mem_ts.push(t);
                    out.mem_off.push(span.0 as u64);
                    out.mem_len.push((span.1 - span.0) as u64);
                }
            }
            0 => {}
            c if UNREAD.contains(&c) => {}
            _ => return Err(Unsure(at)),
        }
        Ok(())
    }
}

/// A run: a JSON list of events (valid UTF-8, nothing but whitespace after its `]`), `event` called at each.
fn each_event<'a>(b: &'a [u8], mut event: impl FnMut(&mut P<'a>) -> R<()>) -> R<()> {
    if std::str::from_utf8(b).is_err() {
        return Err(Unsure(0));
    }
    let mut p = P { b, i: 0 };
    p.expect(b'[')?;
    if p.peek()? == b']' {
        p.i += 1;
    } else {
        loop {
            event(&mut p)?;
            match p.peek()? {
                b',' => p.i += 1,
                b']' => {
                    p.i += 1;
                    break;
                }
                _ => return Err(Unsure(p.i)),
            }
        }
    }
    p.ws();
    if p.i != b.len() {
        return Err(Unsure(p.i));
    }
    Ok(())
}

fn scan_into<'a>(b: &'a [u8], out: &mut Run, sc: &mut Scanner<'a>) -> R<()> {
    each_event(b, |p| sc.event(p, out))
}

fn scan(b: &[u8]) -> Run {
    let mut out = Run { m_first: f64::INFINITY, ..Run::default() };
    let mut sc = Scanner {
        names: Table::new(),
        cats: Table::new(),
        toks: Table::new(),
        tracks: FxMap::default(),
        last_track: (NONE, NONE, NONE),
    };
    if let Err(Unsure(at)) = scan_into(b, &mut out, &mut sc) {
        return Run { status: 1, err_at: at as u64, ..Run::default() };
    }
    let mut tabs = [sc.names, sc.cats, sc.toks];
    for (i, t) in tabs.iter_mut().enumerate() {
        t.finish();
        out.tables[i] = (std::mem::take(&mut t.blob), std::mem::take(&mut t.off));
    }
    out
}

/// The version of this C ABI.
#[no_mangle]
pub extern "C" fn dp_abi_version() -> u32 {
    ABI
}

/// Scan the run of `len` bytes at `data`; always returns a handle (free it with dp_run_free), whose status says
/// how it went.
///
/// # Safety
/// `data` must point to `len` readable bytes (or be null with len 0), unchanged until the call returns.
#[no_mangle]
pub unsafe extern "C" fn dp_run_scan(data: *const u8, len: usize) -> *mut Run {
    let b: &[u8] = if data.is_null() || len == 0 { &[] } else { std::slice::from_raw_parts(data, len) };
    let s = std::panic::catch_unwind(|| scan(b)).unwrap_or(Run { status: 2, ..Run::default() });
    Box::into_raw(Box::new(s))
}

/// 0: the status; 1: where the scanner stopped; 2: the events read; for merge: 3, whether its own decoding could
/// differ (then it reads the run itself); 4, the earliest ts of the timed events (the f64's bits); 5, the largest
/// int tid (at least 0; the i64's bits).
///
/// # Safety
/// `h` must come from dp_run_scan and not be freed.
#[no_mangle]
pub unsafe extern "C" fn dp_run_info(h: *const Run, which: u32) -> u64 {
    if h.is_null() {
        return 0;
    }
    let s = &*h;
    match which {
        0 => s.status as u64,
        1 => s.err_at,
        2 => s.events,
        3 => s.m_bad as u64,
        4 => s.m_first.to_bits(),
        5 => s.m_max_tid as u64,
        _ => 0,
    }
}

/// Column `which`'s address and (through `n`) its length in elements (`distprof.trace.native` lists them).
///
/// # Safety
/// `h` must come from dp_run_scan and not be freed; `n` must be writable.
#[no_mangle]
pub unsafe extern "C" fn dp_run_column(h: *const Run, which: u32, n: *mut u64) -> *const u8 {
    if h.is_null() || n.is_null() {
        return std::ptr::null();
    }
    let s = &*h;
    match which {
        0 => col!(n, s.ts),
        1 => col!(n, s.dur),
        2 => col!(n, s.name),
        3 => col!(n, s.cat),
        4 => col!(n, s.track),
        5 => col!(n, s.corr),
        6 => col!(n, s.ext),
        7 => col!(n, s.skind),
        8 => col!(n, s.sval),
        9 => col!(n, s.aoff),
        10 => col!(n, s.alen),
        11 => col!(n, s.track_pid),
        12 => col!(n, s.track_tid),
        13 => col!(n, s.tn_pid),
        14 => col!(n, s.tn_tid),
        15 => col!(n, s.tn_off),
        16 => col!(n, s.tn_len),
        17 => col!(n, s.mem_ts),
        18 => col!(n, s.mem_off),
        19 => col!(n, s.mem_len),
        20 => col!(n, s.tables[0].0),
        21 => col!(n, s.tables[0].1),
        22 => col!(n, s.tables[1].0),
        23 => col!(n, s.tables[1].1),
        24 => col!(n, s.tables[2].0),
        25 => col!(n, s.tables[2].1),
        26 => col!(n, s.pn_pid),
        27 => col!(n, s.pn_off),
        28 => col!(n, s.pn_len),
        _ => {
            *n = 0;
            std::ptr::null()
        }
    }
}

/// Where a list's elements end: `data` holds the elements of a JSON list (whitespace and values separated by commas,
/// from its first element on) followed by the list's `]` and anything after it. The offset of that `]`; -1 when the
/// bytes are no such thing (malformed, cut off, nested over 256 levels). The reader uses it to hand the last events
/// of a file to the scanner as one more run, the keys after the events list to itself.
///
/// # Safety
/// `data` must point to `len` readable bytes (or be null with len 0).
#[no_mangle]
pub unsafe extern "C" fn dp_list_end(data: *const u8, len: usize) -> i64 {
    let b: &[u8] = if data.is_null() || len == 0 { &[] } else { std::slice::from_raw_parts(data, len) };
    std::panic::catch_unwind(|| list_end(b)).unwrap_or(-1)
}

fn list_end(b: &[u8]) -> i64 {
    let mut p = P { b, i: 0 };
    let run = || -> R<usize> {
        if p.peek()? == b']' {
            return Ok(p.i);
        }
        loop {
            p.skip(1)?;
            match p.peek()? {
                b',' => p.i += 1,
                b']' => return Ok(p.i),
                _ => return Err(Unsure(p.i)),
            }
        }
    };
    let mut run = run;
    run().map_or(-1, |i| i as i64)
}

/// # Safety
/// `h` must come from dp_run_scan, freed once.
#[no_mangle]
pub unsafe extern "C" fn dp_run_free(h: *mut Run) {
    if !h.is_null() {
        drop(Box::from_raw(h));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(s: &str) -> Run {
        scan(s.as_bytes())
    }

    #[test]
    fn reads_complete_events() {
        let r = run(r#"[{"ph":"X","name":"k","cat":"kernel","pid":0,"tid":7,"ts":1.5,"dur":2,"args":{"correlation":5,"stream":7}},{"ph":"f"}]"#);
        assert_eq!(r.status, 0);
        assert_eq!(r.events, 2);
        assert_eq!((r.ts[0], r.dur[0], r.corr[0], r.ext[0], r.skind[0], r.sval[0]), (1.5, 2.0, 5, -1, 1, 7));
    }

    #[test]
    fn is_unsure_where_msgspec_decides() {
        for s in [
            r#"[{"name":"x"}]"#,
            r#"[{"ph":"Q"}]"#,
            r#"[{"ph":"X","ts":1,"ts":2}]"#,
            r#"[{"ph":"X","ts":"1"}]"#,
            r#"[{"ph":"X","dur":-1}]"#,
            r#"[{"ph":"X","pid":1.5}]"#,
            r#"[{"ph":"X","n\u0061me":"a"}]"#,
            r#"[{"ph":"X","x":"\ud800"}]"#,
            r#"[{"ph":"X","x":"\ud800\u0041"}]"#,
            r#"[{"ph":"X","x":"\udc00\ud800"}]"#,
            r#"[1]"#,
            r#"[{"ph":"X"}] x"#,
            "[{\"ph\":\"X\",\"x\":\"a\tb\"}]",
        ] {
            assert_eq!(run(s).status, 1, "{s}");
        }
    }

    #[test]
    fn finds_where_a_list_ends() {
        assert_eq!(list_end(br#"{"a":[1,"]"]}, {"b":2} ], "k": [{},{}]}"#), 23);
        assert_eq!(list_end(b" ]"), 1);
        assert_eq!(list_end(br#"{"a":1}, {"b""#), -1);
        assert_eq!(list_end(br#"{"a":1} {"b":2}]"#), -1);
    }

    #[test]
    fn a_surrogate_pair_is_one_character() {
        let r = run(r#"[{"ph":"X","name":"\ud83d\ude00"}]"#);
        assert_eq!(r.status, 0);
    }

    #[test]
    fn minus_zero_integer_is_plus_zero() {
        let r = run(r#"[{"ph":"X","ts":-0},{"ph":"X","ts":-0.0}]"#);
        assert!(r.ts[0].is_sign_positive() && r.ts[1].is_sign_negative());
    }

    #[test]
    fn reads_what_merge_needs() {
        let r = run(r#"[{"ph":"s","ts":-2.5,"tid":9},{"ph":"X","ts":3,"tid":"t"},{"ph":"M","name":"process_name","pid":4,"args":{"name":"a"}},{"ph":"P","tid":12}]"#);
        assert_eq!((r.status, r.m_bad, r.m_first, r.m_max_tid), (0, 0, -2.5, 12));
        assert_eq!((r.pn_pid.len(), r.pn_len[0]), (1, 12));
        for s in [r#"[{"ph":"s","ts":"1"}]"#, r#"[{"ph":"P","tid":1.5}]"#, r#"[{"ph":"f","ts":1e16}]"#, r#"[{"ph":""}]"#] {
            let r = run(s);
            assert_eq!((r.status, r.m_bad), (0, 1), "{s}");
        }
        assert_eq!(run("[]").m_first, f64::INFINITY);
    }

    #[test]
    fn deep_nesting_is_unsure_not_a_crash() {
        let s = format!(r#"[{{"ph":"X","args":{}}}]"#, "[".repeat(1_000_000));
        assert_eq!(run(&s).status, 1);
    }
}
